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

The loop runs compiled by numba where it imports (`list_compiled.py`: the same schedule bit for
bit, tens of times faster); the Python loop here is its reference and its fallback.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from octopipe.actions import B_CODE, F_CODE, I_CODE, KINDS, W_CODE, Action
from octopipe.compiled import compiled
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
    S = len(stages)
    if len(rules.inflight) != S:
        raise ValueError(f"rules give {len(rules.inflight)} in-flight caps for {S} stages")
    run = _compiled() or _run
    return run(stages, num_devices, num_microbatches, rules, give_up_after)


def _compiled():
    """The compiled loop (`list_compiled.py`), or None (`octopipe.compiled`)."""
    return compiled("octopipe.schedules.list_compiled", "list_schedule_compiled")


def _run(
    stages: Sequence[StageCost], nd: int, M: int, rules: Rules, give_up_after: float
) -> ListSchedule | None:
    """One run of the event-driven list scheduler, written as one loop over local names.

    F and backward of a stage go in microbatch order; the candidates of a free device are thus
    one F and one backward per stage it holds, plus its oldest deferred W. This loop is the
    tuner's inner loop (millions of actions a search) where numba is missing: the choosing and
    running of an action are written inline, on plain lists, because calls and attribute
    look-ups were most of its cost; tests/test_list_scheduler.py holds it to the rules above,
    tests/test_list_compiled.py the compiled loop to it.
    """
    S = len(stages)
    split, defer_w = rules.split_backward, rules.defer_w
    backward_first, oldest_first = rules.backward_first, rules.oldest_first
    reduce_early = rules.reduce_early
    device_of = [st.device for st in stages]
    cap = [max(1, c) for c in rules.inflight]
    budget = list(rules.memory_budget) if rules.memory_budget else [INF] * nd
    on_device = [[s for s in range(S) if device_of[s] == d] for d in range(nd)]
    if not oldest_first:
        for owned in on_device:
            owned.reverse()  # deepest stage first
    # Each stage's figures by kind, and the lag of the gradient back to the stage before.
    d_f = [st.duration[F_CODE] for st in stages]
    d_i = [st.duration[I_CODE] for st in stages]
    d_w = [st.duration[W_CODE] for st in stages]
    d_b = [st.duration[B_CODE] for st in stages]
    m_f = [st.memory_change[F_CODE] for st in stages]
    m_i = [st.memory_change[I_CODE] for st in stages]
    m_w = [st.memory_change[W_CODE] for st in stages]
    m_b = [st.memory_change[B_CODE] for st in stages]
    lag_next = [st.lag_next for st in stages]
    act = [st.act for st in stages]
    # When each F and each backward may start as far as dependencies go, by s * M + m.
    f_ready = [0.0] * M + [INF] * ((S - 1) * M)
    b_ready = [INF] * (S * M)
    next_f = [0] * S
    next_bwd = [0] * S
    pending_w: list[deque[tuple[int, int]]] = [deque() for _ in range(nd)]
    urgent_w = [0] * nd  # reduce_early: leading pending W that go before all else
    tail_w = list(rules.tail_w) if rules.tail_w else [0] * nd
    # Per device: F and backward actions still to run (its W are all that is left at 0).
    left_fb = [2 * M * len(owned) for owned in on_device]
    memory_waits = [0] * nd
    last_backward = [0.0] * S
    level = [0.0] * nd
    peak = [0.0] * nd
    free_at = [0.0] * nd
    busy = [0.0] * nd
    orders: list[list[tuple[int, int, int]]] = [[] for _ in range(nd)]
    wakeups: list[tuple[float, int]] = [(0.0, d) for d in range(nd)]
    remaining = S * M * (3 if split else 2)
    last = S - 1
    push, pop = heapq.heappush, heapq.heappop

    while remaining:
        if not wakeups:
            raise DeadlockError("list scheduler: no device can make progress")
        now, d = pop(wakeups)
        if now > give_up_after:
            return None
        if free_at[d] > now:
            continue
        pending = pending_w[d]
        kind = -1  # what runs: F_CODE, or I/B (a backward), W_CODE; -1 nothing
        s = -1
        if urgent_w[d] or (pending and not defer_w):
            kind = W_CODE
        else:
            memory_blocked = False  # an F was held back for memory
            for turn in (0, 1, 2):
                if turn == 1:  # forward
                    best, best_mb = -1, M
                    for t in on_device[d]:
                        m = next_f[t]
                        if m >= M or m > best_mb:
                            continue
                        inflight = m - next_bwd[t]
                        if inflight >= cap[t] or f_ready[t * M + m] > now:
                            continue
                        # Over budget, F waits for deferred W to free memory; with none to
                        # run, a stage's first microbatch in flight is admitted anyway, so a
                        # tight budget cannot deadlock.
                        if (inflight or pending) and level[d] + act[t] > budget[d]:
                            memory_blocked = True
                            memory_waits[d] += 1
                            continue
                        best, best_mb = t, m
                        if not oldest_first:
                            break
                    if best >= 0:
                        kind, s = F_CODE, best
                        break
                elif (turn == 0) == backward_first:  # backward, before or after the forward
                    best, best_mb = -1, M
                    for t in on_device[d]:
                        m = next_bwd[t]
                        if m >= next_f[t] or m > best_mb or b_ready[t * M + m] > now:
                            continue
                        best, best_mb = t, m
                        if not oldest_first:
                            break
                    if best >= 0:
                        s = best
                        kind = B_CODE
                        # An I that holds more than its F did (a stage recomputing W's
                        # inputs) with no room left: a deferred W first, to make room.
                        if split and pending:
                            rise = m_i[s]
                            if rise > 0 and level[d] + rise > budget[d]:
                                memory_waits[d] += 1
                                kind = W_CODE
                        break
            if kind < 0 and pending:
                if len(pending) > tail_w[d] or memory_blocked or not left_fb[d]:
                    kind = W_CODE
        if kind < 0:
            continue

        # Run the chosen action: its order, end, memory, and whom its end wakes.
        if kind == F_CODE:
            m = next_f[s]
            next_f[s] = m + 1
            left_fb[d] -= 1
            duration, delta, action = d_f[s], m_f[s], (s, F_CODE, m)
        elif kind == W_CODE:
            s, m = pending.popleft()
            if urgent_w[d]:
                urgent_w[d] -= 1
            duration, delta, action = d_w[s], m_w[s], (s, W_CODE, m)
        else:
            m = next_bwd[s]
            next_bwd[s] = m + 1
            left_fb[d] -= 1
            if split:
                duration, delta, action = d_i[s], m_i[s], (s, I_CODE, m)
            else:
                duration, delta, action = d_b[s], m_b[s], (s, B_CODE, m)
        end = now + duration
        orders[d].append(action)
        free_at[d] = end
        busy[d] += duration
        lv = level[d] + delta
        level[d] = lv
        if lv > peak[d]:
            peak[d] = lv
        remaining -= 1
        push(wakeups, (end, d))
        if kind == F_CODE:
            if s < last:
                at = end + lag_next[s]
                f_ready[(s + 1) * M + m] = at
                push(wakeups, (at, device_of[s + 1]))
            else:  # the loss is part of the last stage: its backward may follow at once
                b_ready[s * M + m] = end
        elif kind == W_CODE:
            if end > last_backward[s]:
                last_backward[s] = end
        else:
            if split:
                pending.append((s, m))
                if reduce_early and m == M - 1:
                    # Stage s's pending W to the front, to run before anything else.
                    mine = [x for x in pending if x[0] == s]
                    pending = deque([*mine, *(x for x in pending if x[0] != s)])
                    pending_w[d] = pending
                    urgent_w[d] += len(mine)
            else:
                last_backward[s] = end
            if s > 0:
                # Its F ran before the F (hence the backward) of this stage: only the gradient
                # waits.
                at = end + lag_next[s - 1]
                b_ready[(s - 1) * M + m] = at
                push(wakeups, (at, device_of[s - 1]))

    makespan = max(free_at, default=0.0)
    if makespan > give_up_after:
        return None
    return ListSchedule(
        codes=tuple(tuple(acts) for acts in orders),
        makespan=makespan,
        busy=tuple(busy),
        peak_activation_bytes=tuple(peak),
        last_backward=tuple(last_backward),
        device_ends=tuple(free_at),
        memory_waits=tuple(memory_waits),
    )
