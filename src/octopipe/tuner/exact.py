"""The exact scheduler: the fastest order of a plan's own partition and placement, for small plans.

    result = exact_schedule(profile, plan, time_limit=10)
    result.plan, result.makespan, result.bound, result.optimal    # ExactResult

The tuner decides orders greedily (the list scheduler) and polishes them locally; this module
answers, where the plan is small, what the best order of the same stages on the same devices
is, so the tuner's orders can be measured against it (tests/test_exact.py) and `octopipe plan
--exact` can replace the tuned order by a faster one. It is an optional extra:
`pip install 'octopipe[exact]'` brings OR-Tools, whose CP-SAT solver it uses.

The model is the simulator's semantics (docs/FORMATS.md, "The exact scheduler"), lowered by
`sim/graph.py` exactly as the simulator lowers the plan:

- every action of the plan (the plan's own F, I, W and B: its choice of B or I + W stays) is an
  interval of its fixed duration on its device; a device runs one at a time (no overlap), and
  its order is what the solver decides;
- an action starts no earlier than each of its (up to two) dependencies' end plus the transfer
  lag on that edge;
- memory: a device's activation level rises at the start of an action that allocates (F, and
  a recomputing stage's I) and falls at the end of one that frees; as a device's actions never
  overlap, the highest level over time is the simulator's peak of the same order (the highest
  prefix sum of the deltas). It stays at most the device's capacity less its static bytes, or
  the given order's own peak on a device where that is higher (so the given order is always a
  solution, and a plan that does not fit gets no device worse than it was);
- data parallelism: each stage's reductions (one, or one per bucket) are ready when the stage's
  last backward action (B or W) ends, less the bucket's lead, and with `at_end` no earlier than
  the device's last action; a device's reductions do not overlap one another. The simulator
  runs them in the order they become ready, which is the least end of any order on one machine
  (earliest release first), so the optimum is the simulator's. A stage that mixes B with I + W
  under `bucket_bytes` is refused (its buckets' lead hangs on which kind ends last);
- the objective is the iteration time: the latest end of any action or reduction.

Times are integer ticks of 2^-36 of the given order's iteration time, every duration and lag
rounded down (a duration of 0 ticks counts 1, a device runs one thing at a time): every order
is thus no slower in the model than in the simulator, so the solver's objective bound, in
seconds, is a lower bound of the real optimum (less one tick per rounded-up action); an
"optimal" order is optimal to within a few parts in 10^8. The plan bound of `sim/bounds.py`,
less what rounding can take off a path (`slack` ticks), floors the objective, and the solver
stops once within `slack` of its own bound: where the tuned order meets the plan bound, the
proof is at once. Microbatches alike in their actions are interchangeable: their stage-0
forwards run in microbatch order (a symmetry cut that loses no optimum). The given order is
the solver's first hint.

The solver's order, each device's actions by their start, becomes a plan of the same stages and
placement, which the simulator then times: its iteration time must be the solver's makespan to
1e-6 (where proven optimal; at most it otherwise, the solver's times need not be left-shifted),
else the model is wrong and this says so (RuntimeError). The answer is never slower than the
given plan: where the solver found nothing faster in time, the given order is returned.
Recomputation and the action overhead are priced as the simulator prices them; overlapped
steps are not modelled (their steady state is no single step's makespan).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass, replace
from functools import reduce

from octopipe.actions import B_CODE, F_CODE, I_CODE, NUM_KINDS, W_CODE
from octopipe.errors import InputError
from octopipe.plan import Plan
from octopipe.profile import Profile
from octopipe.sim import Simulator
from octopipe.sim.graph import NO_DEP, action_of, build_graph, devices_for

# The most compute actions the model takes on. Proofs come in seconds up to about 72 and are
# rare past a couple of hundred (docs/FORMATS.md); beyond 512 a solve would mostly be a long
# wait for an order no better than the one given.
MAX_EXACT_ACTIONS = 512
TICKS = 2**36  # the given order's iteration time in integer ticks
AGREE = 1e-6  # how closely the simulator must reproduce the solver's makespan
INSTALL = "pip install 'octopipe[exact]'"
# CP-SAT's threads, whatever the cores: each runs one strategy of its portfolio, and the proofs
# come from a few of them. On 2 cores, 8 proved optimality of 3 devices x 4 microbatches x 6
# stages in 1 to 10 s where 2 took 7 s to over 40 s (and varied run to run tenfold).
WORKERS = 8


@dataclass(frozen=True)
class ExactResult:
    """The best order found for a plan's partition and placement, and how good it is proven."""

    plan: Plan  # the same stages and placement, `predicted` filled (default semantics)
    makespan: float  # its simulated iteration time (under the action overhead, where given)
    bound: float  # no order of this partition and placement is faster (proven)
    optimal: bool  # the solver proved `makespan` the least (to a few parts in 10^8)
    seconds: float  # wall time of the solve

    @property
    def gap(self) -> float:
        """How far the makespan is above the proven bound: 0.01 = 1%."""
        return self.makespan / self.bound - 1 if self.bound > 0 else 0.0


