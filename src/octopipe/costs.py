"""The cost layer: what a profile's stages cost, under docs/FORMATS.md's default semantics.

Below the simulator, the schedules and the tuner, and shared by all of them:

- `CostTable`: prefix sums over a profile's layers, so any stage's times and bytes are O(1)
  for any partition;
- `StageCost`: one stage on its device, and the per-kind rules every timing engine applies
  (`duration[kind.code]`, `memory_change[kind.code]`, the transfer `lag_next`); the simulator
  (`sim/graph.py`) and the list scheduler (`schedules/list_scheduler.py`) read these tables
  instead of encoding B = b + w, the memory steps or the lags themselves;
- `stage_costs`, `static_bytes`: a partition + placement turned into those;
- `reduction_times`, `reduction_windows`: the data-parallel gradient all-reduces and when each
  device runs them.

Why shared rules and not one engine with an ordering policy: the simulator times a fixed order
in a tight sweep over integer ids (about a million actions a second), the list scheduler picks
the next action event by event; one engine would put the scheduler's bookkeeping in the
simulator's inner loop. What must agree between them, durations, memory steps and lags, is
computed here once, and tests/test_list_scheduler.py checks that both give the same makespan.
Nothing here orders or times actions.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import accumulate

from octopipe.profile import Device, Profile


class CostTable:
    """Prefix sums over a profile's layers, so any stage's cost is O(1) for any partition.

    `action_overhead` (seconds, default 0: the default semantics) is an option beyond them: a
    fixed cost every action (F, I, W, B) pays on top of its layers' times, such as an executor's
    per-action bookkeeping and the cost of waking up after a wait.
    """

    def __init__(self, profile: Profile, action_overhead: float = 0.0):
        if not (math.isfinite(action_overhead) and action_overhead >= 0.0):
            raise ValueError(f"action overhead must be a finite number >= 0, got {action_overhead}")
        layers = profile.layers
        self.profile = profile
        self.action_overhead = action_overhead
        self.f = prefix_sums(l.f for l in layers)
        self.b = prefix_sums(l.b for l in layers)
        self.w = prefix_sums(l.w for l in layers)
        self.work = [f + b + w for f, b, w in zip(self.f, self.b, self.w)]  # prefix of f + b + w
        self.act = prefix_sums(l.act_bytes for l in layers)
        self.wact = prefix_sums(l.wact_bytes for l in layers)
        self.param = prefix_sums(l.param_bytes for l in layers)
        self.grad = prefix_sums(l.grad_bytes for l in layers)
        self.out_bytes = [l.out_bytes for l in layers]
        self.num_layers = len(layers)

    def stage_times(self, start: int, end: int) -> tuple[float, float, float]:
        """(f, b, w) of layers [start, end) on a device of speed 1."""
        return (
            self.f[end] - self.f[start],
            self.b[end] - self.b[start],
            self.w[end] - self.w[start],
        )

    def boundary_bytes(self, end: int) -> int:
        """Bytes crossing the boundary after layer `end - 1`, both ways (activation, gradient)."""
        return self.out_bytes[end - 1]


def prefix_sums(values: Iterable[float]) -> list[float]:
    """[0, v0, v0 + v1, ...]: the sum over [i, j) is p[j] - p[i]."""
    return [0, *accumulate(values)]


@dataclass(frozen=True)
class StageCost:
    """One stage as its device sees it: op seconds at the device's speed, activation bytes.

    `duration` and `memory_change` are indexed by `Kind.code` (F, I, W, B): the seconds an
    action of that kind runs, and how it changes its device's activation memory (F takes
    `act`; I frees all but `wact`; W frees `wact`; B frees `act`).
    """

    device: int
    f: float
    i: float  # backward for the input
    w: float  # backward for the weights
    act: float  # held from F until the backward
    wact: float  # of which still held after I until W
    lag_next: float  # transfer to the next stage (0 on the same device or for the last stage)
    overhead: float = 0.0  # fixed cost of one action, included in f, i and w

    @property
    def work(self) -> float:
        return self.f + self.i + self.w

    @property
    def full_backward(self) -> float:
        """B: the input and weight gradients in one action (one overhead, not two)."""
        return self.i + self.w - self.overhead

    @cached_property  # read in the schedulers' inner loops: built once per stage
    def duration(self) -> tuple[float, float, float, float]:
        return (self.f, self.i, self.w, self.full_backward)

    @cached_property
    def memory_change(self) -> tuple[float, float, float, float]:
        return (self.act, self.wact - self.act, -self.wact, -self.act)


def stage_costs(
    costs: CostTable,
    ranges: Sequence[tuple[int, int]],
    placement: Sequence[int],
    devices: Sequence[Device],
) -> tuple[StageCost, ...]:
    """The StageCost of each stage of a partition + placement (durations divided by speed;
    a transfer takes the link between the two devices, `Profile.link_between`)."""
    out = []
    last = len(ranges) - 1
    extra = costs.action_overhead
    for s, ((a, b), d) in enumerate(zip(ranges, placement, strict=True)):
        f, bi, bw = costs.stage_times(a, b)
        speed = devices[d].speed
        crosses = s < last and placement[s + 1] != d
        lag = 0.0
        if crosses:
            link = costs.profile.link_between(devices[d], devices[placement[s + 1]])
            lag = link.transfer_time(costs.boundary_bytes(b))
        out.append(
            StageCost(
                device=d,
                f=f / speed + extra,
                i=bi / speed + extra,
                w=bw / speed + extra,
                act=costs.act[b] - costs.act[a],
                wact=costs.wact[b] - costs.wact[a],
                lag_next=lag,
                overhead=extra,
            )
        )
    return tuple(out)


def reduction_times(costs: CostTable, ranges: Sequence[tuple[int, int]]) -> tuple[float, ...]:
    """Per stage: the seconds of its gradients' all-reduce across the data-parallel replicas
    (0 with one replica or no `grad_bytes`)."""
    dp = costs.profile.data_parallel
    return tuple(dp.allreduce_time(costs.grad[b] - costs.grad[a]) for a, b in ranges)


def reduction_windows(
    ready: Sequence[float], reduce_time: Sequence[float], placement: Sequence[int]
) -> list[tuple[int, int, float, float]]:
    """(device, stage, start, end) of each stage's all-reduce, given when each stage's last
    backward action ended (`ready`): a device runs its reductions one at a time, in the order
    they become ready, ties lower stage first (docs/FORMATS.md). Stages without one are left
    out. The one home of this rule: the simulator and the tuner's evaluator both call it."""
    out = []
    by_device: dict[int, list[tuple[float, int]]] = {}
    for s, d in enumerate(placement):
        if reduce_time[s] > 0:
            by_device.setdefault(d, []).append((ready[s], s))
    for d in sorted(by_device):
        t = 0.0
        for at, s in sorted(by_device[d]):
            t = max(t, at)
            out.append((d, s, t, t + reduce_time[s]))
            t += reduce_time[s]
    return out


def static_bytes(
    costs: CostTable, ranges: Sequence[tuple[int, int]], placement: Sequence[int], num_devices: int
) -> list[float]:
    """Per device: the `param_bytes` of the layers of its stages."""
    static = [0.0] * num_devices
    for (a, b), d in zip(ranges, placement, strict=True):
        static[d] += costs.param[b] - costs.param[a]
    return static
