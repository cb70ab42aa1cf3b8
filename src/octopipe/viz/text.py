"""The timeline in a terminal: one line per device, one character per time slice."""

from __future__ import annotations

import math
from collections.abc import Sequence

from octopipe.actions import Event
from octopipe.sim import SimResult
from octopipe.viz.style import chunk_indices, events_of, headline, reductions_of, summarize


def render_text_timeline(result: SimResult | Sequence[Event], width: int = 100) -> str:
    """A quick look in a terminal: one line per device, one character per time slice, the kind
    of the action running at the slice's middle (lower case for a device's later chunks),
    '.' where the device is idle. A device with data-parallel gradient all-reduces gets a line
    just below its own, 'R' where one runs ('r' for a later chunk's)."""
    if width < 1:
        raise ValueError(f"width must be at least 1, got {width}")
    events = events_of(result)
    stats = summarize(result)
    chunk_of = chunk_indices(events)
    rows = [["."] * width for _ in range(stats.num_devices)]
    step = stats.iteration_time / width if stats.iteration_time > 0 else 1.0
    for e in events:
        letter = e.action.kind if chunk_of[e.action.stage] == 0 else e.action.kind.lower()
        for col in _columns(e.start, e.end, step, width):
            rows[e.device][col] = letter
    reduce_rows: dict[int, list[str]] = {}
    for r in reductions_of(result):
        row = reduce_rows.setdefault(r.device, [" "] * width)
        for col in _columns(r.start, r.end, step, width):
            row[col] = "R" if chunk_of[r.stage] == 0 else "r"
    label_w = len(str(stats.num_devices - 1))
    lines = [headline(stats)]
    for d, row in enumerate(rows):
        lines.append(f"{d:>{label_w}} |{''.join(row)}|")
        if d in reduce_rows:
            lines.append(f"{'':>{label_w}} |{''.join(reduce_rows[d])}|")
    return "\n".join(lines)


def _columns(start: float, end: float, step: float, width: int) -> range:
    """Columns whose middle lies in [start, end)."""
    return range(max(0, math.ceil(start / step - 0.5)), min(width, math.ceil(end / step - 0.5)))
