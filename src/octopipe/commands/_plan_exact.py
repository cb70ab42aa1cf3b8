"""`octopipe plan --exact SECONDS`: the exact scheduler (`octopipe.tuner.exact`) on the tuned
plan's partition and placement, its order taken where it is faster. Torch-free until used."""

from __future__ import annotations

from dataclasses import replace

from rich.console import Console

from octopipe.errors import InputError
from octopipe.profile import Profile
from octopipe.tuner import Evaluated, TuneResult


def check_exact(overlap_steps: bool) -> None:
    """`--exact` is refused with --overlap-steps and without OR-Tools, before any search."""
    from octopipe.tuner.exact import require_solver

    if overlap_steps:
        raise InputError("--exact", "solves one synchronous step, not --overlap-steps' steady one")
    require_solver("--exact")


def exact_order(
    result: TuneResult, profile: Profile, seconds: float, action_overhead: float, console: Console
) -> TuneResult:
    """`--exact`: the fastest order of the tuned plan's partition and placement the exact
    scheduler finds in `seconds` (`octopipe.tuner.exact`), in place of the tuner's where it is
    faster; one line says how it compares and which was kept."""
    from octopipe.sim import Simulator
    from octopipe.tuner.exact import exact_schedule

    best = result.best
    try:
        found = exact_schedule(
            profile, best.plan, seconds, action_overhead=action_overhead, where="--exact"
        )
    except InputError as exc:  # a plan the solver does not take: the tuned one stands
        console.print(f"{exc}; kept the tuner's order", highlight=False, soft_wrap=True)
        return result
    tuner = best.sim.iteration_time
    faster = found.makespan < tuner
    how = "optimal" if found.optimal else f"within {found.gap:.2%} of its proven bound"
    if not found.optimal:
        how += f" {found.bound:.6g} s"
    kept = "wrote the exact order" if faster else "kept the tuner's order"
    console.print(
        f"exact order of the tuned plan's partition and placement: {found.makespan:.6g} s "
        f"({how}); the tuner's: {tuner:.6g} s; {kept}",
        highlight=False,
        soft_wrap=True,
    )
    if not faster:
        return result
    sim = Simulator(profile, action_overhead).run(found.plan, detail=False)
    return replace(result, best=Evaluated(f"{best.label}, exact order", found.plan, sim))
