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
"""

from __future__ import annotations

from dataclasses import replace

from octopipe.actions import NUM_KINDS, Action
from octopipe.errors import InputError
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
    return Plan(plan.num_devices, M * steps, plan.stages, schedule)


def step_id(aid: int, step: int, num_microbatches: int, steps: int) -> int:
    """The id in a `steps`-step graph of one-step action `aid` in step `step`."""
    per_stage = num_microbatches * NUM_KINDS
    return (aid // per_stage) * per_stage * steps + step * per_stage + aid % per_stage


def repeat_graph(graph: Graph, steps: int) -> Graph:
    """`build_graph(repeat_steps(plan, steps))` from the one-step graph, by renumbering ids
    (what the simulator runs; no plan is built or checked again)."""
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
    return replace(graph, plan=repeated, rows=rows, num_ids=n, mem_delta=tuple(mem_delta))


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
    M = graph.plan.num_microbatches
    lasts = [row[-1][0] for row in graph.rows if row]  # each device's last action of a step
    steps = first_steps
    while True:
        repeated = repeat_graph(graph, steps)
        watch = [step_id(a, j, M, steps) for a in lasts for j in range(steps)]
        result = evaluate(repeated, lower_bound * steps, False, watch)
        ends = result.watched_ends
        per_step = [max(ends[d * steps + j] for d in range(len(lasts))) for j in range(steps)]
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
        busy=tuple(b / steps for b in result.busy),
        lower_bound=lower_bound,
        watched_ends=(),
        steady=steady,
    )


def refuse_data_parallel(profile) -> None:
    if profile.data_parallel.degree > 1 and any(l.grad_bytes for l in profile.layers):
        raise InputError(
            profile.name,
            "overlapped steps with data-parallel all-reduces are not modelled: each step's "
            "all-reduce would gate the next step's update",
            "data_parallel",
        )
