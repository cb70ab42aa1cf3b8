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

The event loop itself is `list_loop.py`'s, on arrays, compiled by numba where it imports.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from octopipe.actions import KINDS, Action
from octopipe.costs import StageCost
from octopipe.errors import DeadlockError

if TYPE_CHECKING:
    import numpy as np

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


@dataclass(frozen=True, eq=False)
class ListSchedule:
    """The scheduler's orders, with its own estimate of time and activation peaks."""

    # One (stage, kind code, mb) row per action, device 0's first, `row_counts[d]` of them a
    # device: kept as the loop wrote them, `codes` built on demand (a search discards most).
    rows: np.ndarray = field(repr=False)
    row_counts: tuple[int, ...]
    makespan: float
    busy: tuple[float, ...]
    peak_activation_bytes: tuple[float, ...]
    last_backward: tuple[float, ...]  # per stage: when its last B or W ends (its all-reduce)
    device_ends: tuple[float, ...] = ()  # per device: when its last action ends
    memory_waits: tuple[int, ...] = ()  # per device: how often memory held an action back

    @cached_property
    def codes(self) -> tuple[tuple[tuple[int, int, int], ...], ...]:
        """Per device: (stage, kind code, mb). Plain ints: millions of these tuples stay out of
        the garbage collector's way (a tuple holding an enum member is tracked, one of ints
        is not)."""
        rows, out, at = self.rows.tolist(), [], 0
        for n in self.row_counts:
            out.append(tuple(map(tuple, rows[at : at + n])))
            at += n
        return tuple(out)

    def _figures(self) -> tuple:
        return (
            self.codes,
            self.makespan,
            self.busy,
            self.peak_activation_bytes,
            self.last_backward,
            self.device_ends,
            self.memory_waits,
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ListSchedule) and self._figures() == other._figures()

    __hash__ = None  # equal by value, not hashable (as a dataclass with eq)

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

    F and backward of a stage go in microbatch order; the candidates of a free device are thus
    one F and one backward per stage it holds, plus its oldest deferred W. The event loop is
    `list_loop.schedule_loop`, on arrays (compiled: the tuner's inner loop);
    tests/test_list_scheduler.py holds it to the rules above.
    """
    import numpy as np

    from octopipe.schedules.list_loop import DEADLOCK, GAVE_UP, schedule_loop

    S, nd, M = len(stages), num_devices, num_microbatches
    if len(rules.inflight) != S:
        raise ValueError(f"rules give {len(rules.inflight)} in-flight caps for {S} stages")
    device_of = np.fromiter((st.device for st in stages), np.int64, S)
    owned = [[s for s in range(S) if device_of[s] == d] for d in range(nd)]
    if not rules.oldest_first:
        for stages_of in owned:
            stages_of.reverse()  # deepest stage first
    owned_start = np.zeros(nd + 1, np.int64)
    owned_start[1:] = np.cumsum([len(o) for o in owned])
    per_stage = 3 if rules.split_backward else 2
    order_start = owned_start[:-1] * (M * per_stage)  # device d's rows, in one array
    orders = np.empty((S * M * per_stage, 3), np.int64)
    order_len = np.zeros(nd, np.int64)
    busy, peak, free_at = np.zeros(nd), np.zeros(nd), np.zeros(nd)
    last_backward = np.zeros(S)
    memory_waits = np.zeros(nd, np.int64)
    status = schedule_loop(
        device_of,
        np.array([max(1, c) for c in rules.inflight], np.int64),
        np.array([s for o in owned for s in o], np.int64),
        owned_start,
        np.array(rules.memory_budget if rules.memory_budget else [INF] * nd, np.float64),
        np.array(rules.tail_w if rules.tail_w else [0] * nd, np.int64),
        np.array([st.duration for st in stages], np.float64).reshape(S, 4),
        np.array([st.memory_change for st in stages], np.float64).reshape(S, 4),
        np.array([st.lag_next for st in stages], np.float64),
        np.array([st.act for st in stages], np.float64),
        M,
        rules.split_backward,
        rules.defer_w,
        rules.backward_first,
        rules.oldest_first,
        rules.reduce_early,
        float(give_up_after),
        orders,
        order_start,
        order_len,
        busy,
        peak,
        last_backward,
        free_at,
        memory_waits,
    )
    if status == DEADLOCK:
        raise DeadlockError("list scheduler: no device can make progress")
    makespan = float(free_at.max()) if nd else 0.0
    if status == GAVE_UP or makespan > give_up_after:
        return None
    # Done, every device ran its whole block of rows: the blocks lie back to back.
    return ListSchedule(
        rows=orders,
        row_counts=tuple(order_len.tolist()),
        makespan=makespan,
        busy=tuple(busy.tolist()),
        peak_activation_bytes=tuple(peak.tolist()),
        last_backward=tuple(last_backward.tolist()),
        device_ends=tuple(free_at.tolist()),
        memory_waits=tuple(memory_waits.tolist()),
    )
