"""The layout search of `octopipe plan --gpus`: the best TP x CP x PP x DP (x EP) layout of a
job, its microbatches, recomputation and optimizer sharding, with its tuned plan.

    report = plan_cluster(job)                          # LayoutReport: rows best first
    report.best, report.best_standard                   # the answer, the best standard row
    report.reference, report.recipe, report.given       # the layouts it is set beside

0. **The runner** (`octopipe.engines`): the engine the answer is for keeps the space to the layouts
   it runs (its ZeRO stages, HSDP groups, expert folding) and every plan to those it runs,
   priced as it runs them.
1. **References first.** Megatron-LM's usual layout (`reference.py`), the model's published
   recipe (`recipes.py`) and the user's own (`from_layout`, then tuned) are planned as their
   frameworks run them; each the runner runs is a candidate, so the answer is never slower
   than any of those (the others are shown beside it, `not_runnable`).
2. **Screening, best bound first.** Every layout of the search space (`layout.search_space`)
   gets a lower bound on its step, from its profile alone: its microbatches' work spread
   evenly over its pipeline devices, then the optimizer update of an even share of the
   parameters; and a lower bound on its memory (an even share of the weights, gradients and
   optimizer state, and of one microbatch's activations). Layouts that cannot fit are set
   aside; the others are screened in the order of their bounds until the next bound is no
   better than the best step found (no layout left could beat it, tuned or not): each gets a
   few balanced baselines and the standard schedules over the uniform partition, each of those
   simulated only where its own bound (the busiest device's work) could beat the best standard
   row so far. The fastest standard row of all is `best_standard`: what a careful grid search
   without the tuner finds, and the answer is never slower than it.
3. **Tuning.** The best `finalists` screened layouts are tuned, each with `tune_evaluations`
   evaluations of the tuner at most, and at most TUNE_ACTIONS list-scheduled actions.

With `workers` > 1 (the cores this process may use, by default), the finalists are tuned side
by side on forked workers, and a worker that would idle starts the likeliest polish (4.) early
(`fanout.py`); the answer is the one a single process gives. The screening stays here: its
inner loops run compiled (`octopipe.compiled`), and a worker's rows cost more to send back
than to screen. The cycle collector waits meanwhile (`heap.py`).

The work is counted in layouts screened and tuner evaluations, so the same job gives the same
answer on any machine. `time_budget` is only a safety cap: when it cuts the search, the
report says so (`cut_by_time`) and the answer may differ on a faster machine. One layout's
plans (a baseline, the screening, the tuner, the bounds) are `planner.py`'s, the search's
counts and progress `progress.py`'s; the command that prints the table is
`commands/_plan_cluster.py`.
"""

from __future__ import annotations

import time

from octopipe.engines import DEFAULT_ENGINE, get_engine
from octopipe.errors import InputError
from octopipe.layouts.fanout import (
    default_workers,
)
from octopipe.layouts.heap import collector_paused
from octopipe.layouts.layout import Job, search_space
from octopipe.layouts.phases import ClusterSearch, Tuning
from octopipe.layouts.planner import (
    TUNE_EVALUATIONS,
    LayoutSearch,
    Row,
)
from octopipe.layouts.progress import Progress, SearchProgress, Work
from octopipe.layouts.report import LayoutReport
from octopipe.layouts.spec import LayoutSpec
from octopipe.plan import Plan
from octopipe.plan.shape import JobShape

__all__ = [
    "LayoutReport",
    "LayoutSearch",
    "Row",
    "SearchProgress",
    "plan_cluster",
    "runner_space",
    "written_plan",
]

FINALISTS = 4
DEFAULT_TIME_BUDGET = 600.0  # seconds: a safety cap, not what decides the answer
MAX_SCREENED = 300  # layouts screened at most, best bound first: a bound on the work
SCREEN_ACTIONS = 8_000_000  # and the actions their screening simulates, at most


