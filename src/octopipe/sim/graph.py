"""Compile a plan into a flat dependency graph: the simulator's input, built once per plan.

Every action of the plan becomes one integer id; each carries its duration on its device and up to
two cross-action dependencies with the transfer lag on that edge. Device order is implicit in the
per-device lists. This module knows the default cost semantics of DESIGN.md; it does not evaluate
time or memory (`evaluate.py` does).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

from octopipe.errors import InputError
from octopipe.plan import Action, Plan, check_structure
from octopipe.profile import Device, Profile

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
    """Prefix sums over a profile's layers, so any stage's cost is O(1) for any partition."""

    def __init__(self, profile: Profile):
        layers = profile.layers
        self.profile = profile
        self.f = _prefix(l.f for l in layers)
        self.b = _prefix(l.b for l in layers)
        self.w = _prefix(l.w for l in layers)
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
class Graph:
    """A plan lowered to integer ids. Each row of `rows[d]` is one action of device d, in order:
    (aid, duration, dep1, lag1, dep2, lag2), dep = NO_DEP where absent."""

    plan: Plan
    devices: tuple[Device, ...]
    rows: tuple[tuple[tuple[int, float, int, float, int, float], ...], ...]
    num_ids: int
    static_bytes: tuple[int, ...]
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
    """Lower `plan` to a Graph under the default cost semantics.

    `check=False` skips the structural check, for plans a generator has just built; `where`
    names the plan in error messages.
    """
    if check:
        check_structure(plan, where, costs.num_layers)
    M = plan.num_microbatches
    stages = plan.stages
    S = len(stages)
    link = costs.profile.link
    speed = [d.speed for d in devices]

    dur = []  # per stage: durations of F, I, W, B on its device
    mem = []  # per stage: memory change at F, I, W, B
    for st in stages:
        f, b, w = costs.stage_times(st.start, st.end)
        sp = speed[st.device]
        dur.append((f / sp, b / sp, w / sp, (b + w) / sp))
        act = costs.act[st.end] - costs.act[st.start]
        wact = costs.wact[st.end] - costs.wact[st.start]
        mem.append((act, -(act - wact), -wact, -act))
    # Lag on the edge from stage s to s+1 (and back): zero on one device.
    lag = [
        0.0
        if stages[s].device == stages[s + 1].device
        else link.latency + costs.boundary_bytes(stages[s].end) / link.bandwidth
        for s in range(S - 1)
    ]

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

    static = [0] * plan.num_devices
    for st in stages:
        static[st.device] += costs.param[st.end] - costs.param[st.start]
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
