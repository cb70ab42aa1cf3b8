"""Pictures and traces of a pipeline iteration: timelines, memory plots, Chrome/Perfetto JSON.

Everything here reads a `SimResult` or any sequence of `octopipe.sim.Event` (the simulator's
events and the executor's measured traces share that type) and only draws or serializes it;
nothing here computes a schedule or a cost. Memory deltas come from the simulator's own
lowering (`sim.graph.build_graph`), so a memory plot always agrees with the simulated peak.

    save_timeline(result, "plan.png")            # or .svg; one row per device
    save_memory_plot(result, plan, profile, "mem.png")
    save_chrome_trace(result.events, "trace.json")   # open in ui.perfetto.dev
    print(render_text_timeline(result, width=100))
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; never open a window

import matplotlib.colors as mcolors  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch, Rectangle  # noqa: E402
from matplotlib.transforms import blended_transform_factory  # noqa: E402

from octopipe.actions import Action, Event, Kind  # noqa: E402
from octopipe.costs import CostTable  # noqa: E402
from octopipe.errors import InputError  # noqa: E402
from octopipe.plan import Plan  # noqa: E402
from octopipe.profile import Profile, read_json  # noqa: E402
from octopipe.sim import SimResult  # noqa: E402
from octopipe.sim.graph import action_id, build_graph, devices_for  # noqa: E402

KIND_COLORS = {"F": "#3D85C6", "B": "#CC4125", "I": "#E69138", "W": "#6AA84F"}
KIND_NAMES = {"F": "forward", "B": "backward", "I": "backward (input)", "W": "backward (weight)"}
IDLE_COLOR = "#ECECEC"
CRITICAL_EDGE = "#111111"

# Layout of the timeline, in inches: fixed margins around an axes sized to the content.
# The top margin holds two lines of title and one of legend.
_MARGIN_LEFT, _MARGIN_RIGHT, _MARGIN_TOP, _MARGIN_BOTTOM = 1.5, 0.8, 1.0, 0.6
_ROW_HEIGHT = 0.34
_BAR_FILL = 0.82  # share of a row's height a box fills
_TYPICAL_BOX = 0.2  # inches for a short action (first quartile), room for a 3-digit label
_MAX_AXES_WIDTH = 150.0  # inches; Agg refuses images over 2**16 pixels a side
_MIN_LABEL_PT = 4.0
_CHAR_WIDTH = 0.62  # width of a digit relative to the font size


# --- what a picture shows ------------------------------------------------------------------


@dataclass(frozen=True)
class TimelineSummary:
    """Headline figures of one iteration, from a SimResult or from bare events."""

    num_devices: int
    iteration_time: float
    busy: tuple[float, ...]
    bubble_ratio: float
    efficiency: float | None  # needs the simulator's lower bound; None for bare events


def summarize(source: SimResult | Iterable[Event]) -> TimelineSummary:
    if isinstance(source, SimResult):
        return TimelineSummary(
            source.num_devices,
            source.iteration_time,
            source.busy,
            source.bubble_ratio,
            source.efficiency,
        )
    events = normalized_events(source)
    num_devices = 1 + max((e.device for e in events), default=-1)
    span = max((e.end for e in events), default=0.0)
    busy = [0.0] * num_devices
    for e in events:
        busy[e.device] += e.end - e.start
    total = span * num_devices
    bubble = 1.0 - sum(busy) / total if total > 0 else 0.0
    return TimelineSummary(num_devices, span, tuple(busy), bubble, None)


def normalized_events(source: SimResult | Iterable[Event]) -> tuple[Event, ...]:
    """The events sorted by device and start, shifted so the first starts at 0 (measured
    traces carry clock times)."""
    events = tuple(source.events if isinstance(source, SimResult) else source)
    if isinstance(source, SimResult) and not events and source.busy:
        raise ValueError("this SimResult has no events: simulate with detail=True")
    if not events:
        return ()
    t0 = min(e.start for e in events)
    if t0 != 0.0:
        events = tuple(Event(e.device, e.action, e.start - t0, e.end - t0) for e in events)
    return tuple(sorted(events, key=lambda e: (e.device, e.start)))


def chunk_indices(events: Iterable[Event]) -> dict[int, int]:
    """Stage -> its rank among the stages of its device (0 for the earliest stage): the
    "chunk" of interleaved and V-shaped placements."""
    stages_of: dict[int, set[int]] = {}
    for e in events:
        stages_of.setdefault(e.device, set()).add(e.action.stage)
    return {s: i for stages in stages_of.values() for i, s in enumerate(sorted(stages))}


def time_unit(span: float) -> tuple[str, float]:
    """(unit name, factor from seconds) that keeps tick labels short for a span in seconds."""
    if span >= 1.0:
        return "s", 1.0
    if span >= 1e-3:
        return "ms", 1e3
    return "µs", 1e6


def byte_unit(nbytes: float) -> tuple[str, float]:
    for name, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= size:
            return name, float(size)
    return "B", 1.0


def shade(color: str, chunk: int, num_chunks: int) -> tuple[float, float, float]:
    """The kind's colour, blended toward white for later chunks so chunks stay apart."""
    rgb = mcolors.to_rgb(color)
    if num_chunks <= 1:
        return rgb
    mix = 0.55 * chunk / (num_chunks - 1)
    return tuple(c + (1.0 - c) * mix for c in rgb)  # type: ignore[return-value]


