"""One synchronous step of a plan timed in one pass over its orders: the figures that
`evaluate(build_graph(plan), detail=False)` gives, bit for bit, without building the graph.

A layout search simulates each of its thousands of screening plans once; for those, lowering
the plan to a graph of id tuples cost as much as evaluating it. Here each action's dependencies
are found as it is reached (F after the previous stage's F; I or B after its F and the next
stage's backward; W after its I), with the same arithmetic in the same order as `graph.py` and
`evaluate.py`, so every time and peak is the same float. A plan this pass cannot finish (a
dependency never run: a cycle, or an order `graph.py` lowers otherwise) returns None, and the
caller takes the graph's way, which says what is wrong. Events, the critical path and
overlapped steps stay `evaluate.py`'s and `steps.py`'s. The pass itself is `quick_loop.py`'s,
on arrays, compiled where numba imports.
"""

from __future__ import annotations

from octopipe.costs import (
    CostTable,
    reduction_buckets,
    reduction_windows,
    stage_costs,
    static_bytes,
)
from octopipe.plan import Plan
from octopipe.profile import Device
from octopipe.sim.evaluate import Reduction, SimResult


def quick_evaluate(
    costs: CostTable, plan: Plan, devices: tuple[Device, ...], lower_bound: float
) -> SimResult | None:
    """`evaluate(build_graph(costs, plan, devices, check=False), lower_bound, detail=False)`,
    or None where this pass cannot finish the plan (see the module docstring)."""
    M = plan.num_microbatches
    ranges = [(st.start, st.end) for st in plan.stages]
    per_stage = stage_costs(costs, ranges, plan.placement, devices, plan.recompute)
    dur = [c.duration for c in per_stage]
    mem = [c.memory_change for c in per_stage]
    lag = [c.lag_next for c in per_stage]
    nd = plan.num_devices
    rows = [plan.schedule.get(d, ()) for d in range(nd)]
    from octopipe.sim.quick_loop import timed_orders

    done = timed_orders(rows, dur, mem, lag, M)
    if done is None:
        return None  # the graph's way says why
    free_at, busy, level, top, last_bwd = done

    static = static_bytes(costs, ranges, plan.placement, nd)
    buckets = reduction_buckets(costs, ranges, plan.placement, devices, plan.recompute)
    reductions: tuple[Reduction, ...] = ()
    if any(buckets):
        ends = None
        if costs.profile.data_parallel.at_end:  # a device's reductions wait for its last action
            ends = [free_at[d] if rows[d] else 0.0 for d in range(nd)]
        windows = reduction_windows(last_bwd, buckets, plan.placement, ends)
        reductions = tuple(Reduction(*w) for w in windows)
    makespan = max([*free_at, *(r.end for r in reductions)]) if nd else 0.0
    return SimResult(
        iteration_time=makespan,
        busy=tuple(busy),
        peak_memory_bytes=tuple(float(static[d] + top[d]) for d in range(nd)),
        static_memory_bytes=tuple(float(x) for x in static),
        capacity_bytes=tuple(dev.memory_bytes for dev in devices),
        lower_bound=lower_bound,
        critical_path=(),
        end_memory_bytes=tuple(float(static[d] + level[d]) for d in range(nd)),
        reductions=reductions,
    )
