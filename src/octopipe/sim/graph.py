"""Compile a plan into a flat dependency graph: the simulator's input, built once per plan.

Every action of the plan becomes one integer id; each carries its duration on its device and up to
two cross-action dependencies with the transfer lag on that edge. Device order is implicit in the
per-device lists. This module holds the default cost semantics of DESIGN.md: what a stage's ops
cost on its device (`stage_costs`, shared with the list scheduler) and which action waits for
which; it does not evaluate time or memory (`evaluate.py` does).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

from octopipe.errors import InputError
from octopipe.plan import Action, Plan, check_structure
from octopipe.profile import Device, Link, Profile

KIND_CODE = {"F": 0, "I": 1, "W": 2, "B": 3}
KINDS = "FIWB"
NO_DEP = -1


def action_id(stage: int, kind_code: int, mb: int, num_microbatches: int) -> int:
    return (stage * num_microbatches + mb) * 4 + kind_code


def action_of(aid: int, num_microbatches: int) -> Action:
    sm, code = divmod(aid, 4)
    s, m = divmod(sm, num_microbatches)
    return Action(s, KINDS[code], m)


class CostTable:
    """Prefix sums over a profile's layers, so any stage's cost is O(1) for any partition.

    `action_overhead` (seconds, default 0: DESIGN's default semantics) is an option beyond
    them: a fixed cost every action (F, I, W, B) pays on top of its layers' times, such as an
    executor's per-action bookkeeping and the cost of waking up after a wait.
    """

    def __init__(self, profile: Profile, action_overhead: float = 0.0):
        if not (math.isfinite(action_overhead) and action_overhead >= 0.0):
            raise ValueError(f"action overhead must be a finite number >= 0, got {action_overhead}")
        layers = profile.layers
        self.profile = profile
        self.action_overhead = action_overhead
        self.f = _prefix(l.f for l in layers)
        self.b = _prefix(l.b for l in layers)
        self.w = _prefix(l.w for l in layers)
        self.work = [f + b + w for f, b, w in zip(self.f, self.b, self.w)]  # prefix of f + b + w
        self.act = _prefix(l.act_bytes for l in layers)
        self.wact = _prefix(l.wact_bytes for l in layers)
        self.param = _prefix(l.param_bytes for l in layers)
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


@dataclass(frozen=True)
class StageCost:
    """One stage as its device sees it: op seconds at the device's speed, activation bytes."""

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


def stage_costs(
    costs: CostTable,
    ranges: Sequence[tuple[int, int]],
    placement: Sequence[int],
    devices: Sequence[Device],
    link: Link,
) -> tuple[StageCost, ...]:
    """The StageCost of each stage of a partition + placement (durations divided by speed)."""
    out = []
    last = len(ranges) - 1
    extra = costs.action_overhead
    for s, ((a, b), d) in enumerate(zip(ranges, placement, strict=True)):
        f, bi, bw = costs.stage_times(a, b)
        speed = devices[d].speed
        crosses = s < last and placement[s + 1] != d
        lag = link.transfer_time(costs.boundary_bytes(b)) if crosses else 0.0
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


def static_bytes(
    costs: CostTable, ranges: Sequence[tuple[int, int]], placement: Sequence[int], num_devices: int
) -> list[float]:
    """Per device: the `param_bytes` of the layers of its stages."""
    static = [0.0] * num_devices
    for (a, b), d in zip(ranges, placement, strict=True):
        static[d] += costs.param[b] - costs.param[a]
    return static


@dataclass(frozen=True)
class Graph:
    """A plan lowered to integer ids. Each row of `rows[d]` is one action of device d, in order:
    (aid, duration, dep1, lag1, dep2, lag2), dep = NO_DEP where absent."""

    plan: Plan
    devices: tuple[Device, ...]
    rows: tuple[tuple[tuple[int, float, int, float, int, float], ...], ...]
    num_ids: int
    static_bytes: tuple[float, ...]
    # Per-action memory change when it runs (bytes), indexed by aid.
    mem_delta: tuple[int, ...]


def _prefix(values) -> list[float]:
    return [0, *accumulate(values)]


def build_graph(
    costs: CostTable,
    plan: Plan,
    devices: tuple[Device, ...],
    check: bool = True,
    where: str = "<plan>",
) -> Graph:
    """Lower `plan` to a Graph under the default cost semantics (plus the cost table's
    per-action overhead, 0 unless asked for).

    `check=False` skips the structural check, for plans a generator has just built; `where`
    names the plan in error messages.
    """
    if check:
        check_structure(plan, where, costs.num_layers)
    M = plan.num_microbatches
    stages = plan.stages
    S = len(stages)
    ranges = [(st.start, st.end) for st in stages]
    per_stage = stage_costs(costs, ranges, plan.placement, devices, costs.profile.link)
    dur = [(c.f, c.i, c.w, c.full_backward) for c in per_stage]  # F, I, W, B on its device
    mem = [(c.act, -(c.act - c.wact), -c.wact, -c.act) for c in per_stage]  # change at each
    lag = [c.lag_next for c in per_stage]  # edge s <-> s+1, both ways; 0 on one device

    n = S * M * 4
    # Which backward (I or B) each (stage, mb) uses, for the dependency of stage s-1's backward.
    bwd = [NO_DEP] * (S * M)
    for acts in plan.schedule.values():
        for s, k, m in acts:
            if k == "I" or k == "B":
                bwd[s * M + m] = (s * M + m) * 4 + KIND_CODE[k]

    mem_delta = [0] * n
    rows = []
    for d in range(plan.num_devices):
        row = []
        for s, k, m in plan.schedule.get(d, ()):
            code = KIND_CODE[k]
            sm = s * M + m
            aid = sm * 4 + code
            mem_delta[aid] = mem[s][code]
            if code == 0:  # F needs F of the previous stage
                if s > 0:
                    row.append((aid, dur[s][0], (sm - M) * 4, lag[s - 1], NO_DEP, 0.0))
                else:
                    row.append((aid, dur[s][0], NO_DEP, 0.0, NO_DEP, 0.0))
            elif code == 2:  # W needs I
                row.append((aid, dur[s][2], sm * 4 + 1, 0.0, NO_DEP, 0.0))
            else:  # I or B needs its F and the next stage's backward
                if s < S - 1:
                    row.append((aid, dur[s][code], sm * 4, 0.0, bwd[sm + M], lag[s]))
                else:
                    row.append((aid, dur[s][code], sm * 4, 0.0, NO_DEP, 0.0))
        rows.append(tuple(row))

    static = static_bytes(costs, ranges, plan.placement, plan.num_devices)
    return Graph(plan, devices, tuple(rows), n, tuple(static), tuple(mem_delta))


def devices_for(profile: Profile, plan: Plan, where: str = "<plan>") -> tuple[Device, ...]:
    """The profile's devices for `plan` (default devices where the profile lists none)."""
    listed = profile.devices
    if listed is not None and len(listed) != plan.num_devices:
        raise InputError(
            where,
            f"the plan has {plan.num_devices} devices but the profile lists {len(listed)}",
            "num_devices",
        )
    return profile.device_list(plan.num_devices)
