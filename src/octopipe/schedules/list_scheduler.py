"""Memory-aware list scheduler: per-device orders for any partition and placement.

Given the stages (their durations on their devices, activation sizes, transfer lags) and a set of
`Rules`, it simulates the devices event by event and, whenever a device is free, runs the ready
action that the rules rank first. The rules are what a tuner turns:

- `split_backward`: backward as I then W (zero-bubble family) or as one B (1F1B family);
- `inflight`: per stage, how many microbatches may sit between their F and their backward
  (the warm-up depth; a 1F1B stage s of S has S - s);
- `defer_w`: W waits until its device has nothing else ready (filling bubbles) or memory forces it;
- `backward_first` and `oldest_first`: the ranking of ready backward and forward actions;
- `memory_budget`: per device, activation bytes that may be held at once (an F waits for room;
  so does an I that holds more than its F did, a recomputing stage's, while W can free some);
- `tail_w`: per device, how many deferred W to keep for the end of the step rather than spend
  on idle time within it (run earlier only when memory needs them): with steps overlapped,
  they fill the wait for the next step's first forwards;
- `reduce_early`: once a stage's last I has run, its deferred W run before anything else of its
  device, so the stage's data-parallel all-reduce can start under the device's remaining work.

With one stage per device, `inflight = S - s`, `backward_first` and no split the orders are
1F1B's; with the split and `defer_w` they are ZB-H1-like. Durations, memory changes and lags are the
cost layer's (`StageCost.duration`, `.memory_change`, `.lag_next`), the same tables the simulator
lowers a plan with, so the simulator reproduces the scheduler's makespan; still, callers report
the simulator's figures, not this module's. This module does not search (see `octopipe.tuner`).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from octopipe.actions import B_CODE, F_CODE, I_CODE, KINDS, W_CODE, Action
from octopipe.costs import StageCost
from octopipe.errors import DeadlockError

INF = float("inf")


@dataclass(frozen=True)
class Rules:
    """Priorities and limits of the list scheduler (see the module docstring)."""

    inflight: tuple[int, ...]  # per stage, >= 1
    split_backward: bool = True
    defer_w: bool = True
    backward_first: bool = True
    oldest_first: bool = True  # among ready actions of a kind: lowest mb first, else deepest stage
    memory_budget: tuple[float, ...] | None = None  # per device, bytes of activations
    reduce_early: bool = False
    tail_w: tuple[int, ...] | None = None  # per device


@dataclass(frozen=True)
class ListSchedule:
    """The scheduler's orders, with its own estimate of time and activation peaks."""

    # Per device: (stage, kind code, mb). Plain ints: millions of these tuples stay out of the
    # garbage collector's way (a tuple holding an enum member is tracked, one of ints is not).
    codes: tuple[tuple[tuple[int, int, int], ...], ...]
    makespan: float
    busy: tuple[float, ...]
    peak_activation_bytes: tuple[float, ...]
    last_backward: tuple[float, ...]  # per stage: when its last B or W ends (its all-reduce)
    device_ends: tuple[float, ...] = ()  # per device: when its last action ends
    memory_waits: tuple[int, ...] = ()  # per device: how often memory held an action back

    @property
    def orders(self) -> dict[int, tuple[Action, ...]]:
        """Per device, its actions in order (built on demand: a search discards most schedules)."""
        return {
            d: tuple(Action(s, KINDS[k], m) for s, k, m in acts)
            for d, acts in enumerate(self.codes)
        }


def list_schedule(
    stages: Sequence[StageCost],
    num_devices: int,
    num_microbatches: int,
    rules: Rules,
    give_up_after: float = INF,
) -> ListSchedule | None:
    """Per-device orders for `stages` under `rules`; every device appears in the result.

    With `give_up_after`, returns None as soon as the schedule is sure to end later than that
    (a search that only keeps improvements need not finish a worse candidate).
    """
    return _Scheduler(stages, num_devices, num_microbatches, rules).run(give_up_after)


