"""Overlapped steps: a plan's orders repeated step after step with no barrier between steps.

Step k+1's actions on a device follow its step-k actions in the device's order, and wait for
their own inputs as always; nothing else separates steps (docs/FORMATS.md). Lowered as one
plan of K x M microbatches, step k's microbatch m becoming k * M + m, each device's order the
K copies of its own one after another, so the simulator's rules apply unchanged.

The step time is the limit of T_K / K, T_K the end of step K (the last device to finish it).
For a fixed order the step ends form a max-plus linear recurrence, whose increments
T_{k+1} - T_k become periodic after a transient; `steady_state` simulates 8, 16, ... steps
until the last two periods of increments agree (a period of 1 to 4 steps) and takes their mean.
Peak memory is over the whole repeated run; as a device ends step k (its W included) before
step k+1's first action, it equals one step's peak.
"""

from __future__ import annotations

from dataclasses import replace

from octopipe.actions import Action
from octopipe.errors import InputError
from octopipe.plan import Plan
from octopipe.sim.evaluate import SimResult, SteadyState

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


def last_of_each_step(plan: Plan, steps: int) -> list[list[Action]]:
    """Per device, the last action of each step of `repeat_steps(plan, steps)`."""
    M = plan.num_microbatches
    out = []
    for acts in plan.schedule.values():
        if acts:
            a = acts[-1]
            out.append([Action(a.stage, a.kind, k * M + a.mb) for k in range(steps)])
    return out


def settled_period(increments: list[float], scale: float) -> int:
    """The smallest period p <= MAX_PERIOD over which the last 2p increments repeat, else 0."""
    for p in range(1, MAX_PERIOD + 1):
        tail = increments[-2 * p :]
        if len(tail) < 2 * p:
            break
        if all(abs(tail[i] - tail[i + p]) <= TOLERANCE * scale for i in range(p)):
            return p
    return 0


def steady_state(
    run_steps, plan: Plan, first_steps: int = FIRST_STEPS, max_steps: int = MAX_STEPS
) -> SimResult:
    """The steady state of `plan`'s overlapped steps. `run_steps(repeated_plan, watch)` simulates
    a repeated plan and reports the end times of the actions `watch` lists (`Simulator` passes
    its own). The result describes one step: iteration_time is the steady step time, busy is
    per step, peak memory is over the whole repeated run. A search may pass small step counts
    for a quick estimate (`steady.converged` says whether it settled)."""
    steps = first_steps
    while True:
        repeated = repeat_steps(plan, steps)
        lasts = last_of_each_step(plan, steps)
        result = run_steps(repeated, [a for device in lasts for a in device])
        ends = result.watched_ends
        per_step = [max(ends[d * steps + k] for d in range(len(lasts))) for k in range(steps)]
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
        lower_bound=result.lower_bound / steps,
        critical_path=(),
        _timing=None,
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
