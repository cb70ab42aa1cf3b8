"""The memory plot: one small panel per device, memory held over the iteration.

The curves are `octopipe.sim.memory.memory_over_time`, the simulator's own memory semantics;
this module only draws them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never open a window

import matplotlib.pyplot as plt  # noqa: E402

from octopipe.actions import Event  # noqa: E402
from octopipe.outfiles import replacing  # noqa: E402
from octopipe.plan import Plan  # noqa: E402
from octopipe.profile import Profile  # noqa: E402
from octopipe.sim import SimResult  # noqa: E402
from octopipe.sim.memory import memory_over_time  # noqa: E402
from octopipe.units import byte_unit, time_unit  # noqa: E402
from octopipe.viz.style import (  # noqa: E402
    KIND_COLORS,
    device_label,
    gpu_names,
    image_format,
    summarize,
)

CAPACITY_COLOR = "#990000"


def save_memory_plot(
    result: SimResult | Sequence[Event],
    plan: Plan,
    profile: Profile,
    path: str | Path,
    title: str | None = None,
) -> Path:
    """One small panel per device, sharing the time axis and one memory scale: memory held
    over the iteration, static memory shaded, the peak marked, the device's capacity dashed
    (every device's, so the headroom shows); on a mixed cluster each panel names its kind."""
    device_names = gpu_names(profile)
    path = Path(path)
    fmt = image_format(path)
    traces = memory_over_time(result, plan, profile)
    stats = summarize(result)
    unit, scale = time_unit(stats.iteration_time)
    top = max(max(t.peak_bytes for t in traces), 1.0)
    capacities = [t.capacity_bytes for t in traces if math.isfinite(t.capacity_bytes)]
    ceiling = max([top, *capacities])  # one scale for all panels: peaks and capacities compare
    bunit, bscale = byte_unit(ceiling)
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
            # Every device's capacity is drawn, in view: the headroom is part of the picture.
            ax.axhline(tr.capacity_bytes / bscale, color=CAPACITY_COLOR, linestyle="--", lw=0.9)
            note += f"\nof {tr.capacity_bytes / bscale:.3g} {bunit}"
            if tr.peak_bytes > tr.capacity_bytes:
                note += "  OVER"
        ax.text(1.005, 0.5, note, transform=ax.transAxes, fontsize=7, va="center", ha="left")
        ax.set_ylabel(
            device_label(tr.device, device_names), rotation=0, ha="right", va="center", fontsize=8
        )
        ax.set_ylim(0, 1.08 * ceiling / bscale)
        ax.set_xlim(0, end)
        ax.tick_params(labelsize=7)
        ax.spines[["top", "right"]].set_visible(False)
    axes[-1, 0].set_xlabel(f"time ({unit})")
    heading = (
        f"memory per device ({bunit}); grey: static (weights, gradients, optimizer state); "
        "dashed: capacity"
    )
    fig.suptitle(f"{title}\n{heading}" if title else heading, fontsize=10, x=0.1, ha="left")
    fig.subplots_adjust(left=0.1, right=0.84, top=1.0 - 0.7 / fig.get_size_inches()[1])
    with replacing(path, "wb") as file:  # whole or not at all, over a regular file only
        fig.savefig(file, format=fmt, dpi=130)
    plt.close(fig)
    return path