def exact_schedule(
    profile: Profile,
    plan: Plan,
    time_limit: float,
    *,
    action_overhead: float = 0.0,
    workers: int = WORKERS,
    where: str = "<plan>",
) -> ExactResult:
    """The fastest order of `plan`'s stages on their devices that CP-SAT finds within
    `time_limit` seconds (the module docstring); `workers`: the solver's threads. InputError
    for plans beyond MAX_EXACT_ACTIONS, a time limit not above 0, and a missing OR-Tools."""
    started = time.perf_counter()
    if not time_limit > 0:
        raise InputError(where, f"the exact scheduler needs a time limit above 0 s: {time_limit}")
    actions = sum(len(acts) for acts in plan.schedule.values())
    if actions > MAX_EXACT_ACTIONS:
        raise InputError(
            where,
            f"the exact scheduler takes at most {MAX_EXACT_ACTIONS} actions, the plan has "
            f"{actions} ({plan.num_stages} stages x {plan.num_microbatches} microbatches): "
            "use fewer microbatches or stages",
        )
    cp_model = require_solver(where)
    sim = Simulator(profile, action_overhead)
    given = sim.run(plan, detail=True, where=where)  # a structural fault or deadlock: here
    graph = build_graph(sim.costs, plan, devices_for(profile, plan, where), check=False)
    bound = sim.bounds(plan, where).plan  # Jackson's: never above the optimum
    if given.iteration_time <= 0.0:
        return ExactResult(_predicted(profile, plan), 0.0, 0.0, True, _since(started))
    model = _Model(cp_model, graph, given, bound, where)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit)
    solver.parameters.num_workers = workers
    solver.parameters.absolute_gap_limit = model.slack  # the rounding's own uncertainty
    status = solver.solve(model.model)
    seconds = _since(started)
    bound = max(bound, model.seconds_below(solver.best_objective_bound))
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):  # nothing in time: the given order
        return ExactResult(_predicted(profile, plan), given.iteration_time, bound, False, seconds)
    optimal = status == cp_model.OPTIMAL
    found = model.plan_of(solver, plan)
    result = sim.run(found, detail=False, check=True, where=where)
    claimed = solver.objective_value * model.tick
    _agrees(result.iteration_time, claimed, optimal)
    _holds_memory(result, given)
    if optimal:
        bound = min(bound, result.iteration_time)  # the rounding's few ticks, not a gap
    if result.iteration_time >= given.iteration_time:  # no faster: the given order stands
        return ExactResult(_predicted(profile, plan), given.iteration_time, bound, optimal, seconds)
    return ExactResult(_predicted(profile, found), result.iteration_time, bound, optimal, seconds)


def require_solver(where: str = "<plan>"):
    """OR-Tools' CP-SAT module; InputError (one line) where the extra is not installed."""
    try:
        from ortools.sat.python import cp_model
    except ImportError:
        raise InputError(where, f"the exact scheduler needs OR-Tools: {INSTALL}") from None
    return cp_model


def _agrees(simulated: float, claimed: float, optimal: bool) -> None:
    """The simulator times the solver's order as the model did (to AGREE): where proven
    optimal exactly, else no slower (a feasible solution's times need not be left-shifted)."""
    scale = max(simulated, claimed)
    if simulated > claimed + AGREE * scale or (optimal and simulated < claimed - AGREE * scale):
        raise RuntimeError(
            f"the exact scheduler's order simulates to {simulated!r} s, its model said "
            f"{claimed!r} s: the model is not the simulator's semantics"
        )


