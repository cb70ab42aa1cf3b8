"""The tuner's searches past the first one's depth, where the layers allow more than
SEED_DEPTH stages a device (`search.py` docstring, steps 4 and 5).

`deepen`: the first search's steps over the seeds of every deeper chunk count, one start per
count, best-first; `one_deeper`: the first search once more, its moves free to give a device
one stage more than the seeds hold. Each is bounded by a share of the first search's work and
only adds finalists; `search.tune` decides when each runs.
"""

from __future__ import annotations

from collections.abc import Callable

from octopipe.tuner.candidate import Evaluator
from octopipe.tuner.local_search import Search
from octopipe.tuner.seeds import seed_candidates, startable

DEEP_STARTS = 8  # the deeper search's starts: one per chunk count first
DEEP_WORK_SHARE = 1.0  # its work: at most this times the first search's (stages x microbatches)
ONE_DEEPER_WORK_SHARE = 1.0  # the first search's walk one stage deeper, likewise


def deepen(
    search: Search,
    evaluator: Evaluator,
    first: int,
    last: int,
    work: float,
    allowed: Callable[[tuple[int, ...]], bool],
    overlap_steps: bool,
) -> bool:
    """The deeper search: seeds of every chunk count from `first` to `last` (each partition
    balanced for its placement), one start per chunk count, best-first turns, within
    DEEP_WORK_SHARE of `work` (the first search's). Whether the budget left it to its end."""
    seeds = seed_candidates(evaluator, last, first, search.deadline)
    seeds = startable(evaluator, seeds, allowed, overlap_steps)
    search.run(seeds, DEEP_STARTS, best_first=True, work=DEEP_WORK_SHARE * work)
    return search.converged


def one_deeper(
    search: Search,
    first_search: Callable[[float], None],
    allowed: Callable[[tuple[int, ...]], bool],
    work: float,
) -> bool:
    """The first search again (`first_search(work)`: its seeds, its turns and, as every run,
    its seeded kicks), its moves now free to give a device one stage more than the seeds hold
    (`search.py` docstring, 5), within ONE_DEEPER_WORK_SHARE of `work` (the first search's); where
    its path retraces the first's, the evaluations are cached. Whether the budget left it to
    its end."""
    search.allowed = allowed
    first_search(ONE_DEEPER_WORK_SHARE * work)
    return search.converged
