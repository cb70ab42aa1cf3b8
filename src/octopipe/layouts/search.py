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
report says so (`cut_by_time`) and the answer may differ on a faster machine. One layout's
plans (a baseline, the screening, the tuner, the bounds) are `planner.py`'s; the command that
prints the table is `commands/_plan_cluster.py`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from octopipe.errors import InputError
from octopipe.layouts.layout import RECOMPUTE_ORDER, Job, Layout, search_space
from octopipe.layouts.planner import SCREEN_BASELINES, TUNE_EVALUATIONS, LayoutSearch, Row
from octopipe.layouts.reference import from_layout_row, reference_row
from octopipe.layouts.spec import LayoutSpec

__all__ = ["LayoutReport", "LayoutSearch", "Row", "plan_cluster"]

FINALISTS = 4
MAX_SCREENED = 300  # layouts screened at most, best bound first: a bound on the work
SCREEN_ACTIONS = 8_000_000  # and the actions their screening simulates, at most


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
