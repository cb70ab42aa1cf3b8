"""The tuner's local search: one run's state (best outcomes, cache, clock, progress) and its
walk from seeds through rule variants to iterated descents from a few distinct starts.

`Search.run` evaluates the seeds, varies the scheduling rules of the best few, then descends
from up to `starts` distinct placements, taking the first of `moves.neighbours` that improves
and kicking at local optima. The phases of `search.tune` each call `run` with their own seeds
and work bound; this module does not know which phase is running.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable

from octopipe.tuner.candidate import Candidate, Evaluator, Outcome
from octopipe.tuner.moves import device_moves, diagnose, kick, neighbours, recompute_moves

Progress = Callable[[float, float], None]  # (best iteration time so far, seconds elapsed)

RULE_VARIANTS = (
    {"warmup": 1.0},
    {"warmup": 2.0},
    {"warmup": 3.0},
    {"split_backward": False, "warmup": 1.0},
    {"oldest_first": False},
    {"warmup": 0.01, "defer_w": False},  # lean: one microbatch in flight per stage
)
OVERLAP_WARMUPS = (1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0)
REFINE_STEPS = (0.25, 0.015)  # overlapped steps: the warm-up's first and smallest refinement
SEEDS_TO_VARY = 4
STARTS = 5
KICKS = 3


class Search:
    """The mutable state of one tuning run: best outcomes so far, clock and progress."""

    def __init__(
        self,
        evaluator: Evaluator,
        budget: float,
        seed: int,
        progress: Progress | None,
        allowed: Callable[[tuple[int, ...]], bool],
        max_evaluations: int | None = None,
    ):
        self.evaluator, self.budget, self.seed, self.progress = evaluator, budget, seed, progress
        self.rng = random.Random(seed)  # the kicks'; each `run` starts it afresh
        self.allowed = allowed  # which placements the search may visit
        self.max_evaluations = max_evaluations
        self.started = time.perf_counter()
        self.seen: dict[Candidate, Outcome] = {}
        self.best: Outcome | None = None
        self.converged = False  # every local search ran to its end within the budget
        self.time_cut = False  # the seconds ran out while evaluations were left
        self.work_limit = math.inf  # the running phase's own bound on `evaluator.work`
        self.recomputing = False  # recomputation moves in every descent (`recompute.py`)

    @property
    def deadline(self) -> float:
        """When the budget runs out, as a `time.perf_counter()` value."""
        return self.started + self.budget

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def out_of_time(self) -> bool:
        """Whether the search must stop: its evaluations spent (the same on every machine),
        or, first, its seconds (then the result depends on the machine: `time_cut`)."""
        if self.max_evaluations is not None and self.evaluator.evaluations >= self.max_evaluations:
            return True
        if self.elapsed() >= self.budget:
            self.time_cut = True
            return True
        return False

    def phase_spent(self) -> bool:
        """Whether the running phase has done the work it may (a rule of the search, not a
        budget: it ends the phase the same way on every machine)."""
        return self.evaluator.work >= self.work_limit

    def evaluate(self, cand: Candidate, give_up_after: float = math.inf) -> Outcome | None:
        """The candidate's outcome (cached), or None if it takes longer than `give_up_after`."""
        if cand in self.seen:
            out = self.seen[cand]
            return out if out.makespan <= give_up_after else None
        out = self.evaluator.evaluate(cand, give_up_after)
        if out is not None:  # abandoned runs are not cached: a later cutoff may be looser
            self.seen[cand] = out
            if self.best is None or out.score < self.best.score:
                self.best = out
        if self.progress and self.best is not None:
            self.progress(self.best.makespan, self.elapsed())
        return out

    def variants(self, cand: Candidate) -> list[dict]:
        """The rule changes tried on a seed; with data parallelism also the other W order, with
        overlapped steps a finer scan of warm-up depths (the steady state is sensitive to it:
        deeper warm-ups fill the next step's fill with this step's work) with and without the
        W kept for the step's end."""
        extra = [{"reduce_early": not cand.reduce_early}] if self.evaluator.data_parallel else []
        if self.evaluator.overlap_simulator is not None:
            tails = (cand.tail_w, tuple(0 for _ in cand.tail_w))
            extra += [{"warmup": w, "tail_w": t} for w in OVERLAP_WARMUPS for t in tails]
        return [*RULE_VARIANTS, *extra]

    def best_outcomes(self, k: int) -> list[Outcome]:
        return sorted(self.seen.values(), key=lambda o: o.score)[:k]

    def run(
        self,
        seeds: list[Candidate],
        starts: int = STARTS,
        kicks: int = KICKS,
        best_first: bool = False,
        work: float = math.inf,
        fair_every: int = 0,
    ) -> None:
        """Seeds, their rule variants, then local search from `starts` distinct placements,
        each kicked up to `kicks` times at its local optima: in turns, every start one step
        each, or with `best_first` the start whose current point scores best (a start kicked
        off its optimum waits while others stand better); `fair_every`: with `best_first`,
        every this many rounds every start takes a step. `work`: the evaluator's work this
        run may add (`Evaluator.work`); the seeds are evaluated in any case."""
        self.work_limit = self.evaluator.work + work
        # Each run kicks as if it ran alone: its path does not hang on the runs before it.
        self.rng = random.Random(self.seed)
        ranked = self._evaluate_all(seeds)
        varied = []
        for o in ranked[:SEEDS_TO_VARY]:
            varied += [o.candidate.but(**v) for v in self.variants(o.candidate)]
        ranked = sorted([*ranked, *self._evaluate_all(varied)], key=lambda o: o.score)
        if self.evaluator.overlap_simulator is not None:
            refined = [self._refine_warmup(o) for o in ranked[:SEEDS_TO_VARY]]
            ranked = sorted({id(o): o for o in [*refined, *ranked]}.values(), key=lambda o: o.score)
        active = dict(enumerate(_distinct_placements(ranked, starts)))
        kicked = dict.fromkeys(active, 0)
        anchors = dict(active)  # each start's best so far, to kick from
        rounds = 0
        while active and not self.out_of_time() and not self.phase_spent():
            rounds += 1
            if best_first and (not fair_every or rounds % fair_every):
                turns = [min(active, key=lambda i: active[i].score)]
            else:
                turns = list(active)
            for i in turns:
                improved = self._descend_step(active[i])
                if improved is not None:
                    active[i] = improved
                    if improved.score < anchors[i].score:
                        anchors[i] = improved
                    continue
                if kicked[i] >= kicks:
                    del active[i]
                    continue
                kicked[i] += 1
                active[i] = self.evaluate(kick(anchors[i].candidate, self.rng))
        self.converged = not self.out_of_time()
        self.work_limit = math.inf

    def _refine_warmup(self, start: Outcome) -> Outcome:
        """Overlapped steps: a pattern search on the warm-up depth alone, in steps halving
        from half the scan's spacing (the steady state can move by a point between warm-ups
        0.04 apart, as the in-flight caps round to other integers)."""
        best, step = start, REFINE_STEPS[0]
        while step >= REFINE_STEPS[1] and not self.out_of_time():
            tried = [
                self.evaluate(best.candidate.but(warmup=best.candidate.warmup + sign * step))
                for sign in (-1, 1)
                if best.candidate.warmup + sign * step > 0
            ]
            better = min(tried, key=lambda o: o.score, default=best)
            if better.score < best.score:
                best = better
            else:
                step /= 2
        return best

    def _evaluate_all(self, cands: list[Candidate]) -> list[Outcome]:
        out = []
        for c in cands:
            if self.out_of_time() and self.best is not None:
                break
            out.append(self.evaluate(c))
        return sorted(out, key=lambda o: o.score)

    def _descend_step(self, current: Outcome) -> Outcome | None:
        """The first neighbour that improves on `current` (neighbours come most promising
        first), else None. With steps overlapped, first a sweep over the devices."""
        if current.candidate.tail_w:
            swept = self._sweep_devices(current)
            if swept is not None:
                return swept
        # A fitting plan is only beaten by a faster one: give up on slower candidates early.
        cutoff = current.makespan if current.fits else math.inf
        moves = neighbours(current)
        if self.recomputing:
            moves = recompute_moves(current, self.evaluator.costs.offers) + moves
        for cand in moves:
            if not self.allowed(cand.placement):
                continue
            if self.out_of_time():
                return None
            out = self.evaluate(cand, cutoff)
            if out is not None and out.score < current.score:
                return out
        return None

    def _sweep_devices(self, current: Outcome) -> Outcome | None:
        """Overlapped steps: each device in turn, idlest first, takes the first of its
        `device_moves` that improves, building on the moves already taken (steady-state idle
        is spread over every device, so improving them one at a time, without restarting
        from the top after each, covers them all sooner). None if no device improved."""
        start = current
        for d in diagnose(current).starved:
            for cand in device_moves(current.candidate, d):
                if self.out_of_time():
                    return None if current is start else current
                out = self.evaluate(cand)
                if out is not None and out.score < current.score:
                    current = out
                    break
        return None if current is start else current


def _distinct_placements(ranked: list[Outcome], k: int) -> list[Outcome]:
    """Up to k diverse starting points: the best outcome of each stage count first (so deep and
    shallow pipelines both get searched), then of further placements, best first; where fewer
    than k placements exist, the best of the other outcomes (other rules on the same map)."""
    out: list[Outcome] = []
    for key in (lambda o: len(o.candidate.placement), lambda o: o.candidate.placement, id):
        seen = {key(o) for o in out}
        for o in ranked:
            if len(out) == k:
                return out
            if key(o) not in seen and o not in out:
                seen.add(key(o))
                out.append(o)
    return out
