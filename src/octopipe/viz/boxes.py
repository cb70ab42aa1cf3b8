"""Action boxes on a matplotlib axes: what the timeline, the overview's zoomed period and the
measured-against-predicted picture all draw (a box per action, coloured by kind and shaded
per chunk, the critical path marked, labels where they fit).

Draws on axes it is given; it makes no figure and saves nothing (`timeline.py` and the
pictures beside it do).
"""

from __future__ import annotations

from matplotlib.collections import PolyCollection
from matplotlib.legend_handler import HandlerTuple
from matplotlib.patches import Patch, Rectangle

from octopipe.viz.layout import BAR_FILL
from octopipe.viz.style import (
    CRITICAL_EDGE,
    IDLE_COLOR,
    KIND_COLORS,
    KIND_NAMES,
    KIND_ORDER,
    REDUCE_COLOR,
    shade,
)


def kind_colors(num_chunks: int) -> dict:
    """(kind, chunk) -> the box's colour."""
    return {
        (k, c): shade(KIND_COLORS[k], c, num_chunks) for k in KIND_ORDER for c in range(num_chunks)
    }


def legend_entries(events, num_chunks: int, critical: bool, reductions: bool = False):
    """(handles, labels, handler_map) of a legend of what `draw_boxes` draws for `events`: the
    kinds present; each chunk as its kinds' shades side by side (a chunk is the kinds' colours
    lightened, never a colour of its own); idle; the critical path where it is marked."""
    kinds = [k for k in KIND_ORDER if any(e.action.kind == k for e in events)]
    handles: list = [Patch(facecolor=KIND_COLORS[k]) for k in kinds]
    labels = [f"{k} {KIND_NAMES[k]}" for k in kinds]
    if reductions:
        handles.append(Patch(facecolor=REDUCE_COLOR))
        labels.append("gradient all-reduce")
    if num_chunks > 1:
        for c in range(num_chunks):
            handles.append(
                tuple(Patch(facecolor=shade(KIND_COLORS[k], c, num_chunks)) for k in kinds)
            )
            labels.append(f"chunk {c}")
    handles.append(Patch(facecolor=IDLE_COLOR))
    labels.append("idle")
    if critical:
        handles.append(Patch(facecolor="white", edgecolor=CRITICAL_EDGE))
        labels.append("critical path")
    return handles, labels, {tuple: HandlerTuple(ndivide=None, pad=0.0)}


def draw_boxes(ax, events, layout, scale, window, colors, chunk_of, critical, fmt, band=0) -> None:
    """Idle rows, the boxes (one collection; one element each in an SVG), the critical path's
    marks and the labels that fit, for the events of one time window of the axes."""
    lo, hi = window
    half = BAR_FILL / 2
    ys = layout.rows.compute
    idle = [
        [
            (lo * scale, y - half),
            (hi * scale, y - half),
            (hi * scale, y + half),
            (lo * scale, y + half),
        ]
        for y in ys
    ]
    ax.add_collection(PolyCollection(idle, facecolors=IDLE_COLOR, edgecolors="none", zorder=0))
    per_action = fmt == "svg"
    # Thin white edges part neighbouring boxes only where boxes are wide enough to show them.
    wide = (
        bool(events) and layout.box_width_pt(sum(e.end - e.start for e in events) / len(events)) > 3
    )
    boxes, faces, outlines, strips = [], [], [], []
    for e in events:
        a = e.action
        x0, x1 = e.start * scale, e.end * scale
        y0, y1 = ys[e.device] - half, ys[e.device] + half
        face = colors[(a.kind, chunk_of[a.stage])]
        if per_action:  # an element per action readers can find by id; SVGs are small plans
            box = Rectangle(
                (x0, y0), x1 - x0, BAR_FILL, facecolor=face, edgecolor="white",
                linewidth=0.4, zorder=2,
            )  # fmt: skip
            first = e.start >= lo or band == 0
            box.set_gid(f"{'' if first else 'more-'}action-d{e.device}-{a}")
            ax.add_artist(box)  # add_patch would re-fit the axis limits for every box: slow
        else:
            boxes.append([(x0, y0), (x1, y0), (x1, y1), (x0, y1)])
            faces.append(face)
        if a in critical:
            # An outline only where the box is wide enough to show it inside: on narrow boxes
            # outlines merge into a black row; a strip at their foot marks them instead.
            if layout.box_width_pt(e.end - e.start) > 4:
                outlines.append([(x0, y0), (x1, y0), (x1, y1), (x0, y1)])
            else:
                strips.append([(x0, y1 - 0.14), (x1, y1 - 0.14), (x1, y1), (x0, y1)])
    add_boxes(ax, boxes, faces, wide)
    if outlines:
        ax.add_collection(
            PolyCollection(
                outlines, facecolors="none", edgecolors=CRITICAL_EDGE, linewidths=1.1, zorder=3
            )
        )
    if strips:
        ax.add_collection(
            PolyCollection(
                strips, facecolors=CRITICAL_EDGE, edgecolors="none", linewidths=0.0, zorder=3
            )
        )
    for e in events:
        size = layout.label_size(e)
        if size is None or not (lo <= (e.start + e.end) / 2 < hi):
            continue
        ax.text(
            (e.start + e.end) / 2 * scale,
            ys[e.device],
            str(e.action.mb),
            ha="center",
            va="center",
            fontsize=size,
            color="white" if chunk_of[e.action.stage] == 0 else "#222222",
            zorder=4,
        )


def add_boxes(ax, boxes: list, faces, wide: bool) -> None:
    """Filled boxes in one collection; thin white edges part them only where they are wide."""
    if boxes:
        ax.add_collection(
            PolyCollection(
                boxes,
                facecolors=faces,
                edgecolors="white" if wide else "face",
                linewidths=0.4 if wide else 0.0,
                zorder=2,
            )
        )
