"""The layout search of `octopipe plan --gpus`: the best TP x CP x PP x DP (x EP) layout of a
job, its microbatches, recomputation and optimizer sharding, with its tuned plan.

    report = plan_cluster(job)                          # LayoutReport: rows best first
    report.best, report.reference                       # the answer, Megatron-LM's layout

1. **References first.** Megatron-LM's usual layout (`reference.py`) and the user's own
   (`from_layout`) are planned as their frameworks run them and tuned; the answer is never
   slower than the best of them.
2. **Screening, best bound first.** Every layout of the search space (`layout.search_space`)
   gets a lower bound on its step, from its profile alone: its microbatches' work spread
   evenly over its pipeline devices, then the optimizer update of an even share of the
   parameters; and a lower bound on its memory (an even share of the weights, gradients and
   optimizer state, and of one microbatch's activations). Layouts that cannot fit are set
   aside; the others are screened (the best of a few balanced baselines, simulated) in the
   order of their bounds until the next bound is no better than the best step found: no layout
   left could beat it, tuned or not.
3. **Tuning.** The best `finalists` screened layouts are tuned, each with `tune_evaluations`
   evaluations of the tuner.

The work is counted in layouts screened and tuner evaluations, so the same job gives the same
answer on any machine. `time_budget` is only a safety cap: when it cuts the search, the
report says so (`cut_by_time`) and the answer may differ on a faster machine. A Row's step is
the pipeline simulated on every distinct replica (the slowest), then the optimizer step
(`costs.py`). The command that prints the table is `commands/_plan_cluster.py`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from octopipe.errors import InputError
from octopipe.layouts.costs import LayoutCosts, optimizer_seconds
from octopipe.layouts.layout import RECOMPUTE_ORDER, Job, Layout, search_space
from octopipe.layouts.reference import from_layout_row, reference_row
from octopipe.layouts.spec import LayoutSpec
from octopipe.plan import Plan
from octopipe.profile import Profile
from octopipe.schedules import ScheduleSpec, generate
from octopipe.sim import SimResult, Simulator
from octopipe.sim.evaluate import plan_rank

# ZB-H1 (1F1B's memory, a third of its bubble) and interleaved 1F1B, both balanced: a layout's
# screening estimate. The tuner then finds better plans for the best few.
SCREEN_BASELINES = (("zbh1", "balanced", None), ("i1f1b", "balanced", None))
FINALISTS = 4
TUNE_EVALUATIONS = 1500  # the tuner's evaluations per tuned layout, at most
# What one tuning may list-schedule in all: big pipelines get fewer evaluations (each schedules
# stages x microbatches x 3 actions); one that would get fewer than MIN_TUNE_EVALUATIONS keeps
# its screened plan (the tuner's seeds alone take more).
TUNE_ACTIONS = 4_000_000
MIN_TUNE_EVALUATIONS = 20
MAX_SCREENED = 300  # layouts screened at most, best bound first: a bound on the work
SCREEN_ACTIONS = 8_000_000  # and the actions their screening simulates, at most


@dataclass(frozen=True)
class Row:
    """One layout's best plan found, simulated on every replica's devices."""

    layout: Layout
    label: str  # where the plan came from (a baseline's name, "tuned", "Megatron-LM")
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

    @property
    def peak_memory_bytes(self) -> float:
        return max(self.sim.peak_memory_bytes)

    @property
    def memory_lacking_bytes(self) -> float:
        return max(self.sim.memory_excess_bytes)

    def summary(self) -> dict:
        """The row as `plan --gpus --json` puts it on its last line."""
        return {
            **self.layout.degrees(),
            "step_time": self.step_time,
            "peak_memory_bytes": self.peak_memory_bytes,
            "fits": self.sim.fits,
            "plan": self.label,
        }


class LayoutSearch:
    """Plans layouts of one job on the shared cost model (`LayoutCosts`)."""

    def __init__(
        self,
        job: Job,
        overlap_steps: bool = False,
        costs: LayoutCosts | None = None,
        torchtitan: bool = False,
    ):
        self.job = job
        self.overlap_steps = overlap_steps  # rank plans by their steady step time
        self.torchtitan = torchtitan  # only placements torchtitan builds itself
        self.costs = costs or LayoutCosts(job)  # shared: profiles are built once
        self._schedules: dict[tuple, ScheduleSpec] = {}  # generated orders, by their counts

    def synchronous(self) -> LayoutSearch:
        """This search ranking by one synchronous step, sharing the profiles built so far."""
        if not self.overlap_steps:
            return self
        twin = LayoutSearch(self.job, costs=self.costs, torchtitan=self.torchtitan)
        twin._schedules = self._schedules
        return twin

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
            # check=False: the plans evaluated here are built by generators and the tuner.
            result = Simulator(on).run(
                plan, detail=False, check=False, overlap_steps=self.overlap_steps
            )
            tail = self.costs.tail(layout, plan, on).total
            rows.append(Row(layout, label, plan, on, result, tail))
        return max(rows, key=lambda r: r.score)

    def baseline(self, layout: Layout, schedule: str, method: str, chunks: int | None) -> Row:
        """One named schedule over one partitioner (InputError when the counts do not allow
        it); the schedule's orders are generated once for every layout of the same counts."""
        from octopipe.baselines import baseline_plan

        key = (schedule, layout.pp, layout.num_microbatches, chunks)
        if key not in self._schedules:
            self._schedules[key] = generate(schedule, *key[1:])
        profile, _ = self.profile(layout)
        plan = baseline_plan(profile, self._schedules[key], method, layout.num_microbatches)
        row = self.evaluate(layout, f"{schedule}/{method}", plan)
        return replace(row, plan=plan.with_predicted(row.sim.predicted()))

    def baselines(self, layout: Layout, names: Iterable[tuple[str, str, int | None]]) -> list[Row]:
        """The named plans the layout's counts allow."""
        rows = []
        for schedule, method, chunks in names:
            try:
                rows.append(self.baseline(layout, schedule, method, chunks))
            except InputError:  # too few microbatches or layers for this schedule
                continue
        return rows

    def screen(self, layout: Layout) -> Row | None:
        """The best of a few balanced baselines: a quick estimate of the layout."""
        return min(self.baselines(layout, SCREEN_BASELINES), key=lambda r: r.score, default=None)

    def tune(
        self,
        start: Row,
        evaluations: int = TUNE_EVALUATIONS,
        time_budget: float = float("inf"),
        seed: int = 0,
        max_chunks: int | None = 4,
    ) -> tuple[Row, int, bool]:
        """The tuner on `start`'s layout, seeded with `start`'s plan (never worse than it),
        for `evaluations` evaluations (or `time_budget` seconds, whichever ends first); the
        evaluations it made, and whether the seconds ended it."""
        from octopipe.tuner import tune as search

        layout = start.layout
        profile, _ = self.profile(layout)
        # Each evaluation list-schedules every action of the plan: a bound on the actions.
        actions = 3 * start.plan.num_stages * layout.num_microbatches
        evaluations = min(evaluations, TUNE_ACTIONS // actions)
        if evaluations < MIN_TUNE_EVALUATIONS:
            return start, 0, False
        result = search(
            profile,
            layout.num_microbatches,
            layout.pp,
            max_chunks=max_chunks,
            time_budget=time_budget,
            max_evaluations=evaluations,
            seed=seed,
            baselines=[(start.label, start.plan)],
            overlap_steps=self.overlap_steps,
            torchtitan=self.torchtitan,
        )
        row = self.evaluate(layout, "tuned", result.best.plan)
        best = row if row.score <= start.score else start
        return best, result.evaluations, result.cut_by_time

    # --- bounds --------------------------------------------------------------------------

    def step_bound(self, layout: Layout) -> float:
        """No plan of `layout` steps faster: its work spread evenly over its pipeline devices
        (at the fastest device's speed), then the optimizer update of an even share of the
        parameters."""
        profile, _ = self.profile(layout)
        work = sum(layer.work for layer in profile.layers) * layout.num_microbatches
        fastest = max(d.speed for d in profile.device_list())
        params = sum(e.params for e in self.costs.layers(layout)) / layout.pp
        s = self.costs.settings(layout)
        shards = layout.dp * layout.cp if layout.zero1 else 1
        update = optimizer_seconds(
            params / shards, s.grad_bytes, s.weight_bytes, self.costs.hardware()
        )
        return work / (layout.pp * fastest) + update / fastest

    def memory_bound(self, layout: Layout) -> float:
        """No plan of `layout` needs less on its fullest device: an even share of the static
        bytes and of one microbatch's activations."""
        profile, _ = self.profile(layout)
        static = sum(layer.param_bytes for layer in profile.layers)
        one = sum(layer.act_bytes for layer in profile.layers)
        return (static + one) / layout.pp

    def capacity(self) -> float:
        """What a plan may use of the smallest GPU's memory."""
        smallest = min(g.hardware.memory_bytes for g in self.job.cluster.groups)
        return smallest * (1.0 - self.job.memory_headroom)


@dataclass(frozen=True)
class LayoutReport:
    job: Job
    rows: tuple[Row, ...]  # every layout planned, best first (the tuned ones as tuned)
    reference: Row | None  # Megatron-LM's usual layout, planned as Megatron-LM runs it
    screened: int  # layouts simulated (references included)
    candidates: int  # layouts of the search space
    tuned: int
    seconds: float
    given: Row | None = None  # the user's --from-layout, planned as `estimate` plans it
    unfit: int = 0  # layouts set aside: their memory bound exceeds the GPUs'
    pruned: int = 0  # layouts never screened: their step bound could not beat the answer
    evaluations: int = 0  # layouts screened x their baselines, plus the tuner's evaluations
    cut_by_time: bool = False  # the time budget cut the search: the answer is machine-bound
    notes: tuple[str, ...] = field(default=())

    @property
    def best(self) -> Row:
        return self.rows[0]


Progress = Callable[[str, float], None]  # (what is being done, fraction of the work done)


def plan_cluster(
    job: Job,
    *,
    time_budget: float = 600.0,
    finalists: int = FINALISTS,
    tune_evaluations: int = TUNE_EVALUATIONS,
    max_screened: int = MAX_SCREENED,
    screen_actions: int = SCREEN_ACTIONS,
    seed: int = 0,
    max_chunks: int | None = 4,
    progress: Progress | None = None,
    overlap_steps: bool = False,
    from_layout: LayoutSpec | None = None,
    torchtitan: bool = False,
) -> LayoutReport:
    """The references, planned and tuned; then every layout screened best bound first and the
    best `finalists` tuned (see the module docstring). `overlap_steps`: every plan ranked by its
    steady step time with steps back to back, all-reduces included (docs/FORMATS.md); the
    Megatron-LM reference stays synchronous, as Megatron-LM runs it."""
    started = time.perf_counter()
    search = LayoutSearch(job, overlap_steps, torchtitan=torchtitan)
    L = search.num_layers
    experts = search.costs.arch.moe.num_experts if search.costs.arch.moe is not None else 0
    space = search_space(job, L, search.costs.fits_degrees, experts)
    if not space:
        raise InputError(
            "--gpus",
            f"no TP x CP x PP x DP layout of {job.cluster.size} GPUs divides the global batch "
            f"{job.global_batch} with at most one stage per layer",
        )
    work = _Work(started, time_budget, progress, max_screened + 2 + finalists)
    rows: list[Row] = []

    # 1. The references, as their frameworks run them, then tuned.
    reference = reference_row(search.synchronous(), job, L)  # Megatron-LM synchronizes
    given = from_layout_row(search, job, from_layout) if from_layout is not None else None
    references = [r for r in (reference, given) if r is not None]
    tuned = 0
    for start in references:
        if overlap_steps:  # rank it as the search ranks its own plans
            start = search.evaluate(start.layout, start.label, start.plan)
        work.say(f"tuning the {start.label} layout: {start.layout.describe()}")
        row, spent, cut = search.tune(start, tune_evaluations, work.left(), seed, max_chunks)
        work.tuner(spent, cut)
        rows.append(row)
        tuned += spent > 0

    # 2. Screening, best bound first.
    capacity = search.capacity()
    fitting, unfit = [], 0
    for layout in space:
        if search.memory_bound(layout) > capacity:
            unfit += 1
        else:
            fitting.append((search.step_bound(layout), _order(layout), layout))
    fitting.sort(key=lambda x: (x[0], x[1]))
    done = {r.layout for r in rows}
    fits_with: dict[Layout, str] = {}  # a family's lightest recomputation that fits
    screened, pruned = 0, 0
    for i, (bound, _, layout) in enumerate(fitting):
        family = replace(layout, recompute="none")
        lighter = fits_with.get(family)
        if layout in done or (lighter is not None and _heavier(layout.recompute, lighter)):
            continue  # the same plans with more recomputation: slower
        incumbent = min((r for r in rows if r.sim.fits), key=lambda r: r.score, default=None)
        if incumbent is not None and bound >= incumbent.step_time:
            pruned = len(fitting) - i
            break
        simulated = len(SCREEN_BASELINES) * 3 * layout.pp * layout.num_microbatches
        over = screened >= max_screened or work.actions + simulated > screen_actions
        if over or work.out_of_time():
            pruned = len(fitting) - i
            work.capped(screened, over)
            break
        work.say(f"screening {screened + 1} (bound {bound:.3g} s): {layout.describe()}")
        row = search.screen(layout)
        screened += 1
        work.screened(len(SCREEN_BASELINES), simulated)
        if row is not None:
            rows.append(row)
            if row.sim.fits and family not in fits_with:
                fits_with[family] = layout.recompute

    # 3. Tuning the best of them.
    candidates = sorted((r for r in rows if r.label != "tuned"), key=lambda r: r.score)
    for start in candidates[:finalists]:
        if work.out_of_time():
            break
        work.say(f"tuning {start.layout.describe()}")
        row, spent, cut = search.tune(start, tune_evaluations, work.left(), seed, max_chunks)
        work.tuner(spent, cut)
        rows[rows.index(start)] = row
        tuned += spent > 0
    rows.sort(key=lambda r: r.score)
    return LayoutReport(
        job=job,
        rows=tuple(rows),
        reference=reference,
        screened=screened + len(references),
        candidates=len(space),
        tuned=tuned,
        seconds=time.perf_counter() - started,
        given=given,
        unfit=unfit,
        pruned=pruned,
        evaluations=work.evaluations,
        cut_by_time=work.cut_by_time,
        notes=tuple(work.notes),
    )


def _heavier(recompute: str, than: str) -> bool:
    return RECOMPUTE_ORDER.index(recompute) > RECOMPUTE_ORDER.index(than)


def _order(layout: Layout) -> tuple:
    """Ties of the bound broken alike on every run: fewer devices and less recomputation,
    unsharded, smaller degrees first."""
    return (
        layout.pp,
        RECOMPUTE_ORDER.index(layout.recompute),
        layout.zero1,
        layout.tp,
        layout.cp,
        layout.ep,
        layout.microbatch_size,
    )


class _Work:
    """The search's progress, its safety cap in seconds, and what cut it short."""

    def __init__(self, started: float, budget: float, progress: Progress | None, total: int):
        self.started, self.budget, self.progress = started, budget, progress
        self.total, self.done = max(1, total), 0
        self.evaluations = 0  # simulated baselines and the tuner's evaluations
        self.actions = 0  # the actions screening simulated
        self.cut_by_time = False
        self.notes: list[str] = []

    def left(self) -> float:
        return max(0.0, self.budget - (time.perf_counter() - self.started))

    def out_of_time(self) -> bool:
        if self.left() <= 0:
            if not self.cut_by_time:
                self.notes.append(
                    f"the --time-budget of {self.budget:g} s cut the search: the answer may "
                    "differ on a faster machine"
                )
            self.cut_by_time = True
        return self.cut_by_time

    def tuner(self, evaluations: int, cut: bool) -> None:
        self.done += 1
        self.evaluations += evaluations
        if cut:
            self.out_of_time()  # the tuner found the seconds gone: say so once
            self.cut_by_time = True

    def screened(self, simulations: int, actions: int) -> None:
        self.done += 1
        self.evaluations += simulations
        self.actions += actions

    def capped(self, screened: int, by_count: bool) -> None:
        if by_count:
            self.notes.append(
                f"screened the {screened} layouts of best bound (the screening's work bound); "
                "the rest were left out"
            )

    def say(self, what: str) -> None:
        if self.progress is not None:
            self.progress(what, min(1.0, self.done / self.total))
