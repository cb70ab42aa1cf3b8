"""Overlapped steps: a plan's orders repeated step after step with no barrier between steps.

Step k+1's actions on a device follow its step-k actions in the device's order, and wait for
their own inputs as always; nothing else separates steps (docs/FORMATS.md). Lowered as one
plan of K x M microbatches, step k's microbatch m becoming k * M + m, each device's order the
K copies of its own one after another, so the simulator's rules apply unchanged.

The step time is the limit of T_K / K, T_K the end of step K (the last device to finish it).
For a fixed order the step ends form a max-plus linear recurrence, whose increments
T_{k+1} - T_k become periodic after a transient; `steady_state` simulates 8, 16, ... steps
until the last three periods of increments agree (a period of 1 to 4 steps) and takes their mean.
Peak memory is over the whole repeated run; as a device ends step k (its W included) before
step k+1's first action, it equals one step's peak.

With data parallelism each stage's gradient all-reduce of step k runs on its device's
communication channel after the stage's last backward of the step, one at a time in the order
the device's order makes them ready (the synchronous rule), and the device starts step k+1 only
once its all-reduces of step k have ended, as the executor does (it updates a stage once the
stage's all-reduce is done, and finishes them all before the next step). In the graph: one row
per device of all-reduce nodes, and a zero-time wait heading each later step of the device.
"""

from __future__ import annotations

from dataclasses import replace

from octopipe.actions import B_CODE, NUM_KINDS, W_CODE, Action
from octopipe.plan import Plan
from octopipe.sim.evaluate import SimResult, SteadyState, evaluate
from octopipe.sim.graph import NO_DEP, Graph

FIRST_STEPS = 8
MAX_STEPS = 64
MAX_PERIOD = 4
TOLERANCE = 1e-9  # of the step time: increments this close count as equal


def repeat_steps(plan: Plan, steps: int) -> Plan:
    """`plan` as `steps` steps with no barrier: microbatch m of step k is k * M + m."""
    M = plan.num_microbatches
    schedule = {
        d: tuple(Action(a.stage, a.kind, k * M + a.mb) for k in range(steps) for a in acts)
        for d, acts in plan.schedule.items()
    }
    return Plan(plan.num_devices, M * steps, plan.stages, schedule, recompute=plan.recompute)


