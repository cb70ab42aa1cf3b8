"""The cost layer: what a profile's stages cost, under docs/FORMATS.md's default semantics.

Below the simulator, the schedules and the tuner, and shared by all of them:

- `CostTable`: prefix sums over a profile's layers, so any stage's times and bytes are O(1)
  for any partition, with or without recomputation (`RecomputeTable`);
- `StageCost`: one stage on its device, and the per-kind rules every timing engine applies
  (`duration[kind.code]`, `memory_change[kind.code]`, the transfer `lag_next`); the simulator
  (`sim/graph.py`) and the list scheduler (`schedules/list_scheduler.py`) read these tables
  instead of encoding B = b + w, the memory steps or the lags themselves;
- `stage_costs`, `static_bytes`: a partition + placement turned into those;
- `reduction_buckets`, `reduction_windows`: the data-parallel gradient reductions (per stage,
  or per bucket) and when each device runs them.

Why shared rules and not one engine with an ordering policy: the simulator times a fixed order
in a tight sweep over integer ids (about a million actions a second), the list scheduler picks
the next action event by event; one engine would put the scheduler's bookkeeping in the
simulator's inner loop. What must agree between them, durations, memory steps and lags, is
computed here once, and tests/test_list_scheduler.py checks that both give the same makespan.
Nothing here orders or times actions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import accumulate

from octopipe.plan import NO_RECOMPUTE
from octopipe.profile import RECOMPUTATIONS, Device, Profile


@dataclass(frozen=True)
class RecomputeTable:
    """Prefix sums of the layers' costs under one kind of recomputation (a layer that does not
    offer it counts with its own costs), and of how many layers offer it."""

    b: list[float]
    act: list[float]
    wact: list[float]
    offered: list[int]


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
        # What W holds from I on: its inputs and the output gradients it needs.
        self.wact = prefix_sums(l.wact_bytes + l.wgrad_bytes for l in layers)
        self.param = prefix_sums(l.param_bytes for l in layers)
        self.grad = prefix_sums(l.grad_bytes for l in layers)
        self.out_bytes = [l.out_bytes for l in layers]
        self.num_layers = len(layers)
        # A stage's gradient buckets, by (start, end, device speed, recomputation): a search
        # evaluates the same stages again and again, each of thousands of buckets.
        self.bucket_cache: dict[tuple[int, int, float, str], tuple[GradBucket, ...]] = {}
        # Per kind of recomputation some layer offers (docs/FORMATS.md): its prefix sums.
        self.recompute = {
            kind: _recompute_table(profile, kind)
            for kind in RECOMPUTATIONS
            if any(l.recompute is not None and l.recompute.of(kind) for l in layers)
        }

    def offers(self, start: int, end: int, kind: str) -> bool:
        """Whether some layer of [start, end) can be recomputed so (always, for none)."""
        if kind == NO_RECOMPUTE:
            return True
        table = self.recompute.get(kind)
        return table is not None and table.offered[end] > table.offered[start]

    def work_under(self, kind: str) -> list[float]:
        """Prefix sums of layer work (f + b + w) with every layer recomputed by `kind` where
        it offers it (the plain `work` for none)."""
        table = self.recompute.get(kind)
        if table is None:
            return self.work
        return [f + b + w for f, b, w in zip(self.f, table.b, self.w)]

    def held_bytes(self, start: int, end: int, kind: str = NO_RECOMPUTE) -> tuple[float, float]:
        """(act, wact) of layers [start, end): held from F, and after I until W (W's inputs and
        the output gradients it needs)."""
        table = self.recompute.get(kind) if kind != NO_RECOMPUTE else None
        act, wact = (table.act, table.wact) if table else (self.act, self.wact)
        return act[end] - act[start], wact[end] - wact[start]

    def stage_times(
        self, start: int, end: int, kind: str = NO_RECOMPUTE
    ) -> tuple[float, float, float]:
        """(f, b, w) of layers [start, end) on a device of speed 1, recomputed by `kind`."""
        table = self.recompute.get(kind) if kind != NO_RECOMPUTE else None
        b = table.b if table else self.b
        return (
            self.f[end] - self.f[start],
            b[end] - b[start],
            self.w[end] - self.w[start],
        )

    def boundary_bytes(self, end: int) -> int:
        """Bytes crossing the boundary after layer `end - 1`, both ways (activation, gradient)."""
        return self.out_bytes[end - 1]


def prefix_sums(values: Iterable[float]) -> list[float]:
    """[0, v0, v0 + v1, ...]: the sum over [i, j) is p[j] - p[i]."""
    return [0, *accumulate(values)]


def _recompute_table(profile: Profile, kind: str) -> RecomputeTable:
    rows = []
    for layer in profile.layers:
        alt = layer.recompute.of(kind) if layer.recompute is not None else None
        if alt is None:
            rows.append((layer.b, layer.act_bytes, layer.wact_bytes + layer.wgrad_bytes, 0))
        else:  # W needs the same output gradients whatever the forward redoes
            rows.append((alt.b, alt.act_bytes, alt.wact_bytes + layer.wgrad_bytes, 1))
    b, act, wact, offered = zip(*rows)
    return RecomputeTable(prefix_sums(b), prefix_sums(act), prefix_sums(wact), prefix_sums(offered))


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
    wact: float  # held after I until W (more than act where I recomputes W's inputs)
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
    recompute: Sequence[str] = (),
) -> tuple[StageCost, ...]:
    """The StageCost of each stage of a partition + placement (durations divided by speed;
    a transfer takes the link between the two devices, `Profile.link_between`). With the
    profile's `blocking_transfers`, the sender's action lasts until its transfer is done
    (F sends forward, I or B sends the gradient back) and the data is there when it ends.
    `recompute`: per stage, what it recomputes (empty: nothing); a recomputed layer takes its
    `recompute` costs from the profile (docs/FORMATS.md)."""
    blocking = costs.profile.blocking_transfers
    out = []
    last = len(ranges) - 1
    extra = costs.action_overhead
    lags = []
    for s, ((_, b), d) in enumerate(zip(ranges, placement, strict=True)):
        lag = 0.0
        if s < last and placement[s + 1] != d:
            link = costs.profile.link_between(devices[d], devices[placement[s + 1]])
            lag = link.transfer_time(costs.boundary_bytes(b))
        lags.append(lag)
    for s, ((a, b), d) in enumerate(zip(ranges, placement, strict=True)):
        kind = recompute[s] if recompute else NO_RECOMPUTE
        f, bi, bw = costs.stage_times(a, b, kind)
        act, wact = costs.held_bytes(a, b, kind)
        speed = devices[d].speed
        send_forward = lags[s] if blocking else 0.0
        send_back = lags[s - 1] if blocking and s > 0 else 0.0
        out.append(
            StageCost(
                device=d,
                f=f / speed + extra + send_forward,
                i=bi / speed + extra + send_back,
                w=bw / speed + extra,
                act=act,
                wact=wact,
                lag_next=0.0 if blocking else lags[s],
                overhead=extra,
            )
        )
    return tuple(out)


@dataclass(frozen=True)
class GradBucket:
    """One reduction of a stage's gradients: its seconds, and how long before the end of the
    stage's last backward action its gradients are all computed (`lead_b` when that action is
    a full backward B, `lead_w` when it is a W)."""

    seconds: float
    lead_b: float = 0.0
    lead_w: float = 0.0

    def ready(self, end: float, is_w: bool) -> float:
        return end - (self.lead_w if is_w else self.lead_b)


def reduction_buckets(
    costs: CostTable,
    ranges: Sequence[tuple[int, int]],
    placement: Sequence[int],
    devices: Sequence[Device],
    recompute: Sequence[str] = (),
) -> tuple[tuple[GradBucket, ...], ...]:
    """Per stage: the reductions of its gradients across the data-parallel replicas, in the
    order they become ready (none with one replica or no `grad_bytes`).

    Without `data_parallel.bucket_bytes`: one per stage, ready when its last backward action
    ends. With it: buckets of that many bytes filled as the stage's last backward runs its
    layers from the last to the first, each layer's gradients produced evenly over its
    backward, a bucket ready when it is full (the last when every gradient is computed), as
    DDP's and Megatron-LM's overlapped reductions do (docs/FORMATS.md)."""
    dp = costs.profile.data_parallel
    out = []
    for s, ((a, b), d) in enumerate(zip(ranges, placement, strict=True)):
        total = costs.grad[b] - costs.grad[a]
        if dp.degree == 1 or total == 0:
            out.append(())
        elif dp.bucket_bytes is None:
            out.append((GradBucket(dp.allreduce_time(total)),))
        else:
            kind = recompute[s] if recompute else NO_RECOMPUTE
            speed, size = devices[d].speed, dp.bucket_bytes
            key = (a, b, speed, kind)
            if key not in costs.bucket_cache:
                costs.bucket_cache[key] = _buckets(
                    costs, a, b, speed, size, dp.allreduce_time, kind
                )
            out.append(costs.bucket_cache[key])
    return tuple(out)


def _buckets(
    costs: CostTable,
    a: int,
    b: int,
    speed: float,
    size: int,
    seconds: Callable[[float], float],
    kind: str = NO_RECOMPUTE,
) -> tuple[GradBucket, ...]:
    """The buckets of layers [a, b) (see `reduction_buckets`), filled in one pass over the
    layers from the last to the first (a recomputed layer's backward includes its redone
    forward)."""
    total = costs.grad[b] - costs.grad[a]
    table = costs.recompute.get(kind)
    backward = table.b if table else costs.b
    both = [bi + wi for bi, wi in zip(backward, costs.w)]  # prefix sums of a layer's B

    def lead(time: list[float], layer: int, done: float) -> float:
        """Backward seconds left once `done` of `layer`'s backward has run."""
        own = time[layer + 1] - time[layer]
        return (time[layer + 1] - time[a] - done * own) / speed

    out, target, last = [], min(size, total), 0
    for layer in range(b - 1, a - 1, -1):
        grad = costs.grad[layer + 1] - costs.grad[layer]
        before = costs.grad[b] - costs.grad[layer + 1]  # computed when the layer starts
        while grad and last < total and target <= before + grad:
            done = (target - before) / grad
            out.append(
                GradBucket(
                    seconds(target - last), lead(both, layer, done), lead(costs.w, layer, done)
                )
            )
            last, target = target, min(target + size, total)
    return tuple(out)


