"""The phases of `plan_cluster` (`search.py`) as one object over one record of rows: 1. the
references (Megatron-LM's layout, the published recipe, the given layout tuned), 2. the
screening best bound first with the standard schedules beside, 3. the finalists tuned on
forked workers, 4. the best tuned layout polished; then the report. The module docstring of
`search.py` says what each phase does and why the answer is the same on any machine.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, replace

from octopipe.engines import Engine
from octopipe.errors import InputError
from octopipe.layouts.fanout import Finalists, Tuned, TuneJob, tune_one
from octopipe.layouts.layout import Job
from octopipe.layouts.margin import leaner_within_error
from octopipe.layouts.planner import POLISH_ACTIONS, SCREEN_BASELINES, LayoutSearch, Row
from octopipe.layouts.progress import Work
from octopipe.layouts.recipes import nearest_recipe
from octopipe.layouts.reference import from_layout_row, recipe_row, reference_row
from octopipe.layouts.report import LayoutReport
from octopipe.layouts.spec import LayoutSpec
from octopipe.plan.shape import RECOMPUTE_KINDS, JobShape


@dataclass(frozen=True)
class Tuning:
    """How much each tuning of a layout may do: the same on any machine."""

    evaluations: int
    seed: int
    max_chunks: int | None

    def job(self, start: Row, seconds_left: float, actions: int | None = None) -> TuneJob:
        return TuneJob(start, self.evaluations, seconds_left, self.seed, self.max_chunks, actions)


class Incumbents:
    """Each layout's best row so far, whether it fits, and the best fitting one of all."""

    def __init__(self) -> None:
        self.best: dict[JobShape, Row] = {}
        self._fits: dict[JobShape, bool] = {}  # asked once per row

    def keep(self, row: Row) -> None:
        if row.layout not in self.best or row.score < self.best[row.layout].score:
            self.best[row.layout] = row
            self._fits[row.layout] = row.sim.fits

    def top(self) -> Row | None:
        """The best fitting row of every layout's best."""
        fitting = (r for layout, r in self.best.items() if self._fits[layout])
        return min(fitting, key=lambda r: r.score, default=None)

    def best_step(self) -> float | None:
        top = self.top()
        return top.step_time if top is not None else None


