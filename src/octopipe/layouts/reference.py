"""The layouts every cluster answer is set beside: Megatron-LM's usual one for the job, and
the user's own (`--from-layout`), each planned as its framework runs it. (Published recipes
are `recipes.py`'s; the best standard schedule over the screened layouts is `search.py`'s.)

Megatron-LM's practice: TP by the model's size as its own scaling table sets it (Megatron-LM's
README, from Narayanan et al. 2021's Table 1: 1.7B at TP 1, 3.6B at 2, 7.5B at 4, 18B and up
at 8), within a node and the model's heads; microbatch size 1, the smallest PP that fits
memory, recomputation only where memory binds (none, then selective, then full at each PP),
DP the rest, the distributed optimizer, interleaved 1F1B (two chunks per device; 1F1B with one
stage) over a uniform partition.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from octopipe.errors import InputError
from octopipe.layouts.cluster import Cluster
from octopipe.layouts.estimate import Given, check_given
from octopipe.layouts.layout import Job, divisors
from octopipe.layouts.planner import LayoutSearch, Row
from octopipe.layouts.recipes import RECIPE_LABEL, nearest_recipe, recipe_layout
from octopipe.layouts.spec import LayoutSpec
from octopipe.plan.shape import RECOMPUTE_KINDS, JobShape

MEGATRON_LABEL = "Megatron-LM"
# Megatron-LM's scaling table (README; Narayanan et al. 2021, Table 1): the TP of each size,
# as (up to this many dense parameters, TP); larger models take TP 8. The bounds sit between
# the table's sizes (1.7B, 3.6B, 7.5B, 18B).
TP_BY_SIZE = ((2.5e9, 1), (5e9, 2), (12e9, 4))


def tp_by_size(dense_params: float) -> int:
    """The TP Megatron-LM's scaling table gives a model of `dense_params` (experts left out:
    they are spread by expert parallelism, not TP)."""
    return next((tp for bound, tp in TP_BY_SIZE if dense_params <= bound), 8)


def megatron_layout(
    cluster: Cluster,
    global_batch: int,
    num_layers: int,
    tp_fits: Callable[[int], bool],
    dense_params: float | None = None,
) -> list[JobShape]:
    """Megatron-LM's usual choice, most preferred first: TP by the model's size (`tp_by_size`;
    the GPUs of a node when the size is not given), within a node and the largest that fits
    the model's heads, microbatch size 1, then the smallest PP that fits memory with the least
    recomputation (the caller tries them in order), DP the rest, with the distributed
    optimizer."""
    G = min(cluster.gpus_per_node, cluster.size)
    wanted = G if dense_params is None else min(G, tp_by_size(dense_params))
    tp = max(t for t in divisors(G) if t <= wanted and tp_fits(t))
    out = []
    for pp in divisors(cluster.size // tp):
        dp = cluster.size // (tp * pp)
        if pp <= num_layers and global_batch % dp == 0:
            for recompute in RECOMPUTE_KINDS:
                layout = JobShape(tp, pp, dp, 1, global_batch // dp, zero=int(dp > 1))
                out.append(replace(layout, recompute=recompute))
    return out


def megatron_schedule(layout: JobShape) -> tuple[str, str, int | None]:
    """(schedule, partition, chunks) Megatron-LM runs a layout with."""
    return ("i1f1b", "uniform", 2) if layout.pp > 1 else ("1f1b", "uniform", None)


def reference_row(search: LayoutSearch, job: Job, num_layers: int) -> Row | None:
    """Megatron-LM's usual layout: the first of its preferences whose plan fits (or the
    leanest, when none does)."""
    leanest = None
    dense = search.dense_params()
    for layout in megatron_layout(job.cluster, job.global_batch, num_layers, search.tp_fits, dense):
        layout = replace(layout, rank_order="megatron")  # as Megatron-LM numbers its ranks
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
    layout = spec.for_gpus(job.cluster.size, job.global_batch, spec.flag)
    layout = replace(layout, rank_order=spec.rank_order or job.rank_order)
    try:
        check_given(job, Given(layout))  # `estimate`'s checks: TP within a node, CP, EP
    except InputError as exc:  # "--tp: 16 does not divide ..." -> "TP 16 does not divide ..."
        degree = exc.where.lstrip("-").upper() + " " if exc.message[:1].isdigit() else ""
        raise InputError(spec.flag, f"{layout.describe()}: {degree}{exc.message}") from None
    chunks = spec.chunks if spec.chunks > 1 else None
    try:
        row = search.baseline(layout, spec.schedule, "uniform", chunks)
    except InputError as exc:  # the schedule or the model does not take these degrees
        raise InputError(spec.flag, f"{layout.describe()}: {exc}") from None
    return replace(row, label="given")


def recipe_row(search: LayoutSearch, job: Job) -> Row | None:
    """The published recipe nearest the job (`recipes.py`), planned as its framework runs it:
    its schedule over the uniform partition; None for models without one, or where its degrees
    do not divide the job's GPUs, batch or sequence."""
    recipe = nearest_recipe(job)
    if recipe is None:
        return None
    layout = recipe_layout(job, recipe)
    if layout is None or not search.costs.fits_degrees(layout.tp, layout.cp, layout.ep):
        return None
    schedule, chunks = recipe.plan_schedule
    try:
        row = search.baseline(layout, schedule, "uniform", chunks)
    except InputError:  # the schedule does not take these counts
        return None
    chunked = f"{schedule}{chunks}" if chunks and chunks != 2 else schedule
    return replace(row, label=f"{RECIPE_LABEL}: {chunked}/uniform")
