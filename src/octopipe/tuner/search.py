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
     profile prices recomputation, recomputation per stage (`_recompute`): what each stage
     recomputes becomes a variable of the search, as AdaPipe makes it (Sun et al., ASPLOS
     2024), jointly with the partition: seeds that recompute every stage (each kind the
     layers offer) with partitions balanced for the recomputed work, the best plans so far,
     and `moves.recompute_moves` first in every descent; then, per kind, the search of
     every stage recomputing it, as the profile's global flag would have it;
   - else, where the layers allow more than 4 stages per device and the best plan fits
     (more stages per device never hold less), deeper interleaving (`_deepen`): steps 1 to 3
     over the seeds of every deeper chunk count (up to `max_chunks`, by default 8), each with
     its own re-balanced partitions, from one start per chunk count, the start that stands
     best taking the next turn; the moves then make the counts uneven (a device hands a
     stage to another, two of its stages merge).
5. Where the cap and the layers allow more than 4 stages a device, the first search once more
   from its seeds, its moves now free to give a device a fifth stage (`_one_deeper`, bounded
   by the first search's work; cached where it retraces the first's path): uneven plans near
   the seeds, such as 4/4/4/4/3/4/4/5 on a cluster of mixed speeds, are far from the deeper
   search's starts (BENCHMARKS.md, the tuner against the one before it).

Each search of steps 3 to 5 kicks from a random generator seeded afresh, so its path does not
hang on how many kicks the searches before it drew.

Every plan reported is re-evaluated by the simulator, and the result is never worse (in the
simulator) than the best baseline plan given: that plan itself is returned if nothing beats it.
The work can be bounded in evaluations (`max_evaluations`, the same on any machine) and in
seconds (`time_budget`); deterministic for a seed unless the seconds run out first
(`TuneResult.cut_by_time` says so).
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from octopipe.costs import CostTable
from octopipe.errors import InputError
from octopipe.partition import OutOfTime
from octopipe.placement import seed_placements, torchtitan_style
from octopipe.plan import NO_RECOMPUTE, Plan
from octopipe.profile import Profile
from octopipe.sim import SimResult, Simulator
from octopipe.tuner.balance import Ranges, balanced_ranges
from octopipe.tuner.candidate import Candidate, Evaluator, Outcome, fill_tails
from octopipe.tuner.moves import device_moves, diagnose, kick, neighbours, recompute_moves
from octopipe.tuner.reorder import reorder_critical

Progress = Callable[[float, float], None]  # (best iteration time so far, seconds elapsed)

SEED_DEPTH = 4  # chunk counts of the first search; deeper ones in a second (`_deepen`)
AUTO_CHUNKS = 8  # the deepest chunk count searched unless `max_chunks` says otherwise
DEEP_STARTS = 8  # the deeper search's starts: one per chunk count first
DEEP_WORK_SHARE = 1.0  # its work, at most this times the first search's (stages x microbatches)
RECOMPUTE_WORK_SHARE = 1.0  # the joint recomputation search's, likewise
KIND_WORK_SHARE = 0.5  # then each kind's everywhere, likewise
ONE_DEEPER_WORK_SHARE = 1.0  # then the first search's walk one stage deeper, likewise
RECOMPUTE_FROM = 3  # it also starts from the best plans found before it, this many
MEMORY_GAIN = 0.01  # memory binds where a plan that does not fit was this much faster