class ClusterSearch:
    """`plan_cluster`'s phases, in order, over one record of rows: 1. the references (and
    the given layout, tuned), 2. the screening best bound first with the standard schedules
    beside, 3. the finalists tuned, 4. the best tuned layout polished; then the report."""

    def __init__(
        self,
        search: LayoutSearch,
        work: Work,
        tuning: Tuning,
        overlap_steps: bool,
        exact: bool = False,
    ):
        self.search, self.work, self.tuning = search, work, tuning
        # `exact`: only the given layout is a candidate (`plan --layout`); the references are
        # planned for the table, not chosen, and no other rank order is tried.
        self.exact = exact
        self.job = search.job  # with FSDP priced as the runner runs it
        self.overlap_steps = overlap_steps
        self.rows = Incumbents()
        self.refs: dict[str, Row | None] = {}
        self.refused: dict[str, str] = {}  # the references the runner cannot run, and why
        self.tuned_layouts: set[JobShape] = set()
        self.tuned = 0  # tunings that evaluated anything
        self.best_standard: Row | None = None
        self.standard_of: dict[JobShape, Row] = {}  # each layout's best standard-schedule row
        self.screened: set[JobShape] = set()
        self.screen_rows: dict[JobShape, Row] = {}  # each layout's screening plan
        self.unfit = self.pruned = self.skipped = self.screened_in_space = 0
        self.tune_cpu: tuple[float, ...] = ()
        self.workers = 1

    # --- 1. the references, as their frameworks run them; the user's own tuned -------------

    def references(self, from_layout: LayoutSpec | None) -> None:
        search, job, work = self.search, self.job, self.work
        work.say("references", "Megatron-LM's layout and the published recipe", None)
        self.refs = {
            "reference": reference_row(search.synchronous(), job, search.num_layers),
            "recipe": recipe_row(search, job),
            "given": from_layout_row(search, job, from_layout) if from_layout else None,
        }
        arch, engine = search.costs.arch, search.runner
        for name, ref in self.refs.items():
            why = None if ref is None else _refusal(engine, ref, arch, self.overlap_steps)
            if ref is not None and why is None and ref.layout.rank_order not in job.rank_orders:
                why = f"ranks in the {ref.layout.rank_order} order, not --rank-order's"
            if why is not None:
                self.refused[name] = why
        if "given" in self.refused:
            why = self.refused["given"]
            flag = from_layout.flag if from_layout else "--from-layout"
            raise InputError(flag, f"{engine.title} cannot run it: {why}")
        for ref in self.candidates():  # ranked as the search ranks its own plans
            if self.overlap_steps:
                ref = search.evaluate(ref.layout, ref.label, ref.plan)
            self.rows.keep(ref)
        given = self.refs["given"]
        if given is not None:
            start = self.rows.best[given.layout]
            doing = f"the given layout: {given.layout.describe()}"
            work.say("tuning", doing, self.rows.best_step())
            self.tuned += self._tune_here(self.tuning.job(start, work.left())) > 0
            self.tuned_layouts.add(given.layout)

    def runnable(self) -> list[Row]:
        """The references the runner runs."""
        return [r for n, r in self.refs.items() if r is not None and n not in self.refused]

    def candidates(self) -> list[Row]:
        """The references that are candidates like any row: those the runner runs; only the
        given one where the layout is exact."""
        return [self.refs["given"]] if self.exact else self.runnable()

    # --- 2. the screening, best bound first, with the standard schedules beside ----------------

    def screen(self, space: list[JobShape], max_screened: int, screen_actions: int) -> None:
        """Screened here, in one process: a layout's screening costs less than a worker's
        pickled rows did once the inner loops were compiled (BENCHMARKS.md, "Cluster layouts
        ... in seconds"). The references' own layouts first: the best standard row is never
        slower than theirs."""
        work = self.work
        fitting = self._bound_order(space)
        bounds = [b for b, _ in fitting]
        for ref in self.candidates():
            if ref.layout not in self.screened:
                work.say("screening", ref.layout.describe(), self.rows.best_step())
                self._screen_one(ref.layout)
        fits_with: dict[JobShape, str] = {}  # a family's lightest recomputation that fits
        stopped = len(fitting)
        for i, (bound, layout) in enumerate(fitting):
            if layout in self.screened:
                continue  # a reference's, screened first
            family = replace(layout, recompute="none")
            lighter = fits_with.get(family)
            if lighter is not None and _heavier(layout.recompute, lighter):
                self.skipped += 1  # the same plans with more recomputation: slower
                continue
            top = self.rows.top()
            if top is not None and bound >= top.step_time:
                stopped = i
                break
            over = work.screened >= max_screened
            over = over or work.actions + _screen_actions(layout) > screen_actions
            if over or work.out_of_time():
                stopped = i
                work.capped(work.screened, over, _at_most_faster(bound, top))
                break
            work.to_screen = _still_under(bounds, i, top)
            work.say("screening", layout.describe(), self.rows.best_step())
            fits = any(r.sim.fits for r in self._screen_one(layout))
            if fits and family not in fits_with:
                fits_with[family] = layout.recompute
        work.to_screen = 0
        # Every layout of the space is counted once: unfit, screened, skipped or pruned.
        self.pruned = sum(1 for _, lay in fitting[stopped:] if lay not in self.screened)
        self.screened_in_space = sum(1 for _, lay in fitting if lay in self.screened)

    def _bound_order(self, space: list[JobShape]) -> list[tuple[float, JobShape]]:
        """The layouts that may fit, best step bound first (ties broken alike on every run);
        the rest counted as unfit."""
        fitting = []
        for layout in space:
            variants = self._in_every_order(layout)
            if any(self.search.may_fit(v) for v in variants):
                # The bound of the layout in any order: its layers' costs (an EP group's
                # all-to-all inside a node or across) depend on the order.
                bound = min(self.search.step_bound(v) for v in variants)
                fitting.append((bound, _order(layout), layout))
            else:
                self.unfit += 1
        fitting.sort(key=lambda x: (x[0], x[1]))
        return [(bound, layout) for bound, _, layout in fitting]

    def _in_every_order(self, layout: JobShape) -> list[JobShape]:
        """The layout in each rank order the job searches (one where PP or DP is 1: the
        numberings are then one; only its own where the layout is exact)."""
        if layout.pp == 1 or layout.dp == 1 or self.exact:
            return [layout]
        others = [o for o in self.job.rank_orders if o != layout.rank_order]
        return [layout, *(replace(layout, rank_order=o) for o in others)]

    def _screen_one(self, layout: JobShape) -> list[Row]:
        """The layout's screening rows and standard rows, kept; best_standard updated. A
        standard schedule not under the best fitting standard row's step is skipped."""
        began = time.perf_counter()
        top = self.best_standard
        beat = top.step_time if top is not None and top.sim.fits else float("inf")
        row, standard = self.search.screen(layout), self.search.standard(layout, beat)
        if row is not None:
            self.screen_rows[layout] = row
        self.screened.add(layout)
        seconds = time.perf_counter() - began
        simulations = len(SCREEN_BASELINES) + len(standard)
        self.work.did_screen(simulations, _screen_actions(layout), seconds)
        for r in standard:
            self._note_standard(r)
        rows = [r for r in [row, *standard] if r is not None]
        rows += self._other_orders(layout, row, standard)
        for r in rows:
            self.rows.keep(r)
        return rows

    def _other_orders(self, layout: JobShape, row: Row | None, standard: list[Row]) -> list[Row]:
        """The layout's screening plan and its standard plans in each other rank order the job
        searches, evaluated on that order's links (which pipeline hops and which rings cross
        nodes; the best standard schedule of one order need not be the other's): a simulation
        each, no screening of its own, so the screening's work bound counts layouts, not
        orders. The two numberings are one where PP or DP is 1."""
        out = []
        for other in self._in_every_order(layout)[1:]:
            if row is not None:
                out.append(self.search.evaluate(other, row.label, row.plan))
                self.screen_rows.setdefault(other, out[-1])
            for mine in standard:
                moved = self.search.evaluate(other, mine.label, mine.plan)
                out.append(moved)
                self._note_standard(moved)
        return out

    def _note_standard(self, row: Row) -> None:
        """A standard schedule's row: best_standard, and its layout's best standard row."""
        if self.best_standard is None or row.score < self.best_standard.score:
            self.best_standard = row
        mine = self.standard_of.get(row.layout)
        if mine is None or row.score < mine.score:
            self.standard_of[row.layout] = row

    # --- 3. the finalists tuned; 4. the best tuned layout polished ------------------------------

    def tune_finalists(self, finalists: int, workers: int) -> None:
        """Side by side on `workers` forked processes (`fanout.py`): each tuning is its own, so
        the results, taken in the finalists' order, are those of one process tuning them in
        turn; a worker that would idle starts the likeliest polish early."""
        work, rows = self.work, self.rows
        self.workers = workers
        candidates = sorted(
            (r for r in rows.best.values() if r.layout not in self.tuned_layouts),
            key=lambda r: r.score,
        )
        # The best few of each rank order: another order's screened plans take no finalist
        # of the first's (a screening row ranks layouts, not what tuning makes of them).
        per_order = (
            [
                [r for r in candidates if r.layout.rank_order == order][:finalists]
                for order in self.job.rank_orders or (candidates[0].layout.rank_order,)
            ]
            if candidates
            else []
        )
        chosen = sorted((r for rows_of in per_order for r in rows_of), key=lambda r: r.score)
        work.to_tune = work.tuned + len(chosen) + 1  # and the polish
        chosen = [] if work.out_of_time() else chosen
        jobs = [self.tuning.job(r, work.left()) for r in chosen]
        if jobs:
            at_once = min(workers, len(jobs))
            doing = f"{len(jobs)} finalists, {at_once} at a time" if at_once > 1 else ""
            work.say("tuning", doing or jobs[0].start.layout.describe(), rows.best_step())
        pool = Finalists(self.search, jobs, workers)
        try:
            for row, spent, cut, cpu in pool.tune(self._guess):
                work.did_tune(spent, cut, cpu)
                rows.keep(row)
                self.tuned += spent > 0
            top = rows.top()
            if top is not None and top.label == "tuned" and not work.out_of_time():
                doing = f"the best layout further: {top.layout.describe()}"
                work.say("tuning", doing, rows.best_step())
                again = self._polish(top)
                self._tune_here(again, pool.polished(again))
            self.tune_cpu = tuple(pool.cpu)
        finally:
            pool.close()

    def _polish(self, top: Row) -> TuneJob:
        """4.'s tuning of the best tuned plan's layout, from its screening plan."""
        start = self.screen_rows.get(top.layout, top)
        return self.tuning.job(start, self.work.left(), POLISH_ACTIONS)

    def _guess(self, done: list[Tuned]) -> TuneJob | None:
        """The polish 4. would run if the finalists tuned so far (`done`) held the best: a
        worker that would idle starts it early, taken only where 4. asks for this very job."""
        top = self.rows.top()
        for row, *_ in done:  # as `keep` and `top` will rank them
            if row.sim.fits and (top is None or row.score < top.score):
                top = row
        if top is None or top.label != "tuned" or top.layout not in self.screen_rows:
            return None
        return self._polish(top)

    def _tune_here(self, job: TuneJob, done: Tuned | None = None) -> int:
        """Tune `job` in this process (or take `done`, its result from a worker) and keep it;
        the evaluations it made."""
        began = time.perf_counter()
        row, spent, cut, _ = done or tune_one(self.search, job)
        self.work.did_tune(spent, cut, time.perf_counter() - began)
        self.rows.keep(row)
        return spent

    # --- the report -----------------------------------------------------------------------------

    def report(self, candidates: int, seconds: float) -> LayoutReport:
        work, refs = self.work, self.refs
        recipe = refs["recipe"]
        rows = sorted(self.rows.best.values(), key=lambda r: r.score)
        moe = self.search.costs.arch.moe is not None
        standard = self.standard_of.get(rows[0].layout) if rows else None
        rows, why = leaner_within_error(rows, standard, self.job, moe, self.best_standard)
        if why:
            work.notes.append(why)
        return LayoutReport(
            job=self.job,
            rows=tuple(rows),
            reference=refs["reference"],
            screened=work.screened,
            candidates=candidates,
            tuned=self.tuned,
            seconds=seconds,
            given=refs["given"],
            unfit=self.unfit,
            pruned=self.pruned,
            skipped=self.skipped,
            screened_in_space=self.screened_in_space,
            evaluations=work.evaluations,
            cut_by_time=work.cut_by_time,
            notes=tuple(work.notes),
            best_standard=self.best_standard,
            recipe=recipe,
            recipe_source=_recipe_source(self.job) if recipe is not None else "",
            runner=self.search.runner.name,
            not_runnable=tuple(self.refused.items()),
            tune_cpu=self.tune_cpu,
            workers=self.workers,
            exact=self.exact,
        )


def _refusal(engine: Engine, row: Row, arch, overlap_steps: bool) -> str | None:
    """Why the runner cannot run a reference row (its layout, or its plan), or None."""
    precision = row.profile.precision
    return engine.refuse(row.layout, arch, overlap_steps, precision) or engine.refuse_plan(
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


def _at_most_faster(bound: float, top: Row | None) -> float | None:
    """How much faster than the best found a layout left unscreened could be at most: every
    one left is bounded below by `bound`, the lowest of their bounds (None: nothing fits yet,
    so no bound on what was missed)."""
    if top is None:
        return None
    return max(0.0, 1.0 - bound / top.step_time)


def _screen_actions(layout: JobShape) -> int:
    """The actions a layout's screening simulates: its baselines' F, B and W of every
    microbatch on every device."""
    return len(SCREEN_BASELINES) * 3 * layout.pp * layout.num_microbatches


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
