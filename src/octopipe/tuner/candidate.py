"""A point of the tuner's search space and its evaluation by the list scheduler.

`Candidate` fixes partition (ranges), placement, what each stage recomputes and the scheduling
rules' knobs; `Evaluator`
turns it into per-device orders with the memory-aware list scheduler and scores it. Scores rank
fitting plans by time and non-fitting ones by how much memory they lack, so the search walks
towards a plan that fits first. The simulator re-checks every plan the tuner reports.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from octopipe.costs import (
    CostTable,
    StageCost,
    reduction_buckets,
    reduction_windows,
    stage_costs,
    static_bytes,
)
from octopipe.placement import Placement
from octopipe.plan import NO_RECOMPUTE, Plan, make_plan
from octopipe.profile import Device, Profile
from octopipe.schedules.list_scheduler import ListSchedule, Rules, list_schedule
from octopipe.sim import SimResult, Simulator
from octopipe.sim.evaluate import memory_excess, plan_rank
from octopipe.tuner.balance import Ranges


@dataclass(frozen=True)
class Candidate:
    """Partition + placement + recomputation + scheduling knobs. `warmup` scales every stage's
    in-flight cap (1.0 = just enough microbatches to cover the stage's round trip); `extra` adds
    per device. `recompute`: per stage, "none", "selective" or "full" (empty: none anywhere)."""

    ranges: Ranges
    placement: Placement
    warmup: float = 1.5
    extra: tuple[int, ...] = ()
    split_backward: bool = True
    defer_w: bool = True
    backward_first: bool = True
    oldest_first: bool = True
    reduce_early: bool = False
    tail_w: tuple[int, ...] = ()  # overlapped steps: per device, W kept for the step's end
    recompute: tuple[str, ...] = ()
    label: str = field(default="", compare=False)

    def but(self, **changes) -> Candidate:
        return replace(self, **changes)


@dataclass(frozen=True)
class Outcome:
    """A candidate's schedule as the list scheduler predicts it."""

    candidate: Candidate
    schedule: ListSchedule
    makespan: float
    busy: tuple[float, ...]
    peak_bytes: tuple[float, ...]
    capacity: tuple[float, ...]

    @property
    def excess(self) -> tuple[float, ...]:
        return memory_excess(self.peak_bytes, self.capacity)

    @property
    def fits(self) -> bool:
        return not any(self.excess)

    @property
    def score(self) -> tuple[int, float, float]:
        """Lower is better (`plan_rank`): fitting plans by time, then the others."""
        return plan_rank(self.makespan, self.excess)


def inflight_caps(
    stages: Sequence[StageCost],
    num_devices: int,
    M: int,
    warmup: float,
    extra: Sequence[int],
    split_backward: bool,
) -> tuple[int, ...]:
    """Per stage: microbatches its device must keep in flight to cover the stage's round trip.

    The round trip of stage s is the chain F(s..S-1) then backward(S-1..s) with transfers; during
    it the device completes round_trip / (its work per microbatch) microbatches.
    """

    def backward(st: StageCost) -> float:  # the backward on the round trip: I, or a whole B
        return st.i if split_backward else st.full_backward

    cycle = [0.0] * num_devices
    for st in stages:
        cycle[st.device] += st.work if split_backward else st.f + st.full_backward
    caps = [0] * len(stages)
    trip = 0.0
    for s in range(len(stages) - 1, -1, -1):
        st = stages[s]
        trip += st.f + backward(st) + 2 * st.lag_next
        depth = math.ceil(warmup * trip / cycle[st.device] - 1e-9) if cycle[st.device] > 0 else M
        bonus = extra[st.device] if extra else 0
        caps[s] = min(M, max(1, depth + bonus))
    return tuple(caps)


# Overlapped steps: the search estimates a candidate's step time from 4 steps, then 8 if the
# increments have not settled (a plan reported is simulated until it settles).
ESTIMATE_STEPS = (4, 8)


def fill_tails(stages: Sequence[StageCost], num_devices: int, M: int) -> tuple[int, ...]:
    """Per device, the W to keep for the end of a step when steps overlap: as many as cover
    the wait for the next step's first forward to reach the device (the forwards and transfers
    of the stages before its first one), at most all of its W. A first guess: the wait for the
    last backward to come back is not counted, and the search moves each device's tail."""
    delay, first_wait = 0.0, [None] * num_devices
    for st in stages:
        if first_wait[st.device] is None:
            first_wait[st.device] = delay
        delay += st.f + st.lag_next
    out = []
    for d in range(num_devices):
        mine = [st.w for st in stages if st.device == d]
        w = sum(mine) / len(mine) if mine else 0.0
        wait = first_wait[d] or 0.0
        out.append(min(M * len(mine), math.ceil(wait / w - 1e-9)) if w > 0 else 0)
    return tuple(out)


class Evaluator:
    """Schedules and scores candidates for one profile, device set and microbatch count."""

    def __init__(
        self,
        profile: Profile,
        devices: tuple[Device, ...],
        num_microbatches: int,
        costs: CostTable | None = None,
        overlap_simulator: Simulator | None = None,
    ):
        self.profile, self.devices, self.M = profile, devices, num_microbatches
        # Overlapped steps: the simulator that times each candidate's repeated orders.
        self.overlap_simulator = overlap_simulator
        self.costs = costs or CostTable(profile)
        self.capacity = tuple(float(d.memory_bytes) for d in devices)
        self.speeds = tuple(d.speed for d in devices)
        self.data_parallel = profile.data_parallel.degree > 1 and self.costs.grad[-1] > 0
        self.evaluations = 0
        # (stage, microbatch) pairs scheduled so far: what the evaluations cost, on any machine.
        self.work = 0

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    def static_bytes(self, cand: Candidate) -> list[float]:
        return static_bytes(self.costs, cand.ranges, cand.placement, self.num_devices)

    def stages(self, cand: Candidate) -> tuple[StageCost, ...]:
        return stage_costs(self.costs, cand.ranges, cand.placement, self.devices, cand.recompute)

    def evaluate(self, cand: Candidate, give_up_after: float = math.inf) -> Outcome | None:
        """The candidate's outcome; None once it is sure to take longer than `give_up_after`."""
        self.evaluations += 1
        self.work += len(cand.ranges) * self.M
        if self.overlap_simulator:  # one step's makespan does not bound the steady step time
            give_up_after = math.inf
        stages = self.stages(cand)
        static = self.static_bytes(cand)
        caps = inflight_caps(
            stages, self.num_devices, self.M, cand.warmup, cand.extra, cand.split_backward
        )
        rules = Rules(
            inflight=caps,
            split_backward=cand.split_backward,
            defer_w=cand.defer_w,
            backward_first=cand.backward_first,
            oldest_first=cand.oldest_first,
            reduce_early=cand.reduce_early,
            tail_w=cand.tail_w or None,
            memory_budget=tuple(c - s for c, s in zip(self.capacity, static)),
        )
        sched = list_schedule(stages, self.num_devices, self.M, rules, give_up_after)
        if sched is None:
            return None
        peaks = tuple(s + a for s, a in zip(static, sched.peak_activation_bytes))
        if self.overlap_simulator:
            steady = self.steady_estimate(cand, sched)
            return Outcome(cand, sched, steady.iteration_time, steady.busy, peaks, self.capacity)
        makespan = max(sched.makespan, self.reductions_end(cand, sched))
        return Outcome(cand, sched, makespan, sched.busy, peaks, self.capacity)

    def steady_estimate(self, cand: Candidate, sched: ListSchedule) -> SimResult:
        """The step time of the candidate's orders repeated without a barrier, from a short run
        (the tuner re-simulates the plans it reports until they settle)."""
        assert self.overlap_simulator is not None
        plan = make_plan(
            self.num_devices, self.M, cand.ranges, cand.placement, sched.orders, cand.recompute
        )
        return self.overlap_simulator.run(
            plan, detail=False, check=False, overlap_steps=True, steps=ESTIMATE_STEPS
        )

    def reductions_end(self, cand: Candidate, sched: ListSchedule) -> float:
        """When the last data-parallel all-reduce ends (0 without data parallelism)."""
        if not self.data_parallel:
            return 0.0
        buckets = reduction_buckets(
            self.costs, cand.ranges, cand.placement, self.devices, cand.recompute
        )
        # The list scheduler splits every backward or none: the last is a W or a B.
        last = [(end, cand.split_backward) for end in sched.last_backward]
        ends = sched.device_ends if self.profile.data_parallel.at_end else None
        windows = reduction_windows(last, buckets, cand.placement, ends)
        return max((end for *_, end in windows), default=0.0)

    def to_plan(self, outcome: Outcome) -> Plan:
        """The outcome as a plan. A stage whose moved boundaries left it no layer that offers
        its kind recomputes nothing in the plan: priced alike, and a plan may not say so."""
        cand = outcome.candidate
        orders = outcome.schedule.orders
        recompute = tuple(
            kind if self.costs.offers(a, b, kind) else NO_RECOMPUTE
            for (a, b), kind in zip(cand.ranges, cand.recompute)
        )
        return make_plan(self.num_devices, self.M, cand.ranges, cand.placement, orders, recompute)