@collector_paused()
def plan_cluster(
    job: Job,
    *,
    time_budget: float = DEFAULT_TIME_BUDGET,
    finalists: int = FINALISTS,
    tune_evaluations: int = TUNE_EVALUATIONS,
    max_screened: int = MAX_SCREENED,
    screen_actions: int = SCREEN_ACTIONS,
    seed: int = 0,
    max_chunks: int | None = 4,
    progress: Progress | None = None,
    overlap_steps: bool = False,
    from_layout: LayoutSpec | None = None,
    exact: bool = False,
    torchtitan: bool = False,
    runner: str = DEFAULT_ENGINE,
    workers: int | None = None,
) -> LayoutReport:
    """The references, then every layout screened best bound first and the best `finalists`
    tuned (see the module docstring). `overlap_steps`: every plan ranked by its steady step
    time with steps back to back, all-reduces included (docs/FORMATS.md); the Megatron-LM
    reference stays synchronous, as Megatron-LM runs it. `progress` is called with a
    `SearchProgress` as each layout is screened and tuned. `runner`: the engine the answer is
    for (`octopipe.engines`); every candidate is a layout and plan it runs, priced as it runs
    them (the references it cannot run are shown beside, not candidates). `workers`:
    processes the finalists are tuned on (None: the cores this process may use); the answer is
    the same for any. `exact`: `from_layout` is the answer's layout (`plan --layout`): it alone
    is screened and tuned, in its own rank order; the references are planned beside."""
    started = time.perf_counter()
    engine = get_engine(runner)
    if overlap_steps and not engine.overlaps_steps:
        raise InputError("--overlap-steps", f"{engine.title} runs synchronous steps only")
    search = LayoutSearch(job, overlap_steps, torchtitan=torchtitan, runner=engine)
    if (why := engine.refuse_model(search.costs.arch)) is not None:
        raise InputError("--runner", f"{engine.title} cannot train {search.costs.arch.name}: {why}")
    # Only layouts the runner carries out (`octopipe.engines`): an answer is one it can run.
    space = runner_space(search, overlap_steps)
    if not space:
        raise InputError(
            "--gpus",
            f"no TP x CP x PP x DP layout of {job.cluster.size} GPUs divides the global batch "
            f"{search.job.global_batch} with at most one stage per layer",
        )
    if exact and from_layout is None:
        raise ValueError("an exact search needs from_layout, the layout to plan")
    tuning = Tuning(tune_evaluations, seed, max_chunks)
    work = Work(time_budget, progress, finalists)
    phases = ClusterSearch(search, work, tuning, overlap_steps, exact)
    phases.references(from_layout)
    if exact:
        space = [phases.refs["given"].layout]
    phases.screen(space, max_screened, screen_actions)
    phases.tune_finalists(finalists, default_workers() if workers is None else workers)
    return phases.report(len(space), time.perf_counter() - started)


def runner_space(search: LayoutSearch, overlap_steps: bool = False) -> list[JobShape]:
    """Every layout of the search's job its runner runs: `layout.search_space` with the
    runner's ZeRO stages and expert folding, its HSDP variants, less what it refuses."""
    job, costs, engine = search.job, search.costs, search.runner
    arch = costs.arch
    experts = arch.moe.num_experts if arch.moe is not None else 0
    space = search_space(
        job, search.num_layers, costs.fits_degrees, experts, engine.zero_stages, engine.fold_experts
    )
    gpn = job.cluster.gpus_per_node
    space = [v for lay in space for v in engine.variants(lay, gpn)]
    precision = job.stack.precision
    return [lay for lay in space if engine.refuse(lay, arch, overlap_steps, precision) is None]


def written_plan(row: Row) -> Plan:
    """The row's plan as `plan --gpus` writes it: its shape (`parallelism`, docs/FORMATS.md),
    its layer names and predicted figures."""
    plan = row.plan.with_shape(row.layout)
    return plan.with_predicted(row.sim.predicted()).with_layer_names(row.profile.layer_names)
