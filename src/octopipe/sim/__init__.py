"""Graph-based simulator: predicts a plan's iteration time, bubbles and peak memory.

    sim = Simulator(profile)            # once per profile: prefix sums of layer costs
    result = sim.run(plan)              # SimResult; DeadlockError on a cyclic order
    simulate(profile, plan)             # the same in one call

`graph.py` lowers a plan to integer ids, `evaluate.py` times it, under the default cost
semantics (docs/FORMATS.md); without detail, `quick.py` gives the same figures in one pass.
Two options go beyond them: `Simulator(profile, action_overhead=s)` adds a fixed cost to every
action (exported `predicted` figures never use it), and `run(plan, overlap_steps=True)` runs
steps back to back with no barrier (`steps.py`).
"""

from __future__ import annotations

from octopipe.costs import CostTable
from octopipe.errors import DeadlockError
from octopipe.plan import Plan, check_structure
from octopipe.profile import Device, Profile
from octopipe.sim.bounds import Bounds, joint_bound, plan_bound
from octopipe.sim.evaluate import SimResult, evaluate
from octopipe.sim.graph import build_graph, check_recompute, devices_for
from octopipe.sim.quick import quick_evaluate
from octopipe.sim.steps import FIRST_STEPS, MAX_STEPS, steady_state

__all__ = ["Bounds", "SimResult", "Simulator", "lower_bound", "simulate"]


def lower_bound(profile: Profile, devices: tuple[Device, ...], num_microbatches: int) -> float:
    """Physical limit: M * max(total work / total speed, largest layer work / fastest speed)."""
    works = [layer.work for layer in profile.layers]
    speeds = [d.speed for d in devices]
    return num_microbatches * max(sum(works) / sum(speeds), max(works) / max(speeds))


class Simulator:
    """Reusable evaluator for many plans of one profile (the tuner's inner loop)."""

    def __init__(self, profile: Profile, action_overhead: float = 0.0):
        self.profile = profile
        self.costs = CostTable(profile, action_overhead)

    def run(
        self,
        plan: Plan,
        detail: bool = True,
        check: bool = True,
        where: str = "<plan>",
        overlap_steps: bool = False,
        steps: tuple[int, int] = (FIRST_STEPS, MAX_STEPS),
    ) -> SimResult:
        """Simulate `plan`. `detail=False` skips events and critical path; `check=False` skips the
        structural validation of a plan a generator has just built; `where` names the plan (its
        file) in error messages. `overlap_steps`: the steady state of steps run back to back
        with no barrier (`sim/steps.py`; no events or critical path), simulating from
        `steps[0]` up to `steps[1]` steps until it settles."""
        devices = devices_for(self.profile, plan, where)
        bound = lower_bound(self.profile, devices, plan.num_microbatches)
        if not detail and not overlap_steps:  # a search's: timed without building the graph
            if check:
                check_structure(plan, where, self.costs.num_layers)
            if plan.recompute:
                check_recompute(self.costs, plan, where)
            result = quick_evaluate(self.costs, plan, devices, bound)
            if result is not None:
                return result
        graph = build_graph(self.costs, plan, devices, check, where)
        try:
            if overlap_steps:
                return steady_state(graph, bound, *steps)
            return evaluate(graph, bound, detail)
        except DeadlockError as exc:
            raise DeadlockError(f"{where}: {exc}") from None

    def bounds(self, plan: Plan, where: str = "<plan>") -> Bounds:
        """The least step any order of `plan`'s partition and placement, and any plan at all,
        can reach (`sim/bounds.py`): bounds of the synchronous step, never beaten."""
        devices = devices_for(self.profile, plan, where)
        joint = joint_bound(self.profile, devices, plan.num_microbatches)
        graph = build_graph(self.costs, plan, devices, check=False, where=where)
        return Bounds(plan=plan_bound(graph, joint), joint=joint)


def simulate(
    profile: Profile, plan: Plan, detail: bool = True, overlap_steps: bool = False
) -> SimResult:
    return Simulator(profile).run(plan, detail=detail, overlap_steps=overlap_steps)