class _Scheduler:
    """One run of the event-driven list scheduler (state lives here, not in module globals).

    F and backward of a stage go in microbatch order; the candidates of a free device are thus
    one F and one backward per stage it holds, plus its oldest deferred W.
    """

    def __init__(self, stages: Sequence[StageCost], nd: int, M: int, rules: Rules):
        S = len(stages)
        if len(rules.inflight) != S:
            raise ValueError(f"rules give {len(rules.inflight)} in-flight caps for {S} stages")
        self.stages, self.nd, self.M, self.S, self.rules = stages, nd, M, S, rules
        # The rules and the stages' figures as plain attributes and lists: the loop below runs
        # millions of times in a search, and attribute chains are most of its cost.
        self.split, self.defer_w = rules.split_backward, rules.defer_w
        self.backward_first, self.oldest_first = rules.backward_first, rules.oldest_first
        self.reduce_early = rules.reduce_early
        self.device_of = [st.device for st in stages]
        self.cap = [max(1, c) for c in rules.inflight]
        self.budget = list(rules.memory_budget) if rules.memory_budget else [INF] * nd
        self.on_device = [[s for s in range(S) if stages[s].device == d] for d in range(nd)]
        if not rules.oldest_first:
            for owned in self.on_device:
                owned.reverse()  # deepest stage first
        self.act = [st.act for st in stages]
        # When each F and each backward may start as far as dependencies go, by s * M + m.
        self.f_ready = [0.0] * M + [INF] * ((S - 1) * M)
        self.b_ready = [INF] * (S * M)
        self.next_f = [0] * S
        self.next_bwd = [0] * S
        self.pending_w: list[deque[tuple[int, int]]] = [deque() for _ in range(nd)]
        self.urgent_w = [0] * nd  # reduce_early: leading pending W that go before all else
        self.tail_w = list(rules.tail_w) if rules.tail_w else [0] * nd
        # Per device: F and backward actions still to run (its W are all that is left at 0).
        self.left_fb = [2 * M * len(owned) for owned in self.on_device]
        self.memory_blocked = False  # the last _ready_forward skipped an F for memory
        self.memory_waits = [0] * nd
        self.last_backward = [0.0] * S
        self.level = [0.0] * nd
        self.peak = [0.0] * nd
        self.free_at = [0.0] * nd
        self.busy = [0.0] * nd
        self.orders: list[list[tuple[int, int, int]]] = [[] for _ in range(nd)]
        self.wakeups: list[tuple[float, int]] = [(0.0, d) for d in range(nd)]
        self.remaining = S * M * (3 if rules.split_backward else 2)

    def run(self, give_up_after: float) -> ListSchedule | None:
        wakeups, free_at, dispatch = self.wakeups, self.free_at, self._dispatch
        while self.remaining:
            if not wakeups:
                raise DeadlockError("list scheduler: no device can make progress")
            now, d = heapq.heappop(wakeups)
            if now > give_up_after:
                return None
            if free_at[d] <= now:
                dispatch(d, now)
        makespan = max(free_at, default=0.0)
        if makespan > give_up_after:
            return None
        return ListSchedule(
            codes=tuple(tuple(acts) for acts in self.orders),
            makespan=makespan,
            busy=tuple(self.busy),
            peak_activation_bytes=tuple(self.peak),
            last_backward=tuple(self.last_backward),
            device_ends=tuple(free_at),
            memory_waits=tuple(self.memory_waits),
        )

    # --- choosing ------------------------------------------------------------------------

    def _dispatch(self, d: int, now: float) -> None:
        """Start the best ready action on free device `d`, if any."""
        pending = self.pending_w[d]
        if self.urgent_w[d] or (pending and not self.defer_w):
            self._run_w(d, now)
            return
        if self.backward_first:
            s = self._ready_backward(d, now)
            if s is not None:
                self._run_backward_or_free(s, d, now)
                return
        s = self._ready_forward(d, now)
        if s is not None:
            self._run_forward(s, d, now)
            return
        if not self.backward_first:
            s = self._ready_backward(d, now)
            if s is not None:
                self._run_backward_or_free(s, d, now)
                return
        if pending and (
            len(pending) > self.tail_w[d] or self.memory_blocked or not self.left_fb[d]
        ):
            self._run_w(d, now)

    def _ready_forward(self, d: int, now: float) -> int | None:
        M, next_f, next_bwd, f_ready = self.M, self.next_f, self.next_bwd, self.f_ready
        cap, oldest_first = self.cap, self.oldest_first
        best, best_mb = None, M
        self.memory_blocked = False
        for s in self.on_device[d]:
            m = next_f[s]
            if m >= M or m > best_mb:
                continue
            inflight = m - next_bwd[s]
            if inflight >= cap[s] or f_ready[s * M + m] > now:
                continue
            # Over budget, F waits for deferred W to free memory; with none to run, a stage's
            # first microbatch in flight is admitted anyway, so a tight budget cannot deadlock.
            if (inflight or self.pending_w[d]) and self.level[d] + self.act[s] > self.budget[d]:
                self.memory_blocked = True
                self.memory_waits[d] += 1
                continue
            if not oldest_first:
                return s
            best, best_mb = s, m
        return best

    def _ready_backward(self, d: int, now: float) -> int | None:
        M, next_f, next_bwd, b_ready = self.M, self.next_f, self.next_bwd, self.b_ready
        oldest_first = self.oldest_first
        best, best_mb = None, M
        for s in self.on_device[d]:
            m = next_bwd[s]
            if m >= next_f[s] or m > best_mb or b_ready[s * M + m] > now:
                continue
            if not oldest_first:
                return s
            best, best_mb = s, m
        return best

    # --- running -------------------------------------------------------------------------

    def _start(
        self, d: int, now: float, action: tuple[int, int, int], duration: float, mem_delta: float
    ) -> float:
        end = now + duration
        self.orders[d].append(action)
        self.free_at[d] = end
        self.busy[d] += duration
        level = self.level[d] + mem_delta
        self.level[d] = level
        if level > self.peak[d]:
            self.peak[d] = level
        self.remaining -= 1
        heapq.heappush(self.wakeups, (end, d))
        return end

    def _wake(self, stage: int, at: float) -> None:
        heapq.heappush(self.wakeups, (at, self.device_of[stage]))

    def _run_forward(self, s: int, d: int, now: float) -> None:
        st = self.stages[s]
        m = self.next_f[s]
        self.next_f[s] = m + 1
        self.left_fb[d] -= 1
        end = self._start(d, now, (s, F_CODE, m), st.duration[F_CODE], st.memory_change[F_CODE])
        if s + 1 < self.S:
            self.f_ready[(s + 1) * self.M + m] = end + st.lag_next
            self._wake(s + 1, end + st.lag_next)
        else:  # the loss is part of the last stage: its backward may follow at once
            self.b_ready[s * self.M + m] = end

    def _run_backward_or_free(self, s: int, d: int, now: float) -> None:
        """The backward of stage s, unless it is an I that holds more than its F did (a stage
        that recomputes W's inputs) with no room left: then a deferred W first, to make room."""
        if self.split and self.pending_w[d]:
            rise = self.stages[s].memory_change[I_CODE]
            if rise > 0 and self.level[d] + rise > self.budget[d]:
                self.memory_waits[d] += 1
                self._run_w(d, now)
                return
        self._run_backward(s, d, now)

    def _run_backward(self, s: int, d: int, now: float) -> None:
        st = self.stages[s]
        m = self.next_bwd[s]
        self.next_bwd[s] = m + 1
        self.left_fb[d] -= 1
        if self.split:
            end = self._start(d, now, (s, I_CODE, m), st.duration[I_CODE], st.memory_change[I_CODE])
            self.pending_w[d].append((s, m))
            if self.reduce_early and m == self.M - 1:
                self._hurry_w(s, d)
        else:
            end = self._start(d, now, (s, B_CODE, m), st.duration[B_CODE], st.memory_change[B_CODE])
            self.last_backward[s] = end
        if s > 0:
            # Its F ran before the F (hence the backward) of this stage: only the gradient waits.
            lag = self.stages[s - 1].lag_next
            self.b_ready[(s - 1) * self.M + m] = end + lag
            self._wake(s - 1, end + lag)

    def _hurry_w(self, s: int, d: int) -> None:
        """Move stage s's pending W to the front, to run before anything else (reduce_early)."""
        pending = self.pending_w[d]
        mine = [x for x in pending if x[0] == s]
        self.pending_w[d] = deque([*mine, *(x for x in pending if x[0] != s)])
        self.urgent_w[d] += len(mine)

    def _run_w(self, d: int, now: float) -> None:
        s, m = self.pending_w[d].popleft()
        if self.urgent_w[d]:
            self.urgent_w[d] -= 1
        st = self.stages[s]
        end = self._start(d, now, (s, W_CODE, m), st.duration[W_CODE], st.memory_change[W_CODE])
        self.last_backward[s] = max(self.last_backward[s], end)
