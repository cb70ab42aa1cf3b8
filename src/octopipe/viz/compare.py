"""A measured step above its prediction (PNG or SVG), on one time axis: `octopipe run --png
--profile`.

Two panels, one row per device in each, under one legend of what they draw: the run's last
step as measured (the first replica's ranks, the first tensor-parallel rank of each device),
then the simulator's prediction of the plan on its profile, both from 0 and drawn as the
timeline draws them, so the same action sits at the same height in both and a stretch of the
measured row is a slower action, and a gap where the prediction has none a wait.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never open a window

import matplotlib.pyplot as plt  # noqa: E402

from octopipe.actions import Event  # noqa: E402
from octopipe.outfiles import replacing  # noqa: E402
from octopipe.sim import SimResult  # noqa: E402
from octopipe.units import time_unit  # noqa: E402
from octopipe.viz.boxes import draw_boxes, kind_colors, legend_entries  # noqa: E402
from octopipe.viz.layout import TimelineLayout  # noqa: E402
from octopipe.viz.style import (  # noqa: E402
    chunk_indices,
    device_label,
    events_of,
    headline,
    image_format,
    summarize,
)

_WIDTH_IN, _DPI, _MAX_HEIGHT_IN = 16.0, 150, 12.0


def save_measured_and_predicted(
    measured: Sequence[Event],
    predicted: SimResult,
    path: str | Path,
    title: str | None = None,
    device_names: Sequence[str] | None = None,
) -> Path:
    """Draw the measured events above the prediction, sharing the time axis (module doc)."""
    path = Path(path)
    fmt = image_format(path)
    panels = (("measured", events_of(measured)), ("predicted", events_of(predicted)))
    if not panels[0][1]:
        raise ValueError("nothing to draw: no measured events")
    P = max(summarize(predicted).num_devices, summarize(measured).num_devices)
    span = max(max(e.end for e in events) for _, events in panels)
    unit, scale = time_unit(span)
    row = min(0.34, (_MAX_HEIGHT_IN - 2.2) / (2 * P))
    height = 2.2 + 2 * P * row
    fig, axes = plt.subplots(
        2, 1, sharex=True, figsize=(_WIDTH_IN, height), gridspec_kw={"hspace": 0.35}
    )
    fig.subplots_adjust(left=0.1, right=0.97, top=1.0 - 1.0 / height, bottom=0.6 / height)
    width_in = axes[0].get_position().width * _WIDTH_IN
    layout = TimelineLayout(width_in, row, P, 1, span, _DPI)
    critical = set(predicted.critical_path)
    for ax, (what, events) in zip(axes, panels):
        chunk_of = chunk_indices(events)
        colors = kind_colors(1 + max(chunk_of.values()))
        ax.set_xlim(0, span * scale)
        ax.set_ylim(P, 0.0)
        marked = critical if what == "predicted" else set()
        draw_boxes(ax, events, layout, scale, (0.0, span), colors, chunk_of, marked, fmt)
        ax.set_yticks(
            layout.rows.compute, [device_label(d, device_names) for d in range(P)], fontsize=7
        )
        ax.set_title(f"{what}: {headline(summarize(events if what == 'measured' else predicted))}",
                     fontsize=9, loc="left")  # fmt: skip
        ax.tick_params(axis="x", labelsize=7)
        ax.spines[["top", "right"]].set_visible(False)
    axes[-1].set_xlabel(f"time ({unit})", fontsize=8)
    both = [e for _, events in panels for e in events]
    handles, labels, handler_map = legend_entries(
        both, 1 + max(chunk_indices(both).values()), bool(critical)
    )
    fig.legend(  # top right, beside the title
        handles=handles,
        labels=labels,
        handler_map=handler_map,
        loc="upper right",
        bbox_to_anchor=(0.97, 1.0 - 0.08 / height),
        ncol=len(handles),
        fontsize=8,
        frameon=False,
        handlelength=1.2,
        columnspacing=1.2,
        borderaxespad=0.0,
    )
    if title:
        fig.suptitle(title, fontsize=10, x=0.1, ha="left")
    with replacing(path, "wb") as file:  # whole or not at all, over a regular file only
        fig.savefig(file, format=fmt, dpi=_DPI)
    plt.close(fig)
    return path
