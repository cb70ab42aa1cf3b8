"""The bubble-aware tuner: co-optimizes partition, placement and scheduling.

    result = tune(profile, num_microbatches, num_devices, time_budget=30, seed=0,
                  baselines=[(label, plan), ...])
    result.best.plan, result.best.sim      # plan with `predicted` filled; simulator result

`balance.py` splits layers evenly for a placement, `seeds.py` builds the starting points,
`candidate.py` schedules a search point with the list scheduler, `moves.py` proposes changes
aimed at idle or overflowing devices, `local_search.py` runs one iterated local search,
`recompute.py` and `deeper.py` are the phases after the first, `reorder.py` polishes the best
plan, and `search.py` runs the phases in order (`tune`).
"""

from octopipe.tuner.search import Evaluated, TuneResult, check_plan_size, tune

__all__ = ["Evaluated", "TuneResult", "check_plan_size", "tune"]