RULE_VARIANTS = (
    {"warmup": 1.0},
    {"warmup": 2.0},
    {"warmup": 3.0},
    {"split_backward": False, "warmup": 1.0},
    {"oldest_first": False},
    {"warmup": 0.01, "defer_w": False},  # lean: one microbatch in flight per stage
)
OVERLAP_WARMUPS = (1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0)
OVERLAP_FAIR_EVERY = 4  # overlapped steps' first search: every start a step every 4th round
REFINE_STEPS = (0.25, 0.015)  # overlapped steps: the warm-up's first and smallest refinement
SEED_WARMUPS = (1.5, 3.0)  # every seed is scheduled with a moderate and a deep warm-up
# Devices x microbatches the tuner takes on: each of its evaluations is atomic and grows with
# this, so beyond it no time budget could be kept (one list schedule of 2^18 pairs in up to
# four chunks takes seconds on one core).
MAX_PLAN_PAIRS = 2**18
SEEDS_TO_VARY = 4
STARTS = 5
KICKS = 3


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
    a second (`_deepen`) and a walk one stage deeper (`_one_deeper`), each bounded by the
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
    check_plan_size(profile, num_microbatches, len(devices))
    if profile.num_layers < len(devices):
        raise InputError(
            profile.name,
            f"{len(devices)} devices need at least as many layers, "
            f"the profile has {profile.num_layers}",
        )
    if num_microbatches < 1:
        raise InputError(
            profile.name, f"microbatch count must be at least 1, got {num_microbatches}"
        )
    simulator = Simulator(profile, action_overhead)  # refuses overlap with data parallelism
    evaluator = Evaluator(
        profile, devices, num_microbatches, simulator.costs, simulator if overlap_steps else None
    )

    def simulate(plan: Plan, check: bool = False) -> SimResult:
        return simulator.run(plan, detail=False, check=check, overlap_steps=overlap_steps)

    P = len(devices)
    cap = AUTO_CHUNKS if max_chunks is None else max_chunks

    def within(limit: int) -> Callable[[tuple[int, ...]], bool]:
        """Placements with at most `limit` stages on any device (moves can deepen one device
        past the seeds'), and only those torchtitan builds where asked."""

        def allowed(placement: tuple[int, ...]) -> bool:
            if chunk_count(placement) > limit:
                return False
            return not torchtitan or torchtitan_style(placement, P) is not None

        return allowed

    allowed, depth = within(cap), min(cap, SEED_DEPTH)
    # The first search keeps to `depth` stages a device: the capped search's own, so a deeper
    # cap only adds finalists to it.
    search = _Search(evaluator, time_budget, seed, progress, within(depth), max_evaluations)

    base = tuple(
        Evaluated(label, plan, simulate(plan))
        for label, plan in baselines
        if allowed(plan.placement)
    )
    seeds = _seed_candidates(evaluator, depth, deadline=search.deadline) + [
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
    if overlap_steps:  # keep W for each step's end, where the next step's fill would idle
        seeds = [with_fill_tails(evaluator, c) for c in seeds]
    # Overlapped steps: every evaluation is a run of several steps and the budget binds, so
    # the start that stands best takes the turns, and every few rounds each start one (the
    # start standing best may lead to a worse optimum; BENCHMARKS.md, overlapped steps).
    seeds = [c for c in seeds if search.allowed(c.placement)]

    def first_search(work: float = math.inf) -> None:
        search.run(seeds, best_first=overlap_steps, fair_every=OVERLAP_FAIR_EVERY, work=work)

    first_search()

    def finish(outcomes: list[Outcome]) -> list[Evaluated]:
        """The best outcomes as plans, the very best also polished (none: none)."""
        if not outcomes:
            return []
        done = []
        for outcome in outcomes:
            plan = evaluator.to_plan(outcome)
            # check=True: a structural fault here would be a tuner bug, not a user's.
            result = simulate(plan, check=True)
            done.append(Evaluated(f"tuned ({outcome.candidate.label})", plan, result))
        top = min(done, key=lambda e: e.score)
        if not overlap_steps:  # the polish follows one step's critical path
            plan, result = reorder_critical(
                simulator, top.plan, top.sim, out_of_time=search.out_of_time
            )
            done.append(Evaluated(top.label, plan, result))
        return done

    shallow = search.best_outcomes(3)
    finalists = finish(shallow)
    converged = search.converged
    # The first search's work bounds the second: deeper interleaving where memory leaves room
    # for it, else recomputation per stage (each only adds finalists).
    first = evaluator.work
    deepest = min(cap, profile.num_layers // P)
    search.allowed = allowed
    if not search.out_of_time() and _memory_binds(search):
        before = search.best_outcomes(RECOMPUTE_FROM)
        converged = _recompute(search, evaluator, depth, before, first, allowed, overlap_steps)
        recomputed = [o for o in search.best_outcomes(3) if o.candidate.recompute]
        finalists += finish(recomputed)
    elif not search.out_of_time() and deepest > depth and search.best and search.best.fits:
        converged = _deepen(search, evaluator, depth + 1, deepest, first, allowed, overlap_steps)
        finalists += finish([o for o in search.best_outcomes(3) if o not in shallow])
    if not search.out_of_time() and deepest > depth:
        known = search.best_outcomes(3)
        converged = _one_deeper(search, first_search, within(depth + 1), first) and converged
        finalists += finish([o for o in search.best_outcomes(3) if o not in known])
    best = min([*finalists, *base], key=lambda e: e.score)
    label = best.label if best in finalists else f"{best.label} (kept)"
    exported = best.sim
    if action_overhead:
        exported = Simulator(profile).run(best.plan, detail=False, overlap_steps=overlap_steps)
    plan = best.plan.with_predicted(exported.predicted()).with_layer_names(profile.layer_names)
    best = Evaluated(label, plan, best.sim)
    seconds = search.elapsed()
    return TuneResult(
        best, base, evaluator.evaluations, seconds, converged, search.time_cut, evaluator.work
    )


def _deepen(
    search: _Search,
    evaluator: Evaluator,
    first: int,
    last: int,
    work: float,
    allowed: Callable[[tuple[int, ...]], bool],
    overlap_steps: bool,
) -> bool:
    """The deeper search: seeds of every chunk count from `first` to `last` (each partition
    balanced for its placement), one start per chunk count, best-first turns, within
    DEEP_WORK_SHARE of `work` (the first search's). Whether the budget left it to its end."""
    seeds = _seed_candidates(evaluator, last, first, search.deadline)
    seeds = _startable(evaluator, seeds, allowed, overlap_steps)
    search.run(seeds, DEEP_STARTS, best_first=True, work=DEEP_WORK_SHARE * work)
    return search.converged


def _one_deeper(
    search: _Search,
    first_search: Callable[[float], None],
    allowed: Callable[[tuple[int, ...]], bool],
    work: float,
) -> bool:
    """The first search again (`first_search(work)`: its seeds, its turns and, as every run,
    its seeded kicks), its moves now free to give a device one stage more than the seeds hold
    (module docstring, 5), within ONE_DEEPER_WORK_SHARE of `work` (the first search's); where
    its path retraces the first's, the evaluations are cached. Whether the budget left it to
    its end."""
    search.allowed = allowed
    first_search(ONE_DEEPER_WORK_SHARE * work)
    return search.converged


def _memory_binds(search: _Search) -> bool:
    """Whether per-stage recomputation is worth a search: the profile prices it, and memory
    kept the search from faster plans (the best plan does not fit, or one that does not was
    faster by MEMORY_GAIN)."""
    best = search.best
    if not search.evaluator.costs.recompute or best is None:
        return False
    fastest = min(o.makespan for o in search.seen.values())
    return not best.fits or fastest < (1 - MEMORY_GAIN) * best.makespan


def _recompute(
    search: _Search,
    evaluator: Evaluator,
    depth: int,
    before: list[Outcome],
    work: float,
    allowed: Callable[[tuple[int, ...]], bool],
    overlap_steps: bool,
) -> bool:
    """The recomputation search (module docstring, 4). First jointly: seeds of up to `depth`
    chunks that recompute every stage one way, balanced for it, and the `before` plans as they
    are and recomputing every stage, recomputation moves first, within RECOMPUTE_WORK_SHARE of
    `work` (the first search's). Then one search per kind with every stage recomputing it and
    no recomputation moves (what the profile's global flag would give), each within
    KIND_WORK_SHARE of `work`: the joint descent, led by the moves that take recomputation
    back where memory allows, can settle far from a plan that recomputes alike everywhere
    (BENCHMARKS.md, per-stage recomputation). Whether the budget left it to its end."""
    costs = evaluator.costs
    everywhere = {
        kind: [
            c.but(recompute=_everywhere(costs, c.ranges, kind), label=c.label + f"/{kind}")
            for c in _seed_candidates(evaluator, depth, deadline=search.deadline, recompute=kind)
        ]
        for kind in costs.recompute
    }
    joint = [o.candidate for o in before]
    for kind, seeds in everywhere.items():
        joint += seeds
        joint += [
            o.candidate.but(recompute=_everywhere(costs, o.candidate.ranges, kind)) for o in before
        ]
    search.recomputing = True
    starts = _startable(evaluator, joint, allowed, overlap_steps)
    search.run(starts, best_first=True, work=RECOMPUTE_WORK_SHARE * work)
    search.recomputing = False
    converged = search.converged
    for seeds in everywhere.values():
        if search.out_of_time():
            return False
        starts = _startable(evaluator, seeds, allowed, overlap_steps)
        search.run(starts, best_first=True, work=KIND_WORK_SHARE * work)
        converged = converged and search.converged
    return converged


def _startable(
    evaluator: Evaluator,
    seeds: list[Candidate],
    allowed: Callable[[tuple[int, ...]], bool],
    overlap_steps: bool,
) -> list[Candidate]:
    """The seeds the search may start from, with W kept for the step's end under overlap."""
    seeds = [c for c in seeds if allowed(c.placement)]
    return [with_fill_tails(evaluator, c) for c in seeds] if overlap_steps else seeds


def _everywhere(costs: CostTable, ranges: Ranges, kind: str) -> tuple[str, ...]:
    """Every stage recomputing `kind`, where its layers offer it."""
    return tuple(kind if costs.offers(a, b, kind) else NO_RECOMPUTE for a, b in ranges)


def chunk_count(placement: Sequence[int]) -> int:
    """The most stages any device holds."""
    return max(Counter(placement).values())


def with_fill_tails(evaluator: Evaluator, cand: Candidate) -> Candidate:
    tails = fill_tails(evaluator.stages(cand), evaluator.num_devices, evaluator.M)
    return cand.but(tail_w=tails)


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


def _seed_candidates(
    evaluator: Evaluator,
    max_chunks: int,
    min_chunks: int = 1,
    deadline: float = math.inf,
    recompute: str = "none",
) -> list[Candidate]:
    """The seeds of each placement; those whose partitions the `deadline` leaves no time for
    are left out (a huge profile's min-max splits take long; the baselines still seed).
    `recompute`: the partitions are balanced for the work of every layer recomputed so."""
    costs, speeds = evaluator.costs, evaluator.speeds
    # With data parallelism, finishing a stage's W early lets its all-reduce hide under the
    # device's remaining backward work; the seeds' variants try the other way too.
    early = evaluator.data_parallel
    seeds = []
    for label, placement in seed_placements(
        evaluator.devices, max_chunks, costs.num_layers, min_chunks
    ):
        try:
            options = balanced_ranges(costs, placement, speeds, deadline, recompute)
        except OutOfTime:
            break
        seeds += [
            Candidate(ranges, placement, warmup=warmup, reduce_early=early, label=label + tag)
            for tag, ranges in options
            for warmup in SEED_WARMUPS
        ]
    return seeds


class _Search:
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
        self.recomputing = False  # recomputation moves in every descent (`_recompute`)

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