def reduction_windows(
    last_backward: Sequence[tuple[float, bool]],
    buckets: Sequence[Sequence[GradBucket]],
    placement: Sequence[int],
    device_ends: Sequence[float] | None = None,
) -> list[tuple[int, int, float, float]]:
    """(device, stage, start, end) of every gradient reduction, given each stage's last
    backward action (its end, and whether it is a W): a device runs its reductions one at a
    time, in the order they become ready, ties lower stage first; with `device_ends` (the
    profile's `data_parallel.at_end`), none before its device's last action has ended
    (docs/FORMATS.md). The one home of this rule: the simulator and the tuner's evaluator
    both call it."""
    out = []
    by_device: dict[int, list[tuple[float, int, int, float]]] = {}
    for s, d in enumerate(placement):
        end, is_w = last_backward[s]
        for i, bucket in enumerate(buckets[s]):
            ready = bucket.ready(end, is_w)
            if device_ends is not None:
                ready = max(ready, device_ends[d])
            by_device.setdefault(d, []).append((ready, s, i, bucket.seconds))
    for d in sorted(by_device):
        t = 0.0
        for at, s, _, seconds in sorted(by_device[d]):
            t = max(t, at)
            out.append((d, s, t, t + seconds))
            t += seconds
    return out


def static_bytes(
    costs: CostTable, ranges: Sequence[tuple[int, int]], placement: Sequence[int], num_devices: int
) -> list[float]:
    """Per device: the `param_bytes` of the layers of its stages."""
    static = [0.0] * num_devices
    for (a, b), d in zip(ranges, placement, strict=True):
        static[d] += costs.param[b] - costs.param[a]
    return static