def label_font_size(
    box_width_pt: float, box_height_pt: float, text: str, largest: float = 8.0
) -> float | None:
    """The font size that fits `text` inside a box, or None when even the smallest legible
    size would overflow it."""
    by_width = (box_width_pt - 1.5) / (_CHAR_WIDTH * max(len(text), 1))
    size = min(largest, by_width, 0.72 * box_height_pt)
    return size if size >= _MIN_LABEL_PT else None


# --- timeline -------------------------------------------------------------------------------


@dataclass(frozen=True)
class TimelineLayout:
    """Sizes of a timeline picture, in inches and points, fixed before anything is drawn."""

    axes_width: float  # inches
    axes_height: float
    span: float  # seconds shown along the axes
    dpi: int

    @property
    def figure_size(self) -> tuple[float, float]:
        return (
            self.axes_width + _MARGIN_LEFT + _MARGIN_RIGHT,
            self.axes_height + _MARGIN_TOP + _MARGIN_BOTTOM,
        )

    @property
    def pixels(self) -> tuple[int, int]:
        w, h = self.figure_size
        return round(w * self.dpi), round(h * self.dpi)

    @property
    def bar_height_pt(self) -> float:
        return _BAR_FILL * _ROW_HEIGHT * 72.0

    def box_width_pt(self, seconds: float) -> float:
        return seconds / self.span * self.axes_width * 72.0 if self.span > 0 else 0.0

    def label_size(self, event: Event) -> float | None:
        """Font size of the event's microbatch label, None where it does not fit."""
        return label_font_size(
            self.box_width_pt(event.end - event.start), self.bar_height_pt, str(event.action.mb)
        )


