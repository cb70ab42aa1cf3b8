"""The bubble-aware tuner: co-optimizes partition, placement and scheduling.

    result = tune(profile, num_microbatches, num_devices, time_budget=30, seed=0,
                  baselines=[(label, plan), ...])
    result.best.plan, result.best.sim      # plan with `predicted` filled; simulator result

`balance.py` splits layers evenly for a placement, `placement.py` builds placement seeds,
`candidate.py` schedules a search point with the list scheduler, `moves.py` proposes changes
aimed at idle or overflowing devices, `search.py` runs the iterated local search.
"""

from octopipe.tuner.search import Evaluated, TuneResult, check_plan_size, tune

__all__ = ["Evaluated", "TuneResult", "check_plan_size", "tune"]