def _holds_memory(result, given) -> None:
    """The solver's order keeps within each device's memory where the given order did, and
    within the given order's peak where it did not (the model's rule)."""
    for d, fits in enumerate(given.fits_per_device):
        peak = result.peak_memory_bytes[d]
        held = result.fits_per_device[d] if fits else peak <= given.peak_memory_bytes[d]
        if not held:
            raise RuntimeError(
                f"the exact scheduler's order needs {peak:.6g} bytes on device {d}, more than "
                "its model allowed: the model's memory rule is not the simulator's"
            )


def _predicted(profile: Profile, plan: Plan) -> Plan:
    """The plan with its `predicted` figures under the default semantics, as `tune` writes."""
    return plan.with_predicted(Simulator(profile).run(plan, detail=False).predicted())


def _since(started: float) -> float:
    return time.perf_counter() - started


class _Model:
    """The CP-SAT model of one graph (the module docstring), and its solution read back."""

    def __init__(self, cp_model, graph, given, bound: float, where: str):
        self.model = m = cp_model.CpModel()
        self.graph = graph
        self.tick = tick = given.iteration_time / TICKS
        M = graph.plan.num_microbatches
        self.M = M
        dur: dict[int, int] = {}
        self.bumped = 0  # actions whose duration rounded to 0 ticks and counts 1
        for row in graph.rows:
            for aid, seconds, *_ in row:
                ticks = math.floor(seconds / tick)
                if ticks == 0:
                    ticks, self.bumped = 1, self.bumped + 1
                dur[aid] = ticks
        # The given order takes at most TICKS + bumped in the model: no optimum lies beyond.
        horizon = TICKS + self.bumped + 64
        # A path of the model's times loses less than a tick per duration, lag, lead or
        # reduction against the simulator's: no order is faster in it by more than `slack`.
        reductions = sum(len(b) for b in graph.buckets)
        self.slack = 2 * len(dur) + 2 * reductions + 4
        # Jackson's bound of `sim/bounds.py` (real seconds, never above the optimum) less that.
        lowest = max(0, min(math.floor(bound / tick) - self.slack, horizon))
        self.makespan = m.new_int_var(lowest, horizon, "makespan")
        self.start: dict[int, object] = {}
        ends: dict[int, object] = {}
        for row in graph.rows:
            intervals = []
            for aid, *_ in row:
                s = m.new_int_var(0, horizon - dur[aid], f"s{aid}")
                self.start[aid] = s
                ends[aid] = s + dur[aid]
                intervals.append(m.new_fixed_size_interval_var(s, dur[aid], f"a{aid}"))
                m.add(self.makespan >= ends[aid])
            m.add_no_overlap(intervals)
        for row in graph.rows:
            for aid, _, d1, l1, d2, l2 in row:
                for dep, lag in ((d1, l1), (d2, l2)):
                    if dep != NO_DEP:
                        m.add(self.start[aid] >= ends[dep] + math.floor(lag / tick))
        self._memory(given, ends)
        if graph.reduces:
            self._reductions(ends, horizon, where)
        perm = self._symmetry_cut()
        m.minimize(self.makespan)
        for e in given.events:  # the given order, its microbatches relabelled to the cut
            a = e.action
            aid = (a.stage * M + perm[a.mb]) * NUM_KINDS + a.kind.code
            m.add_hint(self.start[aid], min(math.floor(e.start / tick), horizon - dur[aid]))

    def seconds_below(self, objective_bound: float) -> float:
        """The solver's bound in seconds, less the ticks the rounding may have added."""
        return max(0.0, (math.floor(objective_bound) - self.bumped - 1) * self.tick)

    def _memory(self, given, ends) -> None:
        """Per device, the activation level stays within what it may hold (the docstring)."""
        graph, m = self.graph, self.model
        for d, row in enumerate(graph.rows):
            static = float(graph.static_bytes[d])
            capacity = float(graph.devices[d].memory_bytes)
            top = given.peak_memory_bytes[d] - static  # the given order's own highest level
            allowed = max(capacity - static, top)
            deltas = [(aid, round(graph.mem_delta[aid])) for aid, *_ in row]
            deltas = [(aid, x) for aid, x in deltas if x]
            if math.isinf(allowed) or sum(x for _, x in deltas if x > 0) <= allowed:
                continue  # never binding
            unit = reduce(math.gcd, (abs(x) for _, x in deltas))
            times = [self.start[aid] if x > 0 else ends[aid] for aid, x in deltas]
            changes = [x // unit for _, x in deltas]
            lowest = sum(c for c in changes if c < 0)
            m.add_reservoir_constraint(times, changes, lowest, math.floor(allowed / unit))

    def _reductions(self, ends, horizon: int, where: str) -> None:
        """Each stage's gradient reductions on its device (the module docstring)."""
        graph, m, tick, M = self.graph, self.model, self.tick, self.M
        kinds: dict[int, set[int]] = defaultdict(set)
        backward: dict[int, list[int]] = defaultdict(list)
        for row in graph.rows:
            for aid, *_ in row:
                code = aid % NUM_KINDS
                if code in (W_CODE, B_CODE):
                    stage = aid // (M * NUM_KINDS)
                    kinds[stage].add(code)
                    backward[stage].append(aid)
        device_end = None
        per_device: dict[int, list[object]] = defaultdict(list)
        placement = graph.plan.placement
        for s, buckets in enumerate(graph.buckets):
            if not buckets:
                continue
            d = placement[s]
            leads = {(b.lead_b, b.lead_w) for b in buckets}
            if len(kinds[s]) > 1 and any(lb != lw for lb, lw in leads):
                raise InputError(
                    where,
                    f"the exact scheduler cannot model stage {s}'s gradient buckets: the stage "
                    "runs both B and I + W, and when a bucket is ready hangs on which ends last",
                )
            is_w = W_CODE in kinds[s]
            last = m.new_int_var(0, horizon, f"last{s}")
            m.add_max_equality(last, [ends[aid] for aid in backward[s]])
            if graph.reduce_at_end and device_end is None:
                device_end = {}
                for dd, row in enumerate(graph.rows):
                    if row:
                        device_end[dd] = m.new_int_var(0, horizon, f"end{dd}")
                        m.add_max_equality(device_end[dd], [ends[aid] for aid, *_ in row])
            for i, bucket in enumerate(buckets):
                lead = bucket.lead_w if is_w else bucket.lead_b
                seconds = math.floor(bucket.seconds / tick)
                r = m.new_int_var(0, horizon, f"r{s}.{i}")
                m.add(r >= last - math.ceil(lead / tick))
                if device_end is not None and d in device_end:
                    m.add(r >= device_end[d])
                m.add(self.makespan >= r + seconds)
                per_device[d].append(m.new_fixed_size_interval_var(r, seconds, f"red{s}.{i}"))
        for intervals in per_device.values():
            m.add_no_overlap(intervals)

    def _symmetry_cut(self) -> dict[int, int]:
        """Microbatches with the same actions in every stage are interchangeable: their
        stage-0 forwards go in microbatch order. Returns the relabelling that puts the given
        order in that form (old microbatch -> new), for the hint."""
        graph, M = self.graph, self.M
        present = {aid for row in graph.rows for aid, *_ in row}
        S = graph.plan.num_stages
        groups: dict[tuple, list[int]] = defaultdict(list)
        for mb in range(M):
            key = tuple((s * M + mb) * NUM_KINDS + I_CODE in present for s in range(S))
            groups[key].append(mb)
        first = {}  # stage 0's forwards in the given order
        for row in graph.rows:
            for pos, (aid, *_) in enumerate(row):
                if aid % NUM_KINDS == F_CODE and aid // (M * NUM_KINDS) == 0:
                    first[(aid // NUM_KINDS) % M] = pos
        perm = {}
        for mbs in groups.values():
            for old, new in zip(sorted(mbs, key=first.__getitem__), mbs):
                perm[old] = new
            for a, b in zip(mbs, mbs[1:]):  # stage 0's F of microbatch m: id m * NUM_KINDS
                self.model.add(self.start[a * NUM_KINDS] < self.start[b * NUM_KINDS])
        return perm

    def plan_of(self, solver, plan: Plan) -> Plan:
        """The solution as a plan: the same stages, each device's actions by their start."""
        M = self.M
        orders = {}
        for d, row in enumerate(self.graph.rows):
            ids = sorted((solver.value(self.start[aid]), aid) for aid, *_ in row)
            orders[d] = tuple(action_of(aid, M) for _, aid in ids)
        return replace(plan, schedule=orders, predicted=None)


__all__ = ["MAX_EXACT_ACTIONS", "ExactResult", "exact_schedule", "require_solver"]
