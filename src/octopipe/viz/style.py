"""What every picture shares: colours per kind and chunk, label sizes, headline figures.

No plotting library here: the terminal and HTML timelines use it as the matplotlib ones do.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from octopipe.actions import KIND_NAMES, Event
from octopipe.errors import InputError
from octopipe.sim import SimResult
from octopipe.sim.evaluate import Reduction
from octopipe.trace import normalized_events
from octopipe.units import time_unit

__all__ = [
    "CRITICAL_EDGE",
    "IDLE_COLOR",
    "KIND_COLOR_NAMES",
    "KIND_COLORS",
    "KIND_NAMES",
    "REDUCE_COLOR",
    "TimelineSummary",
    "chunk_indices",
    "device_label",
    "events_of",
    "gpu_names",
    "headline",
    "hex_color",
    "image_format",
    "label_font_size",
    "reductions_of",
    "shade",
    "stage_list",
    "summarize",
]

KIND_COLORS = {"F": "#3D85C6", "B": "#CC4125", "I": "#E69138", "W": "#6AA84F"}
KIND_COLOR_NAMES = {"F": "blue", "B": "red", "I": "orange", "W": "green"}  # for captions
REDUCE_COLOR = "#674EA7"  # data-parallel gradient all-reduces: apart from every kind
IDLE_COLOR = "#ECECEC"
CRITICAL_EDGE = "#111111"
KIND_ORDER = "FBIW"
_MIN_LABEL_PT = 4.0
_CHAR_WIDTH = 0.62  # width of a digit relative to the font size


@dataclass(frozen=True)
class TimelineSummary:
    """Headline figures of one iteration, from a SimResult or from bare events."""

    num_devices: int
    iteration_time: float
    busy: tuple[float, ...]
    bubble_ratio: float
    efficiency: float | None  # needs the simulator's lower bound; None for bare events


def events_of(source: SimResult | Iterable[Event]) -> tuple[Event, ...]:
    """The events to draw, sorted by device and start, the first at time 0."""
    if isinstance(source, SimResult):
        if not source.events and source.busy:
            raise ValueError("this SimResult has no events: simulate with detail=True")
        return normalized_events(source.events)
    return normalized_events(source)


def reductions_of(source: SimResult | Iterable[Event]) -> tuple[Reduction, ...]:
    """A SimResult's gradient all-reduces on the events' clock (see `events_of`), by device
    and start; none for bare events."""
    if not isinstance(source, SimResult) or not source.reductions:
        return ()
    t0 = min((e.start for e in source.events), default=0.0)
    shifted = (Reduction(r.device, r.stage, r.start - t0, r.end - t0) for r in source.reductions)
    return tuple(sorted(shifted, key=lambda r: (r.device, r.start)))


def summarize(source: SimResult | Iterable[Event]) -> TimelineSummary:
    if isinstance(source, SimResult):
        return TimelineSummary(
            source.num_devices,
            source.iteration_time,
            source.busy,
            source.bubble_ratio,
            source.efficiency,
        )
    events = events_of(source)
    num_devices = 1 + max((e.device for e in events), default=-1)
    span = max((e.end for e in events), default=0.0)
    busy = [0.0] * num_devices
    for e in events:
        busy[e.device] += e.end - e.start
    total = span * num_devices
    bubble = 1.0 - sum(busy) / total if total > 0 else 0.0
    return TimelineSummary(num_devices, span, tuple(busy), bubble, None)


def chunk_indices(events: Iterable[Event]) -> dict[int, int]:
    """Stage -> its rank among the stages of its device (0 for the earliest stage): the
    "chunk" of interleaved and V-shaped placements."""
    stages_of: dict[int, set[int]] = {}
    for e in events:
        stages_of.setdefault(e.device, set()).add(e.action.stage)
    return {s: i for stages in stages_of.values() for i, s in enumerate(sorted(stages))}


def stages_per_device(events: Iterable[Event]) -> dict[int, list[int]]:
    stages_of: dict[int, set[int]] = {}
    for e in events:
        stages_of.setdefault(e.device, set()).add(e.action.stage)
    return {d: sorted(s) for d, s in stages_of.items()}


def shade(color: str, chunk: int, num_chunks: int) -> tuple[float, float, float]:
    """The kind's colour (#RRGGBB), blended toward white for later chunks so chunks stay
    apart; RGB in 0..1."""
    rgb = tuple(int(color[i : i + 2], 16) / 255 for i in (1, 3, 5))
    if num_chunks <= 1:
        return rgb  # type: ignore[return-value]
    mix = 0.55 * chunk / (num_chunks - 1)
    return tuple(c + (1.0 - c) * mix for c in rgb)  # type: ignore[return-value]


def hex_color(rgb: Sequence[float]) -> str:
    return "#" + "".join(f"{round(255 * c):02X}" for c in rgb)


def label_font_size(
    box_width_pt: float, box_height_pt: float, text: str, largest: float = 8.0
) -> float | None:
    """The font size that fits `text` inside a box, or None when even the smallest legible
    size would overflow it."""
    by_width = (box_width_pt - 1.5) / (_CHAR_WIDTH * max(len(text), 1))
    size = min(largest, by_width, 0.72 * box_height_pt)
    return size if size >= _MIN_LABEL_PT else None


def headline(stats: TimelineSummary) -> str:
    unit, scale = time_unit(stats.iteration_time)
    parts = [
        f"iteration {stats.iteration_time * scale:.4g} {unit}",
        f"bubble {100 * stats.bubble_ratio:.1f}%",
    ]
    if stats.efficiency is not None:
        parts.append(f"efficiency {100 * stats.efficiency:.1f}%")
    parts.append(f"{stats.num_devices} device{'s' * (stats.num_devices != 1)}")
    return "   ".join(parts)


def device_label(device: int, names: Sequence[str] | None = None) -> str:
    """`device 3`, with its accelerator's kind on a mixed cluster: `device 3 · a100`."""
    return f"device {device}" + (f" · {names[device]}" if names else "")


def gpu_names(profile) -> tuple[str, ...] | None:
    """Each device's accelerator kind (`devices[i].name`) when the profile's devices are of
    more than one kind; None otherwise (rows then need no kind)."""
    devices = profile.devices or ()
    names = [d.name for d in devices]
    if not names or None in names or len(set(names)) < 2:
        return None
    return tuple(names)  # type: ignore[arg-type]


def stage_list(stages: list[int], limit: int = 4) -> str:
    shown = ",".join(str(s) for s in stages[:limit])
    more = f"…(+{len(stages) - limit})" if len(stages) > limit else ""
    return f"stage{'s' if len(stages) > 1 else ''} {shown}{more}"


def image_format(path: Path, allowed: tuple[str, ...] = ("png", "svg")) -> str:
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in allowed:
        choices = " or ".join(f".{a}" for a in allowed)
        raise InputError(str(path), f"unknown picture format {path.suffix!r}: use {choices}")
    return fmt
