"""The bubble-aware tuner: seeds, then iterated local search guided by where devices idle.

1. Seeds: balanced partitions under sequential, interleaved and V-shaped placements for every
   chunk count up to 4 (or `max_chunks`, when lower) and device orders by memory and speed,
   plus the partition and placement of every baseline given; each scheduled by the list
   scheduler at a moderate and a deep warm-up.
2. The best seeds get their scheduling rules varied (warm-up depth, split backward, W deferral,
   a lean memory-first setting).
3. Local search from the best few distinct placements: `moves.neighbours` proposes changes
   aimed at the busiest, the idlest and the overflowing devices, most promising first; the first
   that improves is kept (slower candidates are abandoned mid-schedule); at a local optimum a
   seeded random `kick` perturbs the partition, a few times, before giving up.
4. Then one of two searches, each bounded by the first search's work (in stages x
   microbatches scheduled; the recomputation search by twice it), each only adding
   finalists, so the result is never worse than the first search's (`max_chunks=4`):
   - where memory binds (the best plan does not fit, or one that does not was faster) and the
     profile prices recomputation, recomputation per stage (`recompute.py`): what each stage
     recomputes becomes a variable of the search, as AdaPipe makes it (Sun et al., ASPLOS
     2024), jointly with the partition: seeds that recompute every stage (each kind the
     layers offer) with partitions balanced for the recomputed work, the best plans so far,
     and `moves.recompute_moves` first in every descent; then, per kind, the search of
     every stage recomputing it, as the profile's global flag would have it;
   - else, where the layers allow more than 4 stages per device and the best plan fits
     (more stages per device never hold less), deeper interleaving (`deeper.deepen`): steps
     1 to 3 over the seeds of every deeper chunk count (up to `max_chunks`, by default 8),
     each with its own re-balanced partitions, from one start per chunk count, the start that
     stands best taking the next turn; the moves then make the counts uneven (a device hands
     a stage to another, two of its stages merge).
5. Where the cap and the layers allow more than 4 stages a device, the first search once more
   from its seeds, its moves now free to give a device a fifth stage (`deeper.one_deeper`,
   bounded by the first search's work; cached where it retraces the first's path): uneven
   plans near the seeds, such as 4/4/4/4/3/4/4/5 on a cluster of mixed speeds, are far from
   the deeper search's starts (BENCHMARKS.md, the tuner against the one before it).

Each search of steps 3 to 5 kicks from a random generator seeded afresh, so its path does not
hang on how many kicks the searches before it drew.

Every plan reported is re-evaluated by the simulator, and the result is never worse (in the
simulator) than the best baseline plan given: that plan itself is returned if nothing beats it.
The work can be bounded in evaluations (`max_evaluations`, the same on any machine) and in
seconds (`time_budget`); deterministic for a seed unless the seconds run out first
(`TuneResult.cut_by_time` says so).

Where each step lives: `seeds.py` (1); `local_search.py` (2 and 3: one run of seeds, variants
and descents, which steps 4 and 5 reuse with their own seeds and bounds); `recompute.py` and
`deeper.py` (4 and 5). This module runs them in order and picks the finalists.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from octopipe.errors import InputError
from octopipe.placement import torchtitan_style
from octopipe.plan import Plan
from octopipe.profile import Profile
from octopipe.sim import SimResult, Simulator
from octopipe.tuner.candidate import Candidate, Evaluator, Outcome
from octopipe.tuner.deeper import deepen, one_deeper
from octopipe.tuner.local_search import Progress, Search
from octopipe.tuner.recompute import RECOMPUTE_FROM, memory_binds, recompute
from octopipe.tuner.reorder import reorder_critical
from octopipe.tuner.seeds import SEED_WARMUPS, seed_candidates, with_fill_tails

SEED_DEPTH = 4  # chunk counts of the first search; deeper ones in a second (`deepen`)
AUTO_CHUNKS = 8  # the deepest chunk count searched unless `max_chunks` says otherwise
OVERLAP_FAIR_EVERY = 4  # overlapped steps' first search: every start a step every 4th round
# Devices x microbatches the tuner takes on: each of its evaluations is atomic and grows with
# this, so beyond it no time budget could be kept (one list schedule of 2^18 pairs in up to
# four chunks takes seconds on one core).
MAX_PLAN_PAIRS = 2**18


@dataclass(frozen=True)
class Evaluated:
    """A plan with its simulator result; `label` says where it came from."""

    label: str
    plan: Plan
    sim: SimResult

    @property
    def score(self) -> tuple[int, float, float]:
        return self.sim.rank


@dataclass(frozen=True)
class TuneResult:
    best: Evaluated  # the tuned plan (predicted filled), or the best baseline if nothing beat it
    baselines: tuple[Evaluated, ...]
    evaluations: int
    seconds: float
    converged: bool  # False when a budget cut the search short
    cut_by_time: bool = False  # the seconds ran out before the evaluations: machine-dependent
    work: int = 0  # (stage, microbatch) pairs the evaluations scheduled: the same on any machine


def tune(
    profile: Profile,
    num_microbatches: int,
    num_devices: int | None = None,
    *,
    max_chunks: int | None = None,
    time_budget: float = 30.0,
    max_evaluations: int | None = None,
    seed: int = 0,
    baselines: Sequence[tuple[str, Plan]] = (),
    progress: Progress | None = None,
    torchtitan: bool = False,
    action_overhead: float = 0.0,
    overlap_steps: bool = False,
) -> TuneResult:
    """Search partition, placement and schedule for the fastest plan that fits.

    `max_chunks` caps the stages on any one device (None: AUTO_CHUNKS); baselines placed
    deeper are left out. Up to SEED_DEPTH the search is the first one; deeper chunk counts get
    a second (`deepen`) and a walk one stage deeper (`one_deeper`), each bounded by the
    first's work, and the first's plans stay finalists, so a deeper cap never loses to the
    capped search (BENCHMARKS.md, deeper interleaving).

    `baselines` are evaluated as they are and also seed the search with their partition and
    placement; the result is never worse than the best of them. When no plan fits, `best` is the
    leanest one found (smallest largest shortfall). `progress(best_time, elapsed)` is called
    after every evaluation. `torchtitan=True` keeps to placements torchtitan can build itself
    (looped, or V-shaped with two stages per device), baselines included. `action_overhead`
    (seconds) is a fixed cost the search adds to every action when it compares plans (see
    `octopipe.costs.CostTable`); the plan's `predicted` figures keep the default semantics.
    `overlap_steps=True` ranks every plan, baselines included, by its steady step time with
    steps back to back (docs/FORMATS.md, "Overlapped steps").
    """
    devices = profile.device_list(num_devices)
    _check_counts(profile, num_microbatches, len(devices))
    run = _TunerRun(
        profile,
        devices,
        num_microbatches,
        AUTO_CHUNKS if max_chunks is None else max_chunks,
        overlap_steps,
        torchtitan,
        action_overhead,
    )
    run.start(time_budget, seed, progress, max_evaluations)
    base = run.evaluate(baselines)
    run.first_search(run.seeds(base))
    finalists, converged = run.further()
    return run.result(finalists, base, converged)


def _check_counts(profile: Profile, num_microbatches: int, num_devices: int) -> None:
    check_plan_size(profile, num_microbatches, num_devices)
    if profile.num_layers < num_devices:
        raise InputError(
            profile.name,
            f"{num_devices} devices need at least as many layers, "
            f"the profile has {profile.num_layers}",
        )
    if num_microbatches < 1:
        raise InputError(
            profile.name, f"microbatch count must be at least 1, got {num_microbatches}"
        )


class _TunerRun:
    """One `tune`: its simulator and evaluator, its chunk caps, and its steps in order."""

    def __init__(
        self,
        profile: Profile,
        devices,
        num_microbatches: int,
        cap: int,
        overlap_steps: bool,
        torchtitan: bool,
        action_overhead: float,
    ) -> None:
        self.profile, self.P, self.cap = profile, len(devices), cap
        self.overlap_steps, self.torchtitan = overlap_steps, torchtitan
        self.action_overhead = action_overhead
        self.simulator = Simulator(profile, action_overhead)  # refuses overlap with DP
        simulator = self.simulator if overlap_steps else None
        self.evaluator = Evaluator(
            profile, devices, num_microbatches, self.simulator.costs, simulator
        )
        self.allowed, self.depth = self.within(cap), min(cap, SEED_DEPTH)

    def start(
        self,
        time_budget: float,
        seed: int,
        progress: Progress | None,
        max_evaluations: int | None,
    ) -> None:
        # The first search keeps to `depth` stages a device: the capped search's own, so a
        # deeper cap only adds finalists to it.
        first = self.within(self.depth)
        self.search = Search(self.evaluator, time_budget, seed, progress, first, max_evaluations)

    def simulate(self, plan: Plan, check: bool = False) -> SimResult:
        return self.simulator.run(plan, detail=False, check=check, overlap_steps=self.overlap_steps)

    def within(self, limit: int) -> Callable[[tuple[int, ...]], bool]:
        """Placements with at most `limit` stages on any device (moves can deepen one device
        past the seeds'), and only those torchtitan builds where asked."""
        P, torchtitan = self.P, self.torchtitan

        def allowed(placement: tuple[int, ...]) -> bool:
            if chunk_count(placement) > limit:
                return False
            return not torchtitan or torchtitan_style(placement, P) is not None

        return allowed

    def evaluate(self, baselines: Sequence[tuple[str, Plan]]) -> tuple[Evaluated, ...]:
        """The baselines the caps allow, simulated as they are."""
        return tuple(
            Evaluated(label, plan, self.simulate(plan))
            for label, plan in baselines
            if self.allowed(plan.placement)
        )

    def seeds(self, base: tuple[Evaluated, ...]) -> list[Candidate]:
        """1.'s seeds, and every baseline's partition and placement at each warm-up."""
        evaluator, search = self.evaluator, self.search
        seeds = seed_candidates(evaluator, self.depth, deadline=search.deadline) + [
            Candidate(
                tuple((s.start, s.end) for s in e.plan.stages),
                e.plan.placement,
                warmup=warmup,
                reduce_early=evaluator.data_parallel,
                label=f"from {e.label}",
            )
            for e in base
            for warmup in SEED_WARMUPS
        ]
        if self.overlap_steps:  # keep W for each step's end, where the next step's fill idles
            seeds = [with_fill_tails(evaluator, c) for c in seeds]
        return [c for c in seeds if search.allowed(c.placement)]

    def first_search(self, seeds: list[Candidate]) -> None:
        """Steps 1 to 3. Overlapped steps: every evaluation is a run of several steps and the
        budget binds, so the start that stands best takes the turns, and every few rounds each
        start one (the start standing best may lead to a worse optimum; BENCHMARKS.md,
        overlapped steps)."""
        self._seeds = seeds
        self._first(math.inf)

    def _first(self, work: float) -> None:
        self.search.run(
            self._seeds, best_first=self.overlap_steps, fair_every=OVERLAP_FAIR_EVERY, work=work
        )

    def further(self) -> tuple[list[Evaluated], bool]:
        """The first search's finalists, then 4. and 5.: each bounded by the first search's
        work, each only adding finalists; whether every search converged."""
        search, evaluator, depth, allowed = self.search, self.evaluator, self.depth, self.allowed
        shallow = search.best_outcomes(3)
        finalists = self.finish(shallow)
        converged = search.converged
        # The first search's work bounds the second: deeper interleaving where memory leaves
        # room for it, else recomputation per stage (each only adds finalists).
        first = evaluator.work
        deepest = min(self.cap, self.profile.num_layers // self.P)
        search.allowed = allowed
        overlap = self.overlap_steps
        if not search.out_of_time() and memory_binds(search):
            before = search.best_outcomes(RECOMPUTE_FROM)
            converged = recompute(search, evaluator, depth, before, first, allowed, overlap)
            recomputed = [o for o in search.best_outcomes(3) if o.candidate.recompute]
            finalists += self.finish(recomputed)
        elif not search.out_of_time() and deepest > depth and search.best and search.best.fits:
            converged = deepen(search, evaluator, depth + 1, deepest, first, allowed, overlap)
            finalists += self.finish([o for o in search.best_outcomes(3) if o not in shallow])
        if not search.out_of_time() and deepest > depth:
            known = search.best_outcomes(3)
            deeper = self.within(depth + 1)
            converged = one_deeper(search, self._first, deeper, first) and converged
            finalists += self.finish([o for o in search.best_outcomes(3) if o not in known])
        return finalists, converged

    def finish(self, outcomes: list[Outcome]) -> list[Evaluated]:
        """The best outcomes as plans, the very best also polished (none: none)."""
        if not outcomes:
            return []
        done = []
        for outcome in outcomes:
            plan = self.evaluator.to_plan(outcome)
            # check=True: a structural fault here would be a tuner bug, not a user's.
            result = self.simulate(plan, check=True)
            done.append(Evaluated(f"tuned ({outcome.candidate.label})", plan, result))
        top = min(done, key=lambda e: e.score)
        if not self.overlap_steps:  # the polish follows one step's critical path
            plan, result = reorder_critical(
                self.simulator, top.plan, top.sim, out_of_time=self.search.out_of_time
            )
            done.append(Evaluated(top.label, plan, result))
        return done

    def result(
        self, finalists: list[Evaluated], base: tuple[Evaluated, ...], converged: bool
    ) -> TuneResult:
        """The best of the finalists and the baselines, its predicted figures those of the
        default semantics."""
        best = min([*finalists, *base], key=lambda e: e.score)
        label = best.label if best in finalists else f"{best.label} (kept)"
        exported = best.sim
        if self.action_overhead:
            exported = Simulator(self.profile).run(
                best.plan, detail=False, overlap_steps=self.overlap_steps
            )
        names = self.profile.layer_names
        plan = best.plan.with_predicted(exported.predicted()).with_layer_names(names)
        search, evaluator = self.search, self.evaluator
        return TuneResult(
            Evaluated(label, plan, best.sim),
            base,
            evaluator.evaluations,
            search.elapsed(),
            converged,
            search.time_cut,
            evaluator.work,
        )


def chunk_count(placement: Sequence[int]) -> int:
    """The most stages any device holds."""
    return max(Counter(placement).values())


def check_plan_size(profile: Profile, num_microbatches: int, num_devices: int) -> None:
    """Refuse a plan too large to tune in bounded time, saying what to change."""
    pairs = num_microbatches * num_devices
    if pairs > MAX_PLAN_PAIRS:
        raise InputError(
            profile.name,
            f"{num_microbatches:,} microbatches on {num_devices} devices are {pairs:,} "
            f"(device, microbatch) pairs; the tuner plans at most {MAX_PLAN_PAIRS:,} in bounded "
            "time: use fewer, larger microbatches",
        )
