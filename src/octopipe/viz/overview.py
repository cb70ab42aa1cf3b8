"""The overview picture (PNG or SVG), drawn instead of the timeline where a box per action
would be a barcode (`layout.needs_overview`): a plan of many devices or many actions.

Three panels, rows in device order, each row naming its device (and its kind on a mixed
cluster):

- a heat map of the bubbles: for each device and each of `BINS` slices of the iteration, the
  share of the slice the device is idle (dark: busy; bright: a bubble), so the pipeline's fill
  and drain and any stage that holds the others up stand out whatever the plan's size;
- beside it, each device's utilization (busy share of the iteration) as a bar;
- below, one period of the steady state zoomed in and drawn as the timeline draws it (a box
  per action, labels where they fit), its window marked on the heat map. The period is the
  median time between successive forwards of one stage on the busiest device (its steady
  rhythm), widened to at least a few typical actions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never open a window

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from octopipe.actions import Event, F  # noqa: E402
from octopipe.outfiles import replacing  # noqa: E402
from octopipe.sim import SimResult  # noqa: E402
from octopipe.units import time_unit  # noqa: E402
from octopipe.viz.boxes import draw_boxes, kind_colors  # noqa: E402
from octopipe.viz.layout import TimelineLayout  # noqa: E402
from octopipe.viz.style import (  # noqa: E402
    KIND_COLOR_NAMES,
    KIND_COLORS,
    KIND_ORDER,
    chunk_indices,
    device_label,
    events_of,
    headline,
    image_format,
    summarize,
)

BINS = 240  # time slices of the heat map
ZOOM_ROWS = 64  # devices the zoomed window draws at most (the first ones)
_WIDTH_IN, _DPI = 16.0, 150


def save_overview(
    result: SimResult | Sequence[Event],
    path: str | Path,
    title: str | None = None,
    device_names: Sequence[str] | None = None,
) -> Path:
    """Draw the overview (module docstring) to a PNG or SVG, by the file suffix."""
    path = Path(path)
    fmt = image_format(path)
    events = events_of(result)
    if not events:
        raise ValueError("nothing to draw: no events")
    stats = summarize(result)
    P, span = stats.num_devices, stats.iteration_time
    unit, scale = time_unit(span)
    idle = idle_shares(events, P, span)
    lo, hi = steady_window(events, span)
    zoomed = min(P, ZOOM_ROWS)
    # Within a screen (the timeline's bounds, `layout`): 16 x 12 inches at most, at 150 dpi.
    heat_h = min(5.0, max(1.5, 0.07 * P))
    zoom_h = min(4.5, max(1.2, 0.25 * zoomed))
    height = 1.1 + heat_h + 0.9 + zoom_h + 0.6
    fig = plt.figure(figsize=(_WIDTH_IN, height))
    grid = fig.add_gridspec(
        2,
        2,
        width_ratios=(6, 1),
        height_ratios=(heat_h, zoom_h),
        hspace=0.9 / ((heat_h + zoom_h) / 2),
        wspace=0.04,
    )
    heat, bars, zoom = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1]), None
    image = heat.imshow(
        idle,
        aspect="auto",
        cmap="magma",
        vmin=0.0,
        vmax=1.0,
        interpolation="nearest",
        extent=(0.0, span * scale, P - 0.5, -0.5),
    )
    heat.add_patch(
        Rectangle((lo * scale, -0.5), (hi - lo) * scale, P, fill=False, edgecolor="#00C0FF", lw=1.2)
    )
    heat.set_title("idle share of each slice of the iteration (bright: bubbles)", fontsize=9)
    heat.set_xlabel(f"time ({unit})", fontsize=8)
    _device_ticks(heat, P, device_names, heat_h)
    colorbar = fig.colorbar(image, ax=bars, fraction=0.25, pad=0.05)
    colorbar.ax.tick_params(labelsize=7)
    busy = [b / span if span > 0 else 0.0 for b in stats.busy]
    bars.barh(range(P), busy, height=0.8, color=KIND_COLORS["F"])
    bars.set_ylim(P - 0.5, -0.5)
    bars.set_xlim(0, 1)
    bars.set_yticks([])
    bars.set_title("utilization", fontsize=9)
    bars.tick_params(labelsize=7)
    bars.xaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
    zoom = fig.add_subplot(grid[1, :])
    shown = [e for e in events if e.device < zoomed and e.end >= lo and e.start <= hi]
    chunk_of = chunk_indices(events)
    width_in = zoom.get_position().width * _WIDTH_IN
    layout = TimelineLayout(width_in, zoom_h / zoomed, zoomed, 1, hi - lo, _DPI)
    critical = set(result.critical_path) if isinstance(result, SimResult) else set()
    colors = kind_colors(1 + max(chunk_of.values()))
    zoom.set_xlim(lo * scale, hi * scale)
    zoom.set_ylim(zoomed, 0.0)
    draw_boxes(zoom, shown, layout, scale, (lo, hi), colors, chunk_of, critical, fmt)
    _device_ticks(zoom, zoomed, device_names, zoom_h, list(layout.rows.compute))
    more = f", devices 0 to {zoomed - 1} of {P}" if zoomed < P else ""
    zoom.set_title(
        f"one period of the steady state, {lo * scale:.4g} to {hi * scale:.4g} {unit}{more} "
        f"({_colors_drawn(shown, chunk_of)})",
        fontsize=9,
    )
    zoom.set_xlabel(f"time ({unit})", fontsize=8)
    zoom.tick_params(labelsize=7)
    heat.tick_params(axis="x", labelsize=7)
    devices = f"{P} device{'s' * (P != 1)}"
    note = f"{len(events):,} actions on {devices}: an overview (every action: the HTML timeline)"
    heading = f"{title}\n" if title else ""
    fig.suptitle(f"{heading}{headline(stats)}\n{note}", fontsize=10, x=0.06, ha="left", y=0.995)
    fig.subplots_adjust(left=0.1, right=0.97, top=1.0 - 1.1 / height, bottom=0.6 / height)
    with replacing(path, "wb") as file:  # whole or not at all, over a regular file only
        fig.savefig(file, format=fmt, dpi=_DPI)
    plt.close(fig)
    return path


def _colors_drawn(shown: Sequence[Event], chunk_of: dict[int, int]) -> str:
    """What the zoomed boxes' colours mean, for the kinds and chunks drawn there only."""
    kinds = {e.action.kind for e in shown}
    said = ", ".join(f"{k} {KIND_COLOR_NAMES[k]}" for k in KIND_ORDER if k in kinds)
    if len({chunk_of[e.action.stage] for e in shown}) > 1:
        said += "; lighter: later chunks"
    return said