def timeline_layout(events: Sequence[Event], span: float, num_devices: int) -> TimelineLayout:
    """Rows of fixed height; a width that gives a short action (the first quartile of
    durations) `_TYPICAL_BOX` inches so most boxes carry their label, bounded so the image
    stays drawable."""
    # Zero-length actions (an I of a stage with no input gradient) never carry a label.
    durations = sorted(d for e in events if (d := e.end - e.start) > 0)
    short = durations[len(durations) // 4] if durations else 0.0
    width = 8.0
    if short > 0 and span > 0:
        width = min(_MAX_AXES_WIDTH, max(8.0, _TYPICAL_BOX * span / short))
    # Small pictures get a crisp resolution; large ones stay within a sane file size.
    dpi = 150 if width + _MARGIN_LEFT + _MARGIN_RIGHT <= 24 else 100
    return TimelineLayout(width, _ROW_HEIGHT * num_devices, span, dpi)


def save_timeline(
    result: SimResult | Sequence[Event],
    path: str | Path,
    title: str | None = None,
    stage_labels: bool = True,
) -> Path:
    """Draw one row per device, one box per action, to a PNG or SVG (by the file suffix).

    Boxes are coloured by kind (F/B/I/W) and lightened per chunk, labelled with the
    microbatch where the label fits; grey is idle time. A SimResult's critical path is
    outlined. `stage_labels` names each row's stages next to its device.
    """
    path = Path(path)
    fmt = _image_format(path)
    events = normalized_events(result)
    stats = summarize(result)
    if not events:
        raise ValueError("nothing to draw: no events")
    unit, scale = time_unit(stats.iteration_time)
    critical = set(result.critical_path) if isinstance(result, SimResult) else set()
    chunk_of = chunk_indices(events)
    num_chunks = 1 + max(chunk_of.values())
    layout = timeline_layout(events, stats.iteration_time, stats.num_devices)

    fig = plt.figure(figsize=layout.figure_size)
    fig_w, fig_h = layout.figure_size
    ax = fig.add_axes(
        (
            _MARGIN_LEFT / fig_w,
            _MARGIN_BOTTOM / fig_h,
            layout.axes_width / fig_w,
            layout.axes_height / fig_h,
        )
    )
    span = stats.iteration_time * scale
    ax.set_xlim(0.0, span)
    ax.set_ylim(stats.num_devices - 0.5, -0.5)  # device 0 on top

    for d in range(stats.num_devices):
        ax.add_artist(
            Rectangle(
                (0.0, d - _BAR_FILL / 2),
                span,
                _BAR_FILL,
                facecolor=IDLE_COLOR,
                edgecolor="none",
                zorder=0,
            )
        )
    for e in events:
        a = e.action
        x, width = e.start * scale, (e.end - e.start) * scale
        on_path = a in critical
        box = Rectangle(
            (x, e.device - _BAR_FILL / 2),
            width,
            _BAR_FILL,
            facecolor=shade(KIND_COLORS[a.kind], chunk_of[a.stage], num_chunks),
            edgecolor=CRITICAL_EDGE if on_path else "white",
            linewidth=1.1 if on_path else 0.4,
            zorder=3 if on_path else 2,
        )
        box.set_gid(f"action-d{e.device}-{a}")  # lets SVG readers find each action
        ax.add_artist(box)  # add_patch would re-fit the axis limits for every box: slow
        size = layout.label_size(e)
        if size is not None:
            ax.text(
                x + width / 2,
                e.device,
                str(a.mb),
                ha="center",
                va="center",
                fontsize=size,
                color="white" if chunk_of[a.stage] == 0 else "#222222",
                zorder=4,
            )

    _label_rows(ax, events, stats, stage_labels)
    ax.set_xlabel(f"time ({unit})")
    ax.spines[["top", "right", "left"]].set_visible(False)
    ax.tick_params(axis="y", length=0)
    ax.grid(axis="x", color="#BBBBBB", linewidth=0.4, zorder=1)
    ax.set_axisbelow(True)
    _add_legend(fig, events, num_chunks, bool(critical))
    heading = _headline(stats, unit, scale)
    fig.text(
        _MARGIN_LEFT / fig_w,
        1.0 - 0.12 / fig_h,
        f"{title}\n{heading}" if title else heading,
        ha="left",
        va="top",
        fontsize=11,
    )
    fig.savefig(path, format=fmt, dpi=layout.dpi)
    plt.close(fig)
    return path


def _image_format(path: Path) -> str:
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in ("png", "svg"):
        raise InputError(str(path), f"unknown picture format {path.suffix!r}: use .png or .svg")
    return fmt


def _headline(stats: TimelineSummary, unit: str, scale: float) -> str:
    parts = [
        f"iteration {stats.iteration_time * scale:.4g} {unit}",
        f"bubble {100 * stats.bubble_ratio:.1f}%",
    ]
    if stats.efficiency is not None:
        parts.append(f"efficiency {100 * stats.efficiency:.1f}%")
    parts.append(f"{stats.num_devices} devices")
    return "   ".join(parts)


def _label_rows(ax, events: Sequence[Event], stats: TimelineSummary, stage_labels: bool) -> None:
    stages_of: dict[int, set[int]] = {}
    for e in events:
        stages_of.setdefault(e.device, set()).add(e.action.stage)
    labels = []
    for d in range(stats.num_devices):
        label = f"device {d}"
        if stage_labels and d in stages_of:
            label += "\n" + _stage_list(sorted(stages_of[d]))
        labels.append(label)
    ax.set_yticks(
        range(stats.num_devices), labels, fontsize=7.5 if stage_labels else 8.5, linespacing=0.95
    )
    # Idle share just right of each row: axes-x / data-y coordinates, a fixed offset in points.
    right = blended_transform_factory(ax.transAxes, ax.transData)
    for d in range(stats.num_devices):
        idle = 1.0 - stats.busy[d] / stats.iteration_time if stats.iteration_time > 0 else 0.0
        ax.annotate(
            f"idle {100 * idle:.0f}%",
            (1.0, d),
            xycoords=right,
            xytext=(4, 0),
            textcoords="offset points",
            ha="left",
            va="center",
            fontsize=7,
            color="#555555",
        )


def _stage_list(stages: list[int], limit: int = 4) -> str:
    shown = ",".join(str(s) for s in stages[:limit])
    more = f"…(+{len(stages) - limit})" if len(stages) > limit else ""
    return f"stage{'s' if len(stages) > 1 else ''} {shown}{more}"


def _add_legend(fig, events: Sequence[Event], num_chunks: int, critical: bool) -> None:
    kinds = [k for k in "FBIW" if any(e.action.kind == k for e in events)]
    handles = [Patch(facecolor=KIND_COLORS[k], label=f"{k} {KIND_NAMES[k]}") for k in kinds]
    if num_chunks > 1:
        grey = "#666666"
        handles += [
            Patch(facecolor=shade(grey, c, num_chunks), label=f"chunk {c}")
            for c in range(num_chunks)
        ]
    handles.append(Patch(facecolor=IDLE_COLOR, label="idle"))
    if critical:
        handles.append(Patch(facecolor="white", edgecolor=CRITICAL_EDGE, label="critical path"))
    fig_w, fig_h = fig.get_size_inches()
    # One row under the title, its left edge under the title's.
    fig.legend(
        handles=handles,
        loc="upper left",
        ncol=len(handles),
        fontsize=8,
        frameon=False,
        bbox_to_anchor=((_MARGIN_LEFT - 0.1) / fig_w, 1.0 - 0.55 / fig_h),
        borderaxespad=0.0,
        handlelength=1.2,
        columnspacing=1.2,
    )


# --- memory -------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryTrace:
    """Memory of one device over an iteration: a step curve (level after each time)."""

    device: int
    times: tuple[float, ...]  # seconds, from the iteration's start
    bytes: tuple[float, ...]  # static + activations held, from that time on
    static_bytes: float
    capacity_bytes: float

    @property
    def peak_bytes(self) -> float:
        return max(self.bytes)


def memory_over_time(
    events: SimResult | Iterable[Event], plan: Plan, profile: Profile
) -> tuple[MemoryTrace, ...]:
    """Per device, the memory level over time under the simulator's memory semantics.

    An action that allocates (F) takes its memory when it starts; one that frees (I, W, B)
    gives it back when it ends. Actions on a device do not overlap, so the curve's highest
    level equals the simulator's peak for the same order.
    """
    graph = build_graph(CostTable(profile), plan, devices_for(profile, plan), check=False)
    M = plan.num_microbatches
    by_device: dict[int, list[Event]] = {d: [] for d in range(plan.num_devices)}
    for e in normalized_events(events):
        by_device[e.device].append(e)
    traces = []
    for d in range(plan.num_devices):
        static = float(graph.static_bytes[d])
        times, levels = [0.0], [static]
        level = static
        for e in by_device[d]:
            a = e.action
            delta = graph.mem_delta[action_id(a, M)]
            if not delta:
                continue
            level += delta
            at = e.start if delta > 0 else e.end
            if at == times[-1]:
                # A free at an action's end and the next action's allocation at the same
                # instant: keep one step. The free comes first, so no peak is lost.
                levels[-1] = level
            else:
                times.append(at)
                levels.append(level)
        traces.append(
            MemoryTrace(
                d, tuple(times), tuple(levels), static, float(graph.devices[d].memory_bytes)
            )
        )
    return tuple(traces)


def save_memory_plot(
    result: SimResult | Sequence[Event],
    plan: Plan,
    profile: Profile,
    path: str | Path,
    title: str | None = None,
) -> Path:
    """One small panel per device, sharing the time axis: memory held over the iteration,
    static memory shaded, the peak marked, the capacity dashed where it is in view."""
    path = Path(path)
    fmt = _image_format(path)
    traces = memory_over_time(result, plan, profile)
    stats = summarize(result)
    unit, scale = time_unit(stats.iteration_time)
    top = max(max(t.peak_bytes for t in traces), 1.0)
    bunit, bscale = byte_unit(top)
    n = len(traces)
    fig, axes = plt.subplots(
        n,
        1,
        sharex=True,
        squeeze=False,
        figsize=(10.0, 0.9 * n + 1.3),
        gridspec_kw={"hspace": 0.15},
    )
    end = stats.iteration_time * scale
    for ax, tr in zip(axes[:, 0], traces):
        xs = [t * scale for t in tr.times] + [end]
        ys = [b / bscale for b in tr.bytes]
        ys.append(ys[-1])
        ax.fill_between(
            [0, end], 0, tr.static_bytes / bscale, color="#D9D9D9", step="post", linewidth=0
        )
        ax.step(xs, ys, where="post", color=KIND_COLORS["F"], linewidth=1.2)
        peak_i = max(range(len(tr.bytes)), key=tr.bytes.__getitem__)
        ax.plot(xs[peak_i], ys[peak_i], "o", color=KIND_COLORS["B"], markersize=3)
        note = f"peak {tr.peak_bytes / bscale:.3g} {bunit}"
        if math.isfinite(tr.capacity_bytes):
            if tr.capacity_bytes <= 1.3 * top:
                ax.axhline(
                    tr.capacity_bytes / bscale, color="#990000", linestyle="--", linewidth=0.9
                )
            note += f"\nof {tr.capacity_bytes / bscale:.3g} {bunit}"
            if tr.peak_bytes > tr.capacity_bytes:
                note += "  OVER"
        ax.text(1.005, 0.5, note, transform=ax.transAxes, fontsize=7, va="center", ha="left")
        ax.set_ylabel(f"dev {tr.device}", rotation=0, ha="right", va="center", fontsize=8)
        ax.set_ylim(0, 1.08 * max(top, min(tr.capacity_bytes, 1.3 * top)) / bscale)
        ax.set_xlim(0, end)
        ax.tick_params(labelsize=7)
        ax.spines[["top", "right"]].set_visible(False)
    axes[-1, 0].set_xlabel(f"time ({unit})")
    heading = f"memory per device ({bunit}); grey: static (weights, gradients, optimizer state)"
    fig.suptitle(f"{title}\n{heading}" if title else heading, fontsize=10, x=0.1, ha="left")
    fig.subplots_adjust(left=0.1, right=0.84, top=1.0 - 0.7 / fig.get_size_inches()[1])
    fig.savefig(path, format=fmt, dpi=130)
    plt.close(fig)
    return path


# --- Chrome / Perfetto trace --------------------------------------------------------------


def chrome_trace(
    events: SimResult | Iterable[Event], process_name: str = "octopipe"
) -> dict[str, Any]:
    """A Chrome/Perfetto trace (JSON object format): one "X" event per action, times in
    microseconds, one process per device (pid = tid = device) named by metadata events."""
    evs = tuple(events.events if isinstance(events, SimResult) else events)
    out: list[dict[str, Any]] = []
    for d in sorted({e.device for e in evs}):
        out += [
            {
                "ph": "M",
                "name": "process_name",
                "pid": d,
                "tid": d,
                "args": {"name": f"{process_name}: device {d}"},
            },
            {
                "ph": "M",
                "name": "process_sort_index",
                "pid": d,
                "tid": d,
                "args": {"sort_index": d},
            },
            {"ph": "M", "name": "thread_name", "pid": d, "tid": d, "args": {"name": "compute"}},
        ]
    for e in evs:
        a = e.action
        out.append(
            {
                "name": str(a),
                "cat": KIND_NAMES[a.kind],
                "ph": "X",
                "ts": e.start * 1e6,
                "dur": (e.end - e.start) * 1e6,
                "pid": e.device,
                "tid": e.device,
                "args": {"stage": a.stage, "microbatch": a.mb, "kind": a.kind},
            }
        )
    return {"traceEvents": out, "displayTimeUnit": "ms"}


def save_chrome_trace(
    events: SimResult | Iterable[Event], path: str | Path, process_name: str = "octopipe"
) -> Path:
    path = Path(path)
    path.write_text(json.dumps(chrome_trace(events, process_name)) + "\n")
    return path


def events_from_chrome_trace(
    data: Any, where: str = "<trace>", step: int | None = None
) -> tuple[Event, ...]:
    """The actions of a trace, as Events (pid = device), e.g. to draw a measured run or
    compare it with the simulator. Reads what `chrome_trace` writes and the executor's traces
    (`runtime/trace.py`: the action in the name, `args.step`); other events, such as the
    executor's waits, are skipped. `step` keeps only that training step's actions."""
    raw = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(raw, list):
        raise InputError(where, "expected a trace object with a 'traceEvents' list")
    events = []
    for i, item in enumerate(raw):
        if not (isinstance(item, dict) and item.get("ph") == "X"):
            continue
        args = item.get("args") or {}
        if step is not None and args.get("step") != step:
            continue
        try:
            action = _trace_action(item, args)
            if action is None:
                continue
            start = float(item["ts"]) / 1e6
            events.append(Event(int(item["pid"]), action, start, start + float(item["dur"]) / 1e6))
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(where, f"malformed action event: {exc}", f"traceEvents[{i}]") from None
    return tuple(events)


def _trace_action(item: dict[str, Any], args: dict[str, Any]) -> Action | None:
    """The action an "X" event stands for, from its args or else its name; None for events
    that are no action (waits, transfers)."""
    if "stage" in args:
        return Action(int(args["stage"]), Kind(str(args["kind"])), int(args["microbatch"]))
    try:
        return Action.parse(str(item.get("name", "")))
    except ValueError:
        return None


def load_chrome_trace(path: str | Path, step: int | None = None) -> tuple[Event, ...]:
    return events_from_chrome_trace(read_json(path), str(path), step)


# --- terminal -------------------------------------------------------------------------------


def render_text_timeline(result: SimResult | Sequence[Event], width: int = 100) -> str:
    """A quick look in a terminal: one line per device, one character per time slice, the kind
    of the action running at the slice's middle (lower case for a device's later chunks),
    '.' where the device is idle."""
    if width < 1:
        raise ValueError(f"width must be at least 1, got {width}")
    events = normalized_events(result)
    stats = summarize(result)
    unit, scale = time_unit(stats.iteration_time)
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
    lines = [_headline(stats, unit, scale)]
    lines += [f"{d:>{label_w}} |{''.join(r)}|" for d, r in enumerate(rows)]
    return "\n".join(lines)
