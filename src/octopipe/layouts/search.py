"""The layout search of `octopipe plan --gpus`: the best TP x CP x PP x DP (x EP) layout of a
job, its microbatches, recomputation and optimizer sharding, with its tuned plan.

    report = plan_cluster(job)                          # LayoutReport: rows best first
    report.best, report.best_standard                   # the answer, the best standard row
    report.reference, report.recipe, report.given       # the layouts it is set beside

0. **The runner** (`runners.py`): the engine the answer is for keeps the space to the layouts
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

import bisect
import time
from dataclasses import replace

from octopipe.errors import InputError
from octopipe.layouts.fanout import (
    Finalists,
    Tuned,
    TuneJob,
    default_workers,
    tune_one,
)
from octopipe.layouts.heap import collector_paused
from octopipe.layouts.layout import Job, search_space
from octopipe.layouts.planner import (
    POLISH_ACTIONS,
    SCREEN_BASELINES,
    TUNE_EVALUATIONS,
    LayoutSearch,
    Row,
)
from octopipe.layouts.progress import Progress, SearchProgress, Work
from octopipe.layouts.recipes import nearest_recipe
from octopipe.layouts.reference import from_layout_row, recipe_row, reference_row
from octopipe.layouts.report import LayoutReport
from octopipe.layouts.runners import DEFAULT_RUNNER, Runner, get_runner
from octopipe.layouts.spec import LayoutSpec
from octopipe.plan import Plan
from octopipe.plan.shape import RECOMPUTE_KINDS, JobShape

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
MAX_SCREENED = 300  # layouts screened at most, best bound first: a bound on the work
SCREEN_ACTIONS = 8_000_000  # and the actions their screening simulates, at most


@collector_paused()
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
    runner: str = DEFAULT_RUNNER,
    workers: int | None = None,
) -> LayoutReport:
    """The references, then every layout screened best bound first and the best `finalists`
    tuned (see the module docstring). `overlap_steps`: every plan ranked by its steady step
    time with steps back to back, all-reduces included (docs/FORMATS.md); the Megatron-LM
    reference stays synchronous, as Megatron-LM runs it. `progress` is called with a
    `SearchProgress` as each layout is screened and tuned. `runner`: the engine the answer is
    for (`runners.py`); every candidate is a layout and plan it runs, priced as it runs them
    (the references it cannot run are shown beside, not candidates). `workers`:
    processes the finalists are tuned on (None: the cores this process may use); the answer is
    the same for any."""
    started = time.perf_counter()
    engine = get_runner(runner)
    if overlap_steps and not engine.overlaps_steps:
        raise InputError("--overlap-steps", f"{engine.engine} runs synchronous steps only")
    search = LayoutSearch(job, overlap_steps, torchtitan=torchtitan, runner=engine)
    job = search.job  # with FSDP priced as the runner runs it
    L, arch = search.num_layers, search.costs.arch
    # Only layouts the runner carries out (`runners.py`): an answer is one it can run.
    space = runner_space(search, overlap_steps)
    if not space:
        raise InputError(
            "--gpus",
            f"no TP x CP x PP x DP layout of {job.cluster.size} GPUs divides the global batch "
            f"{job.global_batch} with at most one stage per layer",
        )
    work = Work(time_budget, progress, finalists)
    workers = default_workers() if workers is None else workers
    best: dict[JobShape, Row] = {}  # each layout's best row so far

    fits: dict[JobShape, bool] = {}  # whether each layout's best row fits, asked once per row

    def keep(row: Row) -> None:
        if row.layout not in best or row.score < best[row.layout].score:
            best[row.layout] = row
            fits[row.layout] = row.sim.fits

    def incumbent() -> Row | None:
        fitting_rows = (r for layout, r in best.items() if fits[layout])
        return min(fitting_rows, key=lambda r: r.score, default=None)

    def best_step() -> float | None:
        top = incumbent()
        return top.step_time if top is not None else None

    # 1. The references, as their frameworks run them; the user's own is tuned.
    work.say("references", "Megatron-LM's layout and the published recipe", None)
    reference = reference_row(search.synchronous(), job, L)  # Megatron-LM synchronizes
    recipe = recipe_row(search, job)
    given = from_layout_row(search, job, from_layout) if from_layout is not None else None
    tuned_layouts: set[JobShape] = set()
    tuned = 0
    refused = {
        name: why
        for name, ref in (("reference", reference), ("recipe", recipe), ("given", given))
        if ref is not None and (why := _refusal(engine, ref, arch, overlap_steps)) is not None
    }
    if "given" in refused:
        raise InputError("--from-layout", f"{engine.engine} cannot run it: {refused['given']}")
    runnable = [r for n, r in (("reference", reference), ("recipe", recipe), ("given", given))
                if r is not None and n not in refused]  # fmt: skip
    for ref in runnable:  # ranked as the search ranks its own plans
        keep(search.evaluate(ref.layout, ref.label, ref.plan) if overlap_steps else ref)
    if given is not None:
        start = best[given.layout]
        work.say("tuning", f"the given layout: {given.layout.describe()}", best_step())
        began = time.perf_counter()
        row, spent, cut = search.tune(start, tune_evaluations, work.left(), seed, max_chunks)
        work.did_tune(spent, cut, time.perf_counter() - began)
        keep(row)
        tuned_layouts.add(given.layout)
        tuned += spent > 0

    # 2. Screening, best bound first, with the standard schedules beside.
    fitting, unfit = [], 0
    for layout in space:
        if not search.may_fit(layout):
            unfit += 1
        else:
            fitting.append((search.step_bound(layout), _order(layout), layout))
    fitting.sort(key=lambda x: (x[0], x[1]))
    bounds = [b for b, _, _ in fitting]
    fits_with: dict[JobShape, str] = {}  # a family's lightest recomputation that fits
    best_standard: Row | None = None
    done: set[JobShape] = set()
    screen_rows: dict[JobShape, Row] = {}  # each layout's screening plan (balanced baselines)

    def beat() -> float:
        """The best fitting standard row's step: a standard schedule not under it is skipped."""
        fitting_standard = best_standard is not None and best_standard.sim.fits
        return best_standard.step_time if fitting_standard else float("inf")

    def screen(layout: JobShape, simulated: int) -> list[Row]:
        """The layout's screening rows and standard rows, kept; best_standard updated."""
        nonlocal best_standard
        began = time.perf_counter()
        row, standard = search.screen(layout), search.standard(layout, beat())
        if row is not None:
            screen_rows[layout] = row
        done.add(layout)
        work.did_screen(
            len(SCREEN_BASELINES) + len(standard), simulated, time.perf_counter() - began
        )
        for r in standard:
            if best_standard is None or r.score < best_standard.score:
                best_standard = r
        rows = [r for r in [row, *standard] if r is not None]
        for r in rows:
            keep(r)
        return rows

    # Screened here, in one process: a layout's screening costs less than a worker's pickled
    # rows did once the inner loops were compiled (BENCHMARKS.md, "Cluster layouts ... in
    # seconds").
    pruned = 0
    # The references' own layouts first: the best standard row is never slower than theirs.
    for ref in runnable:
        if ref.layout not in done:
            work.say("screening", ref.layout.describe(), best_step())
            screen(
                ref.layout,
                len(SCREEN_BASELINES) * 3 * ref.layout.pp * ref.layout.num_microbatches,
            )
    for i, (bound, _, layout) in enumerate(fitting):
        family = replace(layout, recompute="none")
        lighter = fits_with.get(family)
        if layout in done or lighter is not None and _heavier(layout.recompute, lighter):
            continue  # screened, or the same plans with more recomputation: slower
        top = incumbent()
        if top is not None and bound >= top.step_time:
            pruned = len(fitting) - i
            break
        simulated = len(SCREEN_BASELINES) * 3 * layout.pp * layout.num_microbatches
        over = work.screened >= max_screened or work.actions + simulated > screen_actions
        if over or work.out_of_time():
            pruned = len(fitting) - i
            work.capped(work.screened, over)
            break
        work.to_screen = _still_under(bounds, i, top)
        work.say("screening", layout.describe(), best_step())
        if any(r.sim.fits for r in screen(layout, simulated)) and family not in fits_with:
            fits_with[family] = layout.recompute
    work.to_screen = 0

    # 3. Tuning the best of them.
    candidates = sorted(
        (r for r in best.values() if r.layout not in tuned_layouts), key=lambda r: r.score
    )
    work.to_tune = work.tuned + min(finalists, len(candidates)) + 1  # and the polish
    # Side by side on `workers` forked processes (`fanout.py`): each tuning is its own, so the
    # results, taken in the finalists' order, are those of one process tuning them in turn.
    chosen = [] if work.out_of_time() else candidates[:finalists]
    jobs = [TuneJob(r, tune_evaluations, work.left(), seed, max_chunks) for r in chosen]
    if jobs:
        at_once = min(workers, len(jobs))
        doing = f"{len(jobs)} finalists, {at_once} at a time" if at_once > 1 else ""
        work.say("tuning", doing or jobs[0].start.layout.describe(), best_step())

    def polish(top: Row) -> TuneJob:
        """4.'s tuning of the best tuned plan's layout, from its screening plan."""
        start = screen_rows.get(top.layout, top)
        return TuneJob(start, tune_evaluations, work.left(), seed, max_chunks, POLISH_ACTIONS)

    def guess(done: list[Tuned]) -> TuneJob | None:
        """The polish 4. would run if the finalists tuned so far (`done`) held the best: a
        worker that would idle starts it early, taken only where 4. asks for this very job."""
        top = incumbent()
        for row, *_ in done:  # as `keep` and `incumbent` will rank them
            if row.sim.fits and (top is None or row.score < top.score):
                top = row
        if top is None or top.label != "tuned" or top.layout not in screen_rows:
            return None
        return polish(top)

    pool = Finalists(search, jobs, workers)
    try:
        for row, spent, cut, cpu in pool.tune(guess):
            work.did_tune(spent, cut, cpu)
            keep(row)
            tuned += spent > 0
        # 4. The best tuned plan's layout, tuned again from its screening plan with more work.
        top = incumbent()
        if top is not None and top.label == "tuned" and not work.out_of_time():
            work.say("tuning", f"the best layout further: {top.layout.describe()}", best_step())
            began = time.perf_counter()
            again = polish(top)
            row, spent, cut, _ = pool.polished(again) or tune_one(search, again)
            work.did_tune(spent, cut, time.perf_counter() - began)
            keep(row)
        tune_cpu = pool.cpu
    finally:
        pool.close()
    rows = sorted(best.values(), key=lambda r: r.score)
    return LayoutReport(
        job=job,
        rows=tuple(rows),
        reference=reference,
        screened=work.screened,
        candidates=len(space),
        tuned=tuned,
        seconds=time.perf_counter() - started,
        given=given,
        unfit=unfit,
        pruned=pruned,
        evaluations=work.evaluations,
        cut_by_time=work.cut_by_time,
        notes=tuple(work.notes),
        best_standard=best_standard,
        recipe=recipe,
        recipe_source=_recipe_source(job) if recipe is not None else "",
        runner=runner,
        not_runnable=tuple(refused.items()),
        tune_cpu=tuple(tune_cpu),
        workers=workers,
    )


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
    space = [v for lay in space for v in engine.layouts(lay, gpn)]
    return [lay for lay in space if engine.layout_refusal(lay, arch, overlap_steps) is None]


