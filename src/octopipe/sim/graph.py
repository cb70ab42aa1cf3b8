"""Compile a plan into a flat dependency graph: the simulator's input, built once per plan.

Every action of the plan becomes one integer id; each carries its duration on its device and up to
two cross-action dependencies with the transfer lag on that edge. Device order is implicit in the
per-device lists. Durations, memory changes and lags come from the cost layer
(`octopipe.costs.StageCost`); this module adds which action waits for which (docs/FORMATS.md) and
does not evaluate time or memory (`evaluate.py` does).
"""

from __future__ import annotations

from dataclasses import dataclass

from octopipe.actions import F_CODE, I_CODE, KINDS, NUM_KINDS, W_CODE, Action, Kind
from octopipe.costs import CostTable, GradBucket, reduction_buckets, stage_costs, static_bytes
from octopipe.errors import InputError
from octopipe.plan import Plan, check_structure
from octopipe.profile import Device, Profile

NO_DEP = -1


def action_id(action: Action, num_microbatches: int) -> int:
    """The action's integer id in a graph of `num_microbatches` microbatches."""
    return (action.stage * num_microbatches + action.mb) * NUM_KINDS + action.kind.code


def action_of(aid: int, num_microbatches: int) -> Action:
    sm, code = divmod(aid, NUM_KINDS)
    s, m = divmod(sm, num_microbatches)
    return Action(s, KINDS[code], m)


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
    # Per stage: its data-parallel gradient reductions, in ready order (none without one).
    buckets: tuple[tuple[GradBucket, ...], ...] = ()
    reduce_at_end: bool = False  # a device's reductions wait for its last action

    @property
    def reduces(self) -> bool:
        """Whether any stage reduces gradients across data-parallel replicas."""
        return any(self.buckets)


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
    if plan.recompute:  # never skipped: costs the profile lacks cannot be simulated
        check_recompute(costs, plan, where)
    M = plan.num_microbatches
    stages = plan.stages
    S = len(stages)
    ranges = [(st.start, st.end) for st in stages]
    per_stage = stage_costs(costs, ranges, plan.placement, devices, plan.recompute)
    dur = [c.duration for c in per_stage]  # by kind code, on the stage's device
    mem = [c.memory_change for c in per_stage]
    lag = [c.lag_next for c in per_stage]  # edge s <-> s+1, both ways; 0 on one device

    K = NUM_KINDS
    n = S * M * K
    # Which backward (I or B) each (stage, mb) uses, for the dependency of stage s-1's backward.
    bwd = [NO_DEP] * (S * M)
    backward_kinds = (Kind.I, Kind.B)
    for acts in plan.schedule.values():
        for s, k, m in acts:
            if k in backward_kinds:
                bwd[s * M + m] = (s * M + m) * K + k.code

    mem_delta = [0] * n
    rows = []
    for d in range(plan.num_devices):
        row = []
        for s, k, m in plan.schedule.get(d, ()):
            code = k.code
            sm = s * M + m
            aid = sm * K + code
            mem_delta[aid] = mem[s][code]
            if code == F_CODE:  # F needs F of the previous stage
                if s > 0:
                    row.append(
                        (aid, dur[s][F_CODE], (sm - M) * K + F_CODE, lag[s - 1], NO_DEP, 0.0)
                    )
                else:
                    row.append((aid, dur[s][F_CODE], NO_DEP, 0.0, NO_DEP, 0.0))
            elif code == W_CODE:  # W needs I
                row.append((aid, dur[s][W_CODE], sm * K + I_CODE, 0.0, NO_DEP, 0.0))
            else:  # I or B needs its F and the next stage's backward
                if s < S - 1:
                    row.append((aid, dur[s][code], sm * K + F_CODE, 0.0, bwd[sm + M], lag[s]))
                else:
                    row.append((aid, dur[s][code], sm * K + F_CODE, 0.0, NO_DEP, 0.0))
        rows.append(tuple(row))

    static = static_bytes(costs, ranges, plan.placement, plan.num_devices)
    buckets = reduction_buckets(costs, ranges, plan.placement, devices, plan.recompute)
    at_end = costs.profile.data_parallel.at_end
    return Graph(plan, devices, tuple(rows), n, tuple(static), tuple(mem_delta), buckets, at_end)


def check_recompute(costs: CostTable, plan: Plan, where: str = "<plan>") -> None:
    """A stage recomputes only what its profile layers offer: a kind none of them has costs
    for cannot be simulated (docs/FORMATS.md)."""
    for i, st in enumerate(plan.stages):
        kind = plan.recompute_of(i)
        if not costs.offers(st.start, st.end, kind):
            raise InputError(
                where,
                f"no layer of [{st.start}, {st.end}) has {kind} recomputation costs in the profile",
                f"stages[{i}].recompute",
            )


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
