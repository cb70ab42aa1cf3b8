"""Choosing the parallel degrees: TP x PP x DP, microbatch size and count, for a whole cluster.

    layouts = candidate_layouts(cluster, global_batch=512, num_layers=83, tp_fits=...)
    search = LayoutSearch(job)            # profiles per (TP, microbatch size), cached
    row = search.screen(layout)           # the best of a few baselines: cheap
    row = search.tune(layout, budget)     # the tuner on that layout

A layout fixes TP (inside a node), PP, DP with TP x PP x DP GPUs, and the microbatch size b and
count M with D x M x b = the global batch. Each is planned on the analytic profile of its TP
degree and microbatch size, with the topology `Cluster.replica_topology` gives (which pipeline
devices share a node, the data-parallel ring). ZeRO-1 (optimizer state sharded across DP, as
Megatron-LM's distributed optimizer) is used where a layout does not fit without it. The
reference is Megatron-LM's usual choice for the job (`megatron_layout`). The command that
prints the table is `commands/_plan_cluster.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from octopipe.errors import InputError
from octopipe.layouts.costs import LayoutCosts
from octopipe.layouts.layout import Job, Layout, candidate_layouts
from octopipe.layouts.reference import reference_row
from octopipe.plan import Plan
from octopipe.profile import Profile
from octopipe.sim import SimResult, Simulator
from octopipe.sim.evaluate import plan_rank

SCREEN_BASELINES = (("1f1b", "balanced"), ("zbh1", "balanced"), ("i1f1b", "balanced"))


@dataclass(frozen=True)
class Row:
    """One layout's best plan found, simulated on every replica's devices."""

    layout: Layout
    label: str  # where the plan came from (a baseline's name, or "tuned")
    plan: Plan
    profile: Profile  # replica 0's profile, the plan's
    sim: SimResult  # the slowest replica's result
    tail: float = 0.0  # the optimizer step (and ZeRO-1's all-gather) after the pipeline

    @property
    def step_time(self) -> float:
        """The whole step: the pipeline as simulated, then the tail (`layouts/costs.py`)."""
        return self.sim.iteration_time + self.tail

    def tokens_per_gpu(self, job: Job) -> float:
        return job.tokens / self.step_time / job.cluster.size

    @property
    def score(self) -> tuple[int, float, float]:
        return plan_rank(self.step_time, self.sim.memory_excess_bytes)


class LayoutSearch:
    """Plans layouts of one job; the analytic profiles are built once per (TP, b)."""

    def __init__(self, job: Job, overlap_steps: bool = False, costs: LayoutCosts | None = None):
        self.job = job
        self.overlap_steps = overlap_steps  # rank plans by their steady step time
        self.costs = costs or LayoutCosts(job)  # shared: profiles are built once

    def synchronous(self) -> LayoutSearch:
        """This search ranking by one synchronous step, sharing the profiles built so far."""
        if not self.overlap_steps:
            return self
        return LayoutSearch(self.job, costs=self.costs)

    @property
    def num_layers(self) -> int:
        return self.costs.base_profile(Layout(1, 1, 1, 1, 1)).num_layers

    def tp_fits(self, tp: int) -> bool:
        return self.costs.fits_degrees(tp)

    def profile(self, layout: Layout) -> tuple[Profile, tuple[tuple, ...]]:
        return self.costs.profile(layout)

    # --- evaluating ----------------------------------------------------------------------

    def evaluate(self, layout: Layout, label: str, plan: Plan) -> Row:
        """The plan on every distinct replica; the row holds the slowest replica's result and
        profile (so the profile it is written with reproduces its figures)."""
        profile, replicas = self.profile(layout)
        rows = []
        for devices in replicas:
            on = profile.with_devices(devices)
            result = Simulator(on).run(plan, detail=False, overlap_steps=self.overlap_steps)
            tail = self.costs.tail(layout, plan, on).total
            rows.append(Row(layout, label, plan, on, result, tail))
        return max(rows, key=lambda r: r.score)

    def baselines(self, layout: Layout, names: Iterable[tuple[str, str]]) -> list[Row]:
        from octopipe.baselines import make_baseline

        profile, _ = self.profile(layout)
        rows = []
        for schedule, method in names:
            try:
                plan = make_baseline(profile, schedule, method, layout.pp, layout.num_microbatches)
            except InputError:  # too few microbatches or layers for this schedule
                continue
            rows.append(self.evaluate(layout, f"{schedule}/{method}", plan))
        return rows

    def screen(self, layout: Layout) -> Row | None:
        """The best of a few balanced baselines: a quick estimate of the layout, switching
        to ZeRO-1 when nothing fits without it (at once where the replicated static bytes
        alone exceed the devices' memory)."""
        if layout.dp > 1 and not layout.zero1 and self._static_overflows(layout):
            return self.screen(replace(layout, zero1=True))
        rows = self.baselines(layout, SCREEN_BASELINES)
        best = min(rows, key=lambda r: r.score, default=None)
        if best is not None and not best.sim.fits and layout.dp > 1 and not layout.zero1:
            sharded = self.screen(replace(layout, zero1=True))
            if sharded is not None and sharded.score < best.score:
                return sharded
        return best

    def _static_overflows(self, layout: Layout) -> bool:
        """Whether even an even split of the weights, gradients and optimizer state over the
        pipeline's devices exceeds their memory."""
        profile, _ = self.profile(layout)
        static = sum(layer.param_bytes for layer in profile.layers) / layout.pp
        return static > min(d.memory_bytes for d in profile.device_list())

    def tune(
        self, start: Row, time_budget: float, seed: int = 0, max_chunks: int | None = 4
    ) -> Row:
        """The tuner on `start`'s layout, seeded with `start`'s plan (never worse than it)."""
        from octopipe.tuner import tune as search

        layout = start.layout
        profile, _ = self.profile(layout)
        result = search(
            profile,
            layout.num_microbatches,
            layout.pp,
            max_chunks=max_chunks,
            time_budget=time_budget,
            seed=seed,
            baselines=[(start.label, start.plan)],
            overlap_steps=self.overlap_steps,
        )
        row = self.evaluate(layout, "tuned", result.best.plan)
        return row if row.score <= start.score else start


@dataclass(frozen=True)
class LayoutReport:
    job: Job
    rows: tuple[Row, ...]  # every layout screened, best first (the tuned ones as tuned)
    reference: Row | None  # Megatron-LM's usual layout, simulated the same way
    screened: int
    candidates: int  # layouts enumerated (more than screened when the budget ran out)
    tuned: int
    seconds: float

    @property
    def best(self) -> Row:
        return self.rows[0]


Progress = Callable[[str, float], None]  # (what is being done, fraction of the budget used)


def plan_cluster(
    job: Job,
    *,
    time_budget: float = 60.0,
    finalists: int = 4,
    seed: int = 0,
    max_chunks: int | None = 4,
    progress: Progress | None = None,
    overlap_steps: bool = False,
) -> LayoutReport:
    """Screen every layout with a few baselines, then tune them best first under what is left
    of `time_budget` (seconds, shared by the whole search), each with a `finalists`-th of the
    time left; the Megatron-LM reference row beside them. `overlap_steps`: every plan ranked
    by its steady step time with steps back to back, all-reduces included (docs/FORMATS.md);
    the reference stays synchronous, as Megatron-LM runs it."""
    import time

    started = time.perf_counter()

    def used() -> float:
        return time.perf_counter() - started

    def report(what: str) -> None:
        if progress is not None:
            progress(what, min(1.0, used() / time_budget))

    search = LayoutSearch(job, overlap_steps)
    L = search.num_layers
    layouts = candidate_layouts(job.cluster, job.global_batch, L, search.tp_fits)
    if not layouts:
        raise InputError(
            "--gpus",
            f"no TP x PP x DP layout of {job.cluster.size} GPUs divides the global batch "
            f"{job.global_batch} with at most one stage per layer",
        )
    screen_budget = 0.4 * time_budget  # the rest goes to tuning the best of them
    rows: list[Row] = []
    for i, layout in enumerate(_cheapest_first(layouts)):
        if rows and used() > screen_budget:
            break
        report(f"screening {i + 1}/{len(layouts)}: {layout.describe()}")
        row = search.screen(layout)
        if row is not None:
            rows.append(row)
    screened = len(rows)
    rows.sort(key=lambda r: r.score)
    reference = reference_row(search.synchronous(), job, L)  # Megatron-LM synchronizes
    # Tune in screened order: each layout gets its share of what is left as if only
    # `finalists` remained, and the search goes on down the list while time is left (small
    # problems converge in a fraction of their share).
    tuned = 0
    for k, start in enumerate(list(rows)):
        left = 0.9 * time_budget - used()  # a tenth kept for writing the plan and pictures
        if left <= 0:
            break
        report(f"tuning {k + 1}/{len(rows)}: {start.layout.describe()}")
        rows[k] = search.tune(start, left / min(finalists, len(rows) - k), seed, max_chunks)
        tuned += 1
    rows.sort(key=lambda r: r.score)
    return LayoutReport(job, tuple(rows), reference, screened, len(layouts), tuned, used())


def _cheapest_first(layouts: list[Layout]) -> list[Layout]:
    """Screening order when the budget may run out: fewer simulated actions first."""
    return sorted(layouts, key=lambda l: (l.pp * l.num_microbatches, l.tp))
