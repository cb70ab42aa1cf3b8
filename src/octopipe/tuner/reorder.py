"""Local reordering: the last polish of a tuned plan, on its per-device orders alone.

The list scheduler decides greedily, one free device at a time; afterwards the simulator's
critical path shows which actions bind the iteration. Where a binding action waits on its device
behind an action that does not bind, swapping the two lets it start earlier. A swap is kept when
the simulator says the plan got faster and still fits (a swap that deadlocks is discarded).
Partition and placement do not change here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from octopipe.errors import DeadlockError
from octopipe.plan import Plan
from octopipe.sim import SimResult, Simulator


def reorder_critical(
    simulator: Simulator,
    plan: Plan,
    result: SimResult,
    max_tries: int = 30,
    out_of_time: Callable[[], bool] = lambda: False,
) -> tuple[Plan, SimResult]:
    """Swap a binding action ahead of the non-binding one before it while that helps."""
    tries = 0
    while tries < max_tries and not out_of_time():
        binding = set(simulator.run(plan, detail=True, check=False).critical_path)
        for trial in _swaps(plan, binding):
            tries += 1
            better = _faster(simulator, trial, result)
            if better is not None:
                plan, result = trial, better
                break
            if tries >= max_tries or out_of_time():
                return plan, result
        else:
            return plan, result  # no swap helped: a local optimum of this neighbourhood
    return plan, result


def _swaps(plan: Plan, binding: set):
    for d, acts in sorted(plan.schedule.items()):
        for k in range(1, len(acts)):
            if acts[k] in binding:
                order = acts[: k - 1] + (acts[k], acts[k - 1]) + acts[k + 1 :]
                yield replace(plan, schedule={**plan.schedule, d: order}, predicted=None)


def _faster(simulator: Simulator, plan: Plan, than: SimResult) -> SimResult | None:
    try:
        result = simulator.run(plan, detail=False, check=False)
    except DeadlockError:
        return None
    if result.iteration_time < than.iteration_time and (result.fits or not than.fits):
        return result
    return None