def step_id(aid: int, step: int, num_microbatches: int, steps: int) -> int:
    """The id in a `steps`-step graph of one-step action `aid` in step `step`."""
    per_stage = num_microbatches * NUM_KINDS
    return (aid // per_stage) * per_stage * steps + step * per_stage + aid % per_stage


def repeat_graph(graph: Graph, steps: int) -> Graph:
    """`build_graph(repeat_steps(plan, steps))` from the one-step graph, by renumbering ids
    (what the simulator runs; no plan is built or checked again). With data-parallel
    all-reduces, also their rows and the waits for them (`_with_reductions`)."""
    return _repeat(graph, steps)[0]


def _repeat(graph: Graph, steps: int) -> tuple[Graph, list[list[int]]]:
    """`repeat_graph`, and per device with all-reduces the id of its last one in each step."""
    M = graph.plan.num_microbatches

    def shift(aid: int, j: int) -> int:
        return aid if aid == NO_DEP else step_id(aid, j, M, steps)

    rows = tuple(
        tuple(
            (shift(a, j), dur, shift(d1, j), l1, shift(d2, j), l2)
            for j in range(steps)
            for a, dur, d1, l1, d2, l2 in row
        )
        for row in graph.rows
    )
    n = graph.num_ids * steps
    mem_delta = [0] * n
    for aid, delta in enumerate(graph.mem_delta):
        if delta:
            for j in range(steps):
                mem_delta[shift(aid, j)] = delta
    plan = graph.plan
    repeated = Plan(plan.num_devices, M * steps, plan.stages, {})
    out = replace(graph, plan=repeated, rows=rows, num_ids=n, mem_delta=tuple(mem_delta))
    return _with_reductions(graph, out, steps) if graph.reduces else (out, [])


def reduction_order(graph: Graph) -> list[list[tuple[int, int]]]:
    """Per device, (stage, id of its last backward action) of each stage with reductions,
    in the order the device runs those last backward actions: the order they become ready
    (a stage's buckets are ready in their order, all before the device's next action ends)."""
    M = graph.plan.num_microbatches
    out = []
    for row in graph.rows:
        last: dict[int, tuple[int, int]] = {}
        for pos, r in enumerate(row):
            if r[0] % NUM_KINDS in (B_CODE, W_CODE):
                last[r[0] // (M * NUM_KINDS)] = (pos, r[0])
        ready = sorted((pos, s, aid) for s, (pos, aid) in last.items() if graph.buckets[s])
        out.append([(s, aid) for _, s, aid in ready])
    return out


def _with_reductions(one: Graph, repeated: Graph, steps: int) -> tuple[Graph, list[list[int]]]:
    """`repeated` with a row of reduction nodes per device (ids from `repeated.num_ids` on),
    each after its stage's last backward of the step (a bucket: that action's end less the
    bucket's lead, as a negative lag), and each device's step k+1 headed by a zero-time wait
    for the end of its last reduction of step k. Also, per device that has reductions, the id
    of its last one in each step (where the step ends for it)."""
    M = one.plan.num_microbatches
    next_id = repeated.num_ids
    nd = len(one.rows)
    device_rows: list[list] = []
    reduce_rows: list[list] = []
    last_of_step: list[list[int]] = []
    for d, order in enumerate(reduction_order(one)):
        per_step = len(one.rows[d])
        row = list(repeated.rows[d])
        reduce_row: list = []
        per_step_reductions = sum(len(one.buckets[s]) for s, _ in order)
        device_last = one.rows[d][-1][0] if one.rows[d] else NO_DEP
        for j in range(steps):
            for s, aid in order:
                is_w = aid % NUM_KINDS == W_CODE
                for bucket in one.buckets[s]:
                    if one.reduce_at_end:  # after the device's last action of the step
                        ready, lag = step_id(device_last, j, M, steps), 0.0
                    else:  # minus the bucket's lead: ready before its action ends
                        ready, lag = step_id(aid, j, M, steps), bucket.ready(0.0, is_w)
                    reduce_row.append((next_id, bucket.seconds, ready, lag, NO_DEP, 0.0))
                    next_id += 1
        device_rows.append(row)
        reduce_rows.append(reduce_row)
        if not order:
            continue
        last_of_step.append(
            [reduce_row[(j + 1) * per_step_reductions - 1][0] for j in range(steps)]
        )
        for j in range(steps - 1, 0, -1):  # from the back: inserting shifts what follows
            row.insert(j * per_step, (next_id, 0.0, last_of_step[-1][j - 1], 0.0, NO_DEP, 0.0))
            next_id += 1
    rows = tuple(tuple(r) for r in [*device_rows, *reduce_rows])
    mem_delta = repeated.mem_delta + (0,) * (next_id - repeated.num_ids)
    static = tuple(repeated.static_bytes) + (0,) * nd
    out = replace(
        repeated,
        rows=rows,
        num_ids=next_id,
        mem_delta=mem_delta,
        static_bytes=static,
        buckets=(),  # the reductions are in the rows now: evaluate must not add them again
    )
    return out, last_of_step


def settled_period(increments: list[float], scale: float) -> int:
    """The smallest period p <= MAX_PERIOD over which the last 3p increments repeat, else 0
    (three periods, not two: a longer period can end in two equal increments)."""
    for p in range(1, MAX_PERIOD + 1):
        tail = increments[-3 * p :]
        if len(tail) < 3 * p:
            break
        if all(abs(tail[i] - tail[i + p]) <= TOLERANCE * scale for i in range(2 * p)):
            return p
    return 0


def steady_state(
    graph: Graph, lower_bound: float, first_steps: int = FIRST_STEPS, max_steps: int = MAX_STEPS
) -> SimResult:
    """The steady state of overlapped steps of the one-step `graph` (`lower_bound`: one step's
    physical limit). The result describes one step: iteration_time is the steady step time,
    busy is per step, peak memory is over the whole repeated run. A search may pass small step
    counts for a quick estimate (`steady.converged` says whether it settled)."""
    M, nd = graph.plan.num_microbatches, len(graph.rows)
    lasts = [row[-1][0] for row in graph.rows if row]  # each device's last action of a step
    steps = first_steps
    while True:
        repeated, reduce_ends = _repeat(graph, steps)
        watch = [step_id(a, j, M, steps) for a in lasts for j in range(steps)]
        # A step ends with its last all-reduce, too.
        watch += [aid for ends_of_device in reduce_ends for aid in ends_of_device]
        result = evaluate(repeated, lower_bound * steps, False, watch)
        ends = result.watched_ends
        enders = len(lasts) + len(reduce_ends)
        per_step = [max(ends[e * steps + j] for e in range(enders)) for j in range(steps)]
        increments = [b - a for a, b in zip([0.0, *per_step], per_step)]
        period = settled_period(increments[1:], per_step[-1] / steps)
        if period or steps >= max_steps:
            break
        steps *= 2
    if period:
        step_time = sum(increments[-period:]) / period
    else:  # not settled within max_steps: the mean over the later half
        half = steps // 2
        step_time = (per_step[-1] - per_step[half - 1]) / (steps - half)
    steady = SteadyState(step_time, per_step[0], steps, period)
    return replace(
        result,
        iteration_time=step_time,
        busy=tuple(b / steps for b in result.busy[:nd]),  # the all-reduce rows are not devices
        peak_memory_bytes=result.peak_memory_bytes[:nd],
        static_memory_bytes=result.static_memory_bytes[:nd],
        end_memory_bytes=result.end_memory_bytes[:nd],
        lower_bound=lower_bound,
        watched_ends=(),
        steady=steady,
    )
