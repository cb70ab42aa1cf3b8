"""The layouts every cluster answer is set beside: Megatron-LM's usual one for the job, and
the user's own (`--from-layout`), each planned as its framework runs it.

Megatron-LM's practice: TP = the GPUs of a node (or the largest degree the model's heads
allow), microbatch size 1, the smallest PP that fits memory, recomputation only where memory
binds (none, then selective, then full at each PP), DP the rest, the distributed optimizer,
interleaved 1F1B (two chunks per device; 1F1B with one stage) over a uniform partition.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from octopipe.errors import InputError
from octopipe.layouts.cluster import Cluster
from octopipe.layouts.layout import RECOMPUTE_ORDER, Job, Layout, divisors
from octopipe.layouts.planner import LayoutSearch, Row
from octopipe.layouts.spec import LayoutSpec

MEGATRON_LABEL = "Megatron-LM"


def megatron_layout(
    cluster: Cluster, global_batch: int, num_layers: int, tp_fits: Callable[[int], bool]
) -> list[Layout]:
    """Megatron-LM's usual choice, most preferred first: TP = the GPUs of a node (or the
    largest that fits the model's heads), microbatch size 1, then the smallest PP that fits
    memory with the least recomputation (the caller tries them in order), DP the rest, with the
    distributed optimizer."""
    G = min(cluster.gpus_per_node, cluster.size)
    tp = max(t for t in divisors(G) if tp_fits(t))
    out = []
    for pp in divisors(cluster.size // tp):
        dp = cluster.size // (tp * pp)
        if pp <= num_layers and global_batch % dp == 0:
            for recompute in RECOMPUTE_ORDER:
                layout = Layout(tp, pp, dp, 1, global_batch // dp, zero1=dp > 1)
                out.append(replace(layout, recompute=recompute))
    return out


def megatron_schedule(layout: Layout) -> tuple[str, str, int | None]:
    """(schedule, partition, chunks) Megatron-LM runs a layout with."""
    return ("i1f1b", "uniform", 2) if layout.pp > 1 else ("1f1b", "uniform", None)


def reference_row(search: LayoutSearch, job: Job, num_layers: int) -> Row | None:
    """Megatron-LM's usual layout: the first of its preferences whose plan fits (or the
    leanest, when none does)."""
    leanest = None
    for layout in megatron_layout(job.cluster, job.global_batch, num_layers, search.tp_fits):
        rows = search.baselines(layout, [megatron_schedule(layout)]) or search.baselines(
            layout, [("1f1b", "uniform", None)]
        )
        for row in rows:
            row = replace(row, label=MEGATRON_LABEL)
            if row.sim.fits:
                return row
            if leanest is None or row.score < leanest.score:
                leanest = row
    return leanest


def from_layout_row(search: LayoutSearch, job: Job, spec: LayoutSpec) -> Row:
    """The user's layout, planned as `octopipe estimate` plans it: its schedule over the
    uniform partition."""
    layout = spec.for_gpus(job.cluster.size, job.global_batch, "--from-layout")
    chunks = spec.chunks if spec.chunks > 1 else None
    try:
        row = search.baseline(layout, spec.schedule, "uniform", chunks)
    except InputError as exc:  # the schedule or the model does not take these degrees
        raise InputError("--from-layout", f"{layout.describe()}: {exc}") from None
    return replace(row, label="given")
