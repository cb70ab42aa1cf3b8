"""The timeline picture (PNG or SVG): one row per device, one box per action.

The picture fits a screen (sizes: `viz.layout`): within 2400 x 1800 pixels, long iterations
wrapped into bands, microbatch labels only where they fit, time ticks with units. Where a box
per action would make a barcode (a typical action under a few pixels, or more devices than a
screen shows apart: `layout.needs_overview`) the picture is an overview instead
(`viz.overview`: utilization per device, a heat map of the bubbles, one period zoomed in); the
detail of a big plan is in the HTML timeline (`viz.html`). Boxes (`viz.boxes`) are one
PolyCollection per band, so tens of thousands draw in seconds. In an SVG each action is its
own element with the id `action-d{device}-{action}`. A device with data-parallel gradient
all-reduces gets a thin row just below its own, a bar per reduction (SVG id
`reduce-d{device}-s{stage}`). The critical path is outlined on boxes wide enough to show an
outline, and marked by a thin dark strip at the foot of the narrower ones. On a mixed cluster
each row names its device's kind.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never open a window

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402
from matplotlib.transforms import blended_transform_factory  # noqa: E402

from octopipe.actions import Event  # noqa: E402
from octopipe.outfiles import replacing  # noqa: E402
from octopipe.sim import SimResult  # noqa: E402
from octopipe.units import time_unit  # noqa: E402
from octopipe.viz.boxes import add_boxes, draw_boxes, kind_colors, legend_entries  # noqa: E402
from octopipe.viz.layout import (  # noqa: E402
    BAND_GAP,
    BAR_FILL,
    INCHES_PER_TICK,
    MARGIN_LEFT,
    MARGIN_TOP,
    REDUCE_ROW,
    TimelineRows,
    needs_overview,
    timeline_layout,
)
from octopipe.viz.overview import save_overview  # noqa: E402
from octopipe.viz.style import (  # noqa: E402
    REDUCE_COLOR,
    TimelineSummary,
    chunk_indices,
    device_label,
    events_of,
    headline,
    image_format,
    label_font_size,
    reductions_of,
    stage_list,
    stages_per_device,
    summarize,
)


def save_timeline(
    result: SimResult | Sequence[Event],
    path: str | Path,
    title: str | None = None,
    stage_labels: bool = True,
    device_names: Sequence[str] | None = None,
    overview: bool | None = None,
) -> Path:
    """Draw one row per device, one box per action, to a PNG or SVG (by the file suffix).

    Boxes are coloured by kind (F/B/I/W) and lightened per chunk, labelled with the
    microbatch where the label fits; grey is idle time. A SimResult's critical path is
    outlined, and its gradient all-reduces fill a thin row under their device, labelled with
    the stage where the label fits. `stage_labels` names each row's stages next to its device;
    `device_names` (one per device, `style.gpu_names`) the kind of each. `overview`: draw the
    overview instead (`viz.overview`); None: where a box per action would be a barcode.
    """
    path = Path(path)
    fmt = image_format(path)
    events = events_of(result)
    stats = summarize(result)
    if not events:
        raise ValueError("nothing to draw: no events")
    unit, scale = time_unit(stats.iteration_time)
    critical = set(result.critical_path) if isinstance(result, SimResult) else set()
    chunk_of = chunk_indices(events)
    num_chunks = 1 + max(chunk_of.values())
    reductions = reductions_of(result)
    layout = timeline_layout(
        events, stats.iteration_time, stats.num_devices, {r.device for r in reductions}
    )
    if overview or (overview is None and needs_overview(layout, events)):
        return save_overview(result, path, title, device_names)
    rows = layout.rows
    colors = kind_colors(num_chunks)

    fig = plt.figure(figsize=layout.figure_size)
    fig_w, fig_h = layout.figure_size
    band_span = layout.band_span
    for band in range(layout.bands):
        top = MARGIN_TOP + band * (layout.axes_height + BAND_GAP)
        ax = fig.add_axes(
            (
                MARGIN_LEFT / fig_w,
                1.0 - (top + layout.axes_height) / fig_h,
                layout.axes_width / fig_w,
                layout.axes_height / fig_h,
            )
        )
        lo, hi = band * band_span, (band + 1) * band_span
        ax.set_xlim(lo * scale, hi * scale)
        ax.set_ylim(rows.height, 0.0)  # device 0 on top
        shown = [e for e in events if e.end >= lo and e.start <= hi]
        draw_boxes(ax, shown, layout, scale, (lo, hi), colors, chunk_of, critical, fmt, band)
        reduced = [r for r in reductions if r.end >= lo and r.start <= hi]
        _draw_reductions(ax, reduced, layout, scale, (lo, hi), fmt, band)
        _label_rows(ax, events, stats, stage_labels, rows, band == 0, device_names)
        ax.xaxis.set_major_locator(
            MaxNLocator(
                nbins=max(3, round(layout.axes_width / INCHES_PER_TICK)),
                steps=[1, 2, 2.5, 5, 10],
            )
        )
        ax.tick_params(axis="x", labelsize=8)
        ax.spines[["top", "right", "left"]].set_visible(False)
        ax.tick_params(axis="y", which="both", length=0)
        ax.grid(axis="x", color="#BBBBBB", linewidth=0.4, zorder=1)
        ax.set_axisbelow(True)
    ax.set_xlabel(f"time ({unit})" + (f", in {layout.bands} bands" if layout.bands > 1 else ""))
    _add_legend(fig, events, num_chunks, bool(critical), bool(reductions))
    heading = headline(stats)
    fig.text(
        MARGIN_LEFT / fig_w,
        1.0 - 0.12 / fig_h,
        f"{title}\n{heading}" if title else heading,
        ha="left",
        va="top",
        fontsize=11,
    )
    with replacing(path, "wb") as file:  # whole or not at all, over a regular file only
        fig.savefig(file, format=fmt, dpi=layout.dpi)
    plt.close(fig)
    return path


def _draw_reductions(ax, reductions, layout, scale, window, fmt, band) -> None:
    """The all-reduce bars on their thin rows, each labelled with its stage where it fits."""
    lo, hi = window
    ys = layout.rows.reduce
    half = BAR_FILL * REDUCE_ROW / 2
    wide = bool(reductions) and layout.box_width_pt(min(r.end - r.start for r in reductions)) > 3
    boxes = []
    for r in reductions:
        x0, x1, y0, y1 = r.start * scale, r.end * scale, ys[r.device] - half, ys[r.device] + half
        if fmt == "svg":  # an element per reduction, as per action
            box = Rectangle(
                (x0, y0), x1 - x0, 2 * half, facecolor=REDUCE_COLOR, edgecolor="white",
                linewidth=0.4, zorder=2,
            )  # fmt: skip
            first = r.start >= lo or band == 0
            box.set_gid(f"{'' if first else 'more-'}reduce-d{r.device}-s{r.stage}")
            ax.add_artist(box)
        else:
            boxes.append([(x0, y0), (x1, y0), (x1, y1), (x0, y1)])
    add_boxes(ax, boxes, REDUCE_COLOR, wide)
    for r in reductions:
        text = f"s{r.stage}"
        size = label_font_size(
            layout.box_width_pt(r.end - r.start), layout.reduce_bar_height_pt, text
        )
        if size is None or not (lo <= (r.start + r.end) / 2 < hi):
            continue
        ax.text(
            (r.start + r.end) / 2 * scale,
            ys[r.device],
            text,
            ha="center",
            va="center",
            fontsize=size,
            color="white",
            zorder=4,
        )


def _label_rows(
    ax,
    events: Sequence[Event],
    stats: TimelineSummary,
    stage_labels: bool,
    rows: TimelineRows,
    idle: bool,
    device_names: Sequence[str] | None = None,
) -> None:
    stages_of = stages_per_device(events)
    labels = []
    for d in range(stats.num_devices):
        label = device_label(d, device_names)
        if stage_labels and d in stages_of:
            label += "\n" + stage_list(stages_of[d])
        labels.append(label)
    rows_pt = ax.get_position().height * ax.figure.get_size_inches()[1] * 72 / rows.height
    size = min(7.5 if stage_labels else 8.5, 0.45 * rows_pt if stage_labels else 0.8 * rows_pt)
    ax.set_yticks(rows.compute, labels, fontsize=max(size, 3.0), linespacing=0.95)
    if rows.reduce:  # minor ticks: their own, smaller font
        ax.set_yticks(
            list(rows.reduce.values()),
            [f"device {d} all-reduce" for d in rows.reduce],
            minor=True,
            fontsize=max(min(7.0, 0.8 * REDUCE_ROW * rows_pt), 3.0),
            color="#555555",
        )
    if not idle:
        return
    # Idle share just right of each row: axes-x / data-y coordinates, a fixed offset in points.
    right = blended_transform_factory(ax.transAxes, ax.transData)
    for d in range(stats.num_devices):
        share = 1.0 - stats.busy[d] / stats.iteration_time if stats.iteration_time > 0 else 0.0
        ax.annotate(
            f"idle {100 * share:.0f}%",
            (1.0, rows.compute[d]),
            xycoords=right,
            xytext=(4, 0),
            textcoords="offset points",
            ha="left",
            va="center",
            fontsize=min(7.0, max(3.0, 0.8 * rows_pt)),
            color="#555555",
        )


def _add_legend(
    fig, events: Sequence[Event], num_chunks: int, critical: bool, reductions: bool
) -> None:
    handles, labels, handler_map = legend_entries(events, num_chunks, critical, reductions)
    fig_w, fig_h = fig.get_size_inches()
    # One row under the title, its left edge under the title's.
    fig.legend(
        handles=handles,
        labels=labels,
        loc="upper left",
        ncol=len(handles),
        fontsize=8,
        frameon=False,
        bbox_to_anchor=((MARGIN_LEFT - 0.1) / fig_w, 1.0 - 0.55 / fig_h),
        borderaxespad=0.0,
        handlelength=1.2,
        columnspacing=1.2,
        handler_map=handler_map,
    )