def idle_shares(events: Sequence[Event], num_devices: int, span: float, bins: int = BINS):
    """A (devices x bins) array: the share of each slice of [0, span] each device is idle."""
    busy = np.zeros((num_devices, bins + 1))
    if span <= 0 or not events:
        return np.ones((num_devices, bins))
    width = span / bins
    device = np.array([e.device for e in events])
    start = np.clip(np.array([e.start for e in events]) / width, 0, bins)
    end = np.clip(np.array([e.end for e in events]) / width, 0, bins)
    first, last = np.floor(start).astype(int), np.floor(end).astype(int)
    whole = np.zeros((num_devices, bins + 2))
    # Slices strictly between an action's first and last are busy throughout (a difference
    # array); the first and last slices get their parts.
    np.add.at(whole, (device, first + 1), 1.0)
    np.add.at(whole, (device, np.maximum(last, first + 1)), -1.0)
    busy[:, :] = np.cumsum(whole, axis=1)[:, : bins + 1]
    same = first == last
    np.add.at(busy, (device[same], first[same]), end[same] - start[same])
    split = ~same
    np.add.at(busy, (device[split], first[split]), first[split] + 1 - start[split])
    np.add.at(busy, (device[split], last[split]), end[split] - last[split])
    return np.clip(1.0 - busy[:, :bins], 0.0, 1.0)


def steady_window(events: Sequence[Event], span: float) -> tuple[float, float]:
    """One period of the steady state, around the iteration's middle (module docstring)."""
    per_device: dict[int, float] = {}
    for e in events:
        per_device[e.device] = per_device.get(e.device, 0.0) + e.end - e.start
    busiest = max(per_device, key=per_device.__getitem__)
    forwards: dict[int, list[float]] = {}
    for e in events:
        if e.device == busiest and e.action.kind == F:
            forwards.setdefault(e.action.stage, []).append(e.start)
    starts = max(forwards.values(), key=len, default=[])
    gaps = sorted(b - a for a, b in zip(sorted(starts), sorted(starts)[1:]) if b > a)
    durations = sorted(d for e in events if (d := e.end - e.start) > 0)
    typical = durations[len(durations) // 2] if durations else span
    period = gaps[len(gaps) // 2] if gaps else typical
    width = min(span, max(period, 6 * typical))
    middle = span / 2
    lo = min(max(0.0, middle - width / 2), span - width)
    return lo, lo + width


def _device_ticks(
    ax, num_devices: int, names, height_in: float, where: list[float] | None = None
) -> None:
    """Row labels of a panel `height_in` tall, every k-th where rows are too thin for each."""
    row_pt = height_in * 72 / num_devices
    step = max(1, math.ceil(6.0 / row_pt))  # a 6 pt label's height, at least, per label
    ticks = list(range(0, num_devices, step))
    positions = [where[d] for d in ticks] if where else ticks
    labels = [device_label(d, names) for d in ticks]
    ax.set_yticks(positions, labels, fontsize=min(7.0, max(4.0, 0.9 * row_pt * step)))
