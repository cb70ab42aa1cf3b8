"""Megatron-LM's usual layout of a job: the reference every cluster answer is set beside.

Megatron-LM's practice: TP = the GPUs of a node (or the largest degree the model's heads
allow), microbatch size 1, the smallest PP that fits memory, DP the rest, the distributed
optimizer, interleaved 1F1B over a uniform partition.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from octopipe.layouts.cluster import Cluster
from octopipe.layouts.layout import Job, Layout, divisors

if TYPE_CHECKING:
    from octopipe.layouts.search import LayoutSearch, Row


def megatron_layout(
    cluster: Cluster, global_batch: int, num_layers: int, tp_fits: Callable[[int], bool]
) -> list[Layout]:
    """Megatron-LM's usual choice, most preferred first: TP = the GPUs of a node (or the
    largest that fits the model's heads), microbatch size 1, then the smallest PP that fits
    memory (the caller tries them in order), DP the rest, with the distributed optimizer."""
    G = min(cluster.gpus_per_node, cluster.size)
    tp = max(t for t in divisors(G) if tp_fits(t))
    out = []
    for pp in divisors(cluster.size // tp):
        dp = cluster.size // (tp * pp)
        if pp <= num_layers and global_batch % dp == 0:
            out.append(Layout(tp, pp, dp, 1, global_batch // dp, zero1=dp > 1))
    return out


def reference_row(search: LayoutSearch, job: Job, num_layers: int) -> Row | None:
    """Megatron-LM's usual layout: the first of its preferences whose interleaved 1F1B over a
    uniform partition fits (or the leanest, when none does)."""
    leanest = None
    for layout in megatron_layout(job.cluster, job.global_batch, num_layers, search.tp_fits):
        names = [("i1f1b", "uniform")] if layout.pp > 1 else [("1f1b", "uniform")]
        rows = search.baselines(layout, names) or search.baselines(layout, [("1f1b", "uniform")])
        for row in rows:
            if row.sim.fits:
                return replace(row, label="Megatron-LM")
            if leanest is None or row.score < leanest.score:
                leanest = replace(row, label="Megatron-LM")
    return leanest
