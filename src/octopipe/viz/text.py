"""The timeline in a terminal: one line per device, one character per time slice."""

from __future__ import annotations

import math
from collections.abc import Sequence

from octopipe.actions import Event
from octopipe.sim import SimResult
from octopipe.viz.style import chunk_indices, events_of, headline, summarize


def render_text_timeline(result: SimResult | Sequence[Event], width: int = 100) -> str:
    """A quick look in a terminal: one line per device, one character per time slice, the kind
    of the action running at the slice's middle (lower case for a device's later chunks),
    '.' where the device is idle."""
    if width < 1:
        raise ValueError(f"width must be at least 1, got {width}")
    events = events_of(result)
    stats = summarize(result)
    chunk_of = chunk_indices(events)
    rows = [["."] * width for _ in range(stats.num_devices)]
    step = stats.iteration_time / width if stats.iteration_time > 0 else 1.0
    for e in events:
        letter = e.action.kind if chunk_of[e.action.stage] == 0 else e.action.kind.lower()
        # Columns whose middle lies in [start, end).
        first = max(0, math.ceil(e.start / step - 0.5))
        last = min(width, math.ceil(e.end / step - 0.5))
        for col in range(first, last):
            rows[e.device][col] = letter
    label_w = len(str(stats.num_devices - 1))
    lines = [headline(stats)]
    lines += [f"{d:>{label_w}} |{''.join(r)}|" for d, r in enumerate(rows)]
    return "\n".join(lines)
