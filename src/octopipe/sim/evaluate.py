"""Evaluate a compiled graph: start/end times, memory levels, bubbles, critical path.

Each device runs its actions one at a time in its order; an action starts when its device is free
and every dependency has ended (plus the transfer lag). A sweep advances each device as far as its
dependencies allow and repeats until all actions ran; a sweep without progress is a deadlock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

from octopipe.actions import B_CODE, NUM_KINDS, W_CODE, Action, Event
from octopipe.costs import reduction_windows
from octopipe.errors import DeadlockError
from octopipe.sim.graph import NO_DEP, Graph, action_of


@dataclass(frozen=True)
class Reduction:
    """One stage's data-parallel gradient all-reduce on its device: start and end seconds."""

    device: int
    stage: int
    start: float
    end: float


@dataclass(frozen=True)
class SteadyState:
    """How a run of overlapped steps settled: the result's iteration_time is `step_time`."""

    step_time: float  # seconds per step in steady state
    first_step_time: float  # the first step's end, as one synchronous step would take
    steps_simulated: int
    period: int  # steps after which the per-step increments repeat (0: not settled)

    @property
    def converged(self) -> bool:
        return self.period > 0


@dataclass(frozen=True)
class SimResult:
    iteration_time: float
    busy: tuple[float, ...]  # per device: seconds computing
    peak_memory_bytes: tuple[float, ...]  # per device: static + highest dynamic level
    static_memory_bytes: tuple[float, ...]
    capacity_bytes: tuple[float, ...]
    lower_bound: float  # physical limit of the iteration time (docs/FORMATS.md)
    critical_path: tuple[Action, ...]  # from the first action to the last, the binding chain
    end_memory_bytes: tuple[float, ...]  # per device after the last action: static if balanced
    # (device orders as action ids, start per id, end per id, microbatches): events on demand.
    _timing: tuple | None = field(default=None, repr=False, compare=False)
    # Data parallelism: each stage's gradient all-reduce (none with one replica).
    reductions: tuple[Reduction, ...] = ()
    watched_ends: tuple[float, ...] = field(default=(), repr=False, compare=False)
    # Overlapped steps (sim/steps.py): None for one synchronous step.
    steady: SteadyState | None = None

    @cached_property
    def events(self) -> tuple[Event, ...]:
        """Every action with its device, start and end, device by device (empty without detail)."""
        if self._timing is None:
            return ()
        orders, start, end, M = self._timing
        return tuple(
            Event(d, action_of(aid, M), start[aid], end[aid])
            for d, ids in enumerate(orders)
            for aid in ids
        )

    @property
    def num_devices(self) -> int:
        return len(self.busy)

    @property
    def idle(self) -> tuple[float, ...]:
        return tuple(self.iteration_time - b for b in self.busy)

    @property
    def bubble_ratio(self) -> float:
        total = self.iteration_time * self.num_devices
        return sum(self.idle) / total if total > 0 else 0.0

    @property
    def efficiency(self) -> float:
        return self.lower_bound / self.iteration_time if self.iteration_time > 0 else 1.0

    @property
    def fits_per_device(self) -> tuple[bool, ...]:
        return tuple(p <= c for p, c in zip(self.peak_memory_bytes, self.capacity_bytes))

    @property
    def fits(self) -> bool:
        return all(self.fits_per_device)

    @property
    def memory_excess_bytes(self) -> tuple[float, ...]:
        """Per device: how much more memory it would need (0 where it fits)."""
        return memory_excess(self.peak_memory_bytes, self.capacity_bytes)

    @property
    def rank(self) -> tuple[int, float, float]:
        return plan_rank(self.iteration_time, self.memory_excess_bytes)

    def predicted(self) -> dict:
        """The `predicted` block of a plan file."""
        return {
            "iteration_time": self.iteration_time,
            "peak_memory_bytes": list(self.peak_memory_bytes),
            "bubble_ratio": self.bubble_ratio,
            "efficiency": self.efficiency,
            "fits": self.fits,
            **({"step_time": self.steady.step_time} if self.steady else {}),
        }

    def summary(self) -> dict:
        """Everything a report or `--json` needs, as plain JSON values."""
        return {
            **self.predicted(),
            "lower_bound": self.lower_bound,
            "busy": list(self.busy),
            "idle": list(self.idle),
            "static_memory_bytes": list(self.static_memory_bytes),
            "capacity_bytes": [c if c != float("inf") else None for c in self.capacity_bytes],
            "fits_per_device": list(self.fits_per_device),
            "critical_path": [str(a) for a in self.critical_path],
            **({"reductions": [vars(r) for r in self.reductions]} if self.reductions else {}),
            **(self._steady_summary() if self.steady else {}),
        }

    def _steady_summary(self) -> dict:
        st = self.steady
        assert st is not None
        return {
            "step_time": st.step_time,
            "first_step_time": st.first_step_time,
            "steps_simulated": st.steps_simulated,
            "step_time_converged": st.converged,
        }


def memory_excess(peaks: tuple[float, ...], capacity: tuple[float, ...]) -> tuple[float, ...]:
    """Per device: how far the peak exceeds the capacity (0 where it fits)."""
    return tuple(max(0.0, p - c) for p, c in zip(peaks, capacity))


def plan_rank(iteration_time: float, excess: tuple[float, ...]) -> tuple[int, float, float]:
    """Lower is better: plans that fit, by time; the others by largest shortfall, then time."""
    if not any(excess):
        return (0, 0.0, iteration_time)
    return (1, max(excess), iteration_time)