def written_plan(row: Row) -> Plan:
    """The row's plan as `plan --gpus` writes it: its shape (`parallelism`, docs/FORMATS.md),
    its layer names and predicted figures."""
    plan = row.plan.with_shape(row.layout)
    return plan.with_predicted(row.sim.predicted()).with_layer_names(row.profile.layer_names)


def _refusal(engine: Runner, row: Row, arch, overlap_steps: bool) -> str | None:
    """Why the runner cannot run a reference row (its layout, or its plan), or None."""
    return engine.layout_refusal(row.layout, arch, overlap_steps) or engine.plan_refusal(
        row.plan, row.layout
    )


def _recipe_source(job: Job) -> str:
    found = nearest_recipe(job)
    return found.describe() if found is not None else ""


def _still_under(bounds: list[float], i: int, top: Row | None) -> int:
    """Layouts from the i-th on whose bound is under the best step: those left to screen, at
    most (a better step found later prunes more)."""
    if top is None:
        return len(bounds) - i
    return bisect.bisect_left(bounds, top.step_time, lo=i) - i


def _heavier(recompute: str, than: str) -> bool:
    return RECOMPUTE_KINDS.index(recompute) > RECOMPUTE_KINDS.index(than)


def _order(layout: JobShape) -> tuple:
    """Ties of the bound broken alike on every run: fewer devices and less recomputation,
    unsharded, smaller degrees first."""
    return (
        layout.pp,
        RECOMPUTE_KINDS.index(layout.recompute),
        layout.zero,
        layout.shard_group,
        layout.tp,
        layout.cp,
        layout.ep,
        layout.microbatch_size,
    )
