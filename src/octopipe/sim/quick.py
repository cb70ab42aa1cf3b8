"""One synchronous step of a plan timed in one pass over its orders: the figures that
`evaluate(build_graph(plan), detail=False)` gives, bit for bit, without building the graph.

A layout search simulates each of its thousands of screening plans once; for those, lowering
the plan to a graph of id tuples cost as much as evaluating it. Here each action's dependencies
are found as it is reached (F after the previous stage's F; I or B after its F and the next
stage's backward; W after its I), with the same arithmetic in the same order as `graph.py` and
`evaluate.py`, so every time and peak is the same float. A plan this pass cannot finish (a
dependency never run: a cycle, or an order `graph.py` lowers otherwise) returns None, and the
caller takes the graph's way, which says what is wrong. Events, the critical path and
overlapped steps stay `evaluate.py`'s and `steps.py`'s. The pass runs compiled where numba
imports (`quick_compiled.py`, the same figures); the loop here is its reference.
"""

from __future__ import annotations

from octopipe.actions import B_CODE, F_CODE, W_CODE
from octopipe.compiled import compiled
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
    timed = compiled("octopipe.sim.quick_compiled", "timed_orders") or _timed_orders
    done = timed(rows, dur, mem, lag, M)
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


def _timed_orders(rows, dur, mem, lag, M: int):
    """The pass over `rows` (per device, its actions): per device its end, busy seconds,
    activation level at the end and peak; per stage its last B or W's end and whether a W.
    None where the pass cannot finish. `quick_compiled.timed_orders` is the same, compiled."""
    S, nd = len(dur), len(rows)
    f_end = [-1.0] * (S * M)  # by s * M + m: when its F ends
    b_end = [-1.0] * (S * M)  # and its backward (I or B)
    i_end = [-1.0] * (S * M)  # and its I, which its W waits for
    # Per stage: its last B or W to end, and whether a W (`evaluate._reductions`'s walk).
    last_bwd = [(0.0, False)] * S
    ptr = [0] * nd
    free_at = [0.0] * nd
    busy = [0.0] * nd
    level = [0] * nd
    top = [0] * nd
    remaining = sum(len(r) for r in rows)
    last = S - 1
    while remaining:
        progressed = False
        for d in range(nd):
            row = rows[d]
            p = start = ptr[d]
            n = len(row)
            if p == n:
                continue
            t = free_at[d]
            lv, hi, work = level[d], top[d], busy[d]
            while p < n:
                s, k, m = row[p]
                code = k.code
                sm = s * M + m
                t0 = t
                if code == F_CODE:
                    if s > 0:
                        e = f_end[sm - M]
                        if e < 0.0:
                            break
                        e += lag[s - 1]
                        if e > t0:
                            t0 = e
                elif code == W_CODE:
                    e = i_end[sm]
                    if e < 0.0:
                        break
                    if e > t0:
                        t0 = e
                else:  # I or B: its F, then the next stage's backward
                    e = f_end[sm]
                    if e < 0.0:
                        break
                    if e > t0:
                        t0 = e
                    if s < last:
                        e = b_end[sm + M]
                        if e < 0.0:
                            break
                        e += lag[s]
                        if e > t0:
                            t0 = e
                took = dur[s][code]
                t = t0 + took
                if code == F_CODE:
                    f_end[sm] = t
                elif code == W_CODE:
                    if t >= last_bwd[s][0]:
                        last_bwd[s] = (t, True)
                else:
                    b_end[sm] = t
                    if code == B_CODE:
                        if t >= last_bwd[s][0]:
                            last_bwd[s] = (t, False)
                    else:
                        i_end[sm] = t
                work += took
                lv += mem[s][code]
                if lv > hi:
                    hi = lv
                p += 1
            if p != start:
                remaining -= p - start
                ptr[d] = p
                free_at[d] = t
                level[d], top[d], busy[d] = lv, hi, work
                progressed = True
        if not progressed:
            return None
    return free_at, busy, level, top, last_bwd