def evaluate(
    graph: Graph, lower_bound: float, detail: bool = True, watch: Sequence[int] = ()
) -> SimResult:
    """Time and memory of `graph`. `detail=False` skips events and the critical path (search);
    `watch` lists action ids whose end times the result reports (`watched_ends`)."""
    rows = graph.rows
    nd = len(rows)
    end = [-1.0] * graph.num_ids
    cause = [NO_DEP] * graph.num_ids if detail else None
    start_of = [0.0] * graph.num_ids if detail else None
    ptr = [0] * nd
    free_at = [0.0] * nd
    last = [NO_DEP] * nd
    busy = [0.0] * nd
    remaining = sum(len(r) for r in rows)

    while remaining:
        progressed = False
        for d in range(nd):
            row = rows[d]
            p = ptr[d]
            if p == len(row):
                continue
            t = free_at[d]
            prev = last[d]
            n = len(row)
            while p < n:
                aid, dur, d1, l1, d2, l2 = row[p]
                t0 = t
                why = prev
                if d1 != NO_DEP:
                    e = end[d1]
                    if e < 0.0:
                        break
                    e += l1
                    if e > t0:
                        t0, why = e, d1
                if d2 != NO_DEP:
                    e = end[d2]
                    if e < 0.0:
                        break
                    e += l2
                    if e > t0:
                        t0, why = e, d2
                t = t0 + dur
                end[aid] = t
                busy[d] += dur
                if detail:
                    start_of[aid] = t0
                    cause[aid] = why
                prev = aid
                p += 1
            if p != ptr[d]:
                remaining -= p - ptr[d]
                ptr[d] = p
                free_at[d] = t
                last[d] = prev
                progressed = True
        if not progressed:
            raise DeadlockError(_deadlock_message(graph, ptr, end))

    reductions = _reductions(graph, end) if graph.reduces else ()
    makespan = max([*free_at, *(r.end for r in reductions)]) if nd else 0.0
    peaks, ends = _memory_levels(graph)
    capacity = tuple(dev.memory_bytes for dev in graph.devices)
    M = graph.plan.num_microbatches
    timing = None
    path: tuple[Action, ...] = ()
    if detail:
        timing = (tuple(tuple(r[0] for r in row) for row in rows), start_of, end, M)
        path = _critical_path(end, cause, M)
    return SimResult(
        iteration_time=makespan,
        busy=tuple(busy),
        peak_memory_bytes=peaks,
        static_memory_bytes=tuple(float(s) for s in graph.static_bytes),
        capacity_bytes=capacity,
        lower_bound=lower_bound,
        critical_path=path,
        end_memory_bytes=ends,
        _timing=timing,
        reductions=reductions,
        watched_ends=tuple(end[aid] for aid in watch),
    )


def _reductions(graph: Graph, end: list[float]) -> tuple[Reduction, ...]:
    """Each stage's gradient reductions (one, or one per bucket) start on its device once the
    gradients are computed: at the end of the stage's last backward action (B or W), or, for
    a bucket, when that action has filled it; a device runs its reductions one at a time, in
    the order they become ready (ties: lower stage first), beside its compute
    (docs/FORMATS.md)."""
    M, K = graph.plan.num_microbatches, NUM_KINDS
    last = [(0.0, False)] * len(graph.buckets)
    for row in graph.rows:
        for r in row:
            aid = r[0]
            if aid % K in (W_CODE, B_CODE):
                s = aid // (M * K)
                if end[aid] >= last[s][0]:
                    last[s] = (end[aid], aid % K == W_CODE)
    ends = None
    if graph.reduce_at_end:  # every reduction waits for its device's last action
        ends = [end[row[-1][0]] if row else 0.0 for row in graph.rows]
    windows = reduction_windows(last, graph.buckets, graph.plan.placement, ends)
    return tuple(Reduction(*w) for w in windows)


def _memory_levels(graph: Graph) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per device: static plus the highest activation level, and the level after the last
    action, walking each device's order (a device's memory changes only by its own actions)."""
    delta = graph.mem_delta
    peaks, ends = [], []
    for d, row in enumerate(graph.rows):
        level = top = 0
        for r in row:
            level += delta[r[0]]
            if level > top:
                top = level
        peaks.append(float(graph.static_bytes[d] + top))
        ends.append(float(graph.static_bytes[d] + level))
    return tuple(peaks), tuple(ends)


def _critical_path(end: list[float], cause: list[int], M: int) -> tuple[Action, ...]:
    aid = max(range(len(end)), key=end.__getitem__)
    chain = []
    while aid != NO_DEP:
        chain.append(action_of(aid, M))
        aid = cause[aid]
    return tuple(reversed(chain))


def _deadlock_message(graph: Graph, ptr: list[int], end: list[float]) -> str:
    M = graph.plan.num_microbatches
    waits = []
    for d, row in enumerate(graph.rows):
        if ptr[d] == len(row):
            continue
        aid, _, d1, _, d2, _ = row[ptr[d]]
        missing = [str(action_of(x, M)) for x in (d1, d2) if x != NO_DEP and end[x] < 0.0]
        waits.append(f"device {d}: {action_of(aid, M)} waits for {', '.join(missing)}")
    return "deadlock: the schedule's dependencies form a cycle; " + "; ".join(waits)
