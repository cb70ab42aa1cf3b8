"""The tuner's recomputation search, where memory binds (`search.py` docstring, step 4).

What each stage recomputes becomes a variable of the search, as AdaPipe makes it (Sun et al.,
ASPLOS 2024): `memory_binds` says whether it is worth a search, `recompute` runs it (jointly
with the partition, then per kind with every stage recomputing alike). Bounded by shares of the
first search's work; it only adds finalists.
"""

from __future__ import annotations

from collections.abc import Callable

from octopipe.costs import CostTable
from octopipe.plan import NO_RECOMPUTE
from octopipe.tuner.balance import Ranges
from octopipe.tuner.candidate import Evaluator, Outcome
from octopipe.tuner.local_search import Search
from octopipe.tuner.seeds import seed_candidates, startable

RECOMPUTE_WORK_SHARE = 1.0  # the joint search's work, at most this times the first search's
KIND_WORK_SHARE = 0.5  # then each kind's search, every stage recomputing it, likewise
RECOMPUTE_FROM = 3  # the joint search also starts from this many best plans found before it
MEMORY_GAIN = 0.01  # memory binds where a plan that does not fit was this much faster


def memory_binds(search: Search) -> bool:
    """Whether per-stage recomputation is worth a search: the profile prices it, and memory
    kept the search from faster plans (the best plan does not fit, or one that does not was
    faster by MEMORY_GAIN)."""
    best = search.best
    if not search.evaluator.costs.recompute or best is None:
        return False
    fastest = min(o.makespan for o in search.seen.values())
    return not best.fits or fastest < (1 - MEMORY_GAIN) * best.makespan


def recompute(
    search: Search,
    evaluator: Evaluator,
    depth: int,
    before: list[Outcome],
    work: float,
    allowed: Callable[[tuple[int, ...]], bool],
    overlap_steps: bool,
) -> bool:
    """The recomputation search (`search.py` docstring, 4). First jointly: seeds of up to `depth`
    chunks that recompute every stage one way, balanced for it, and the `before` plans as they
    are and recomputing every stage, recomputation moves first, within RECOMPUTE_WORK_SHARE of
    `work` (the first search's). Then one search per kind with every stage recomputing it and
    no recomputation moves (what the profile's global flag would give), each within
    KIND_WORK_SHARE of `work`: the joint descent, led by the moves that take recomputation
    back where memory allows, can settle far from a plan that recomputes alike everywhere
    (BENCHMARKS.md, per-stage recomputation). Whether the budget left it to its end."""
    costs = evaluator.costs
    everywhere = {
        kind: [
            c.but(recompute=_everywhere(costs, c.ranges, kind), label=c.label + f"/{kind}")
            for c in seed_candidates(evaluator, depth, deadline=search.deadline, recompute=kind)
        ]
        for kind in costs.recompute
    }
    joint = [o.candidate for o in before]
    for kind, seeds in everywhere.items():
        joint += seeds
        joint += [
            o.candidate.but(recompute=_everywhere(costs, o.candidate.ranges, kind)) for o in before
        ]
    search.recomputing = True
    starts = startable(evaluator, joint, allowed, overlap_steps)
    search.run(starts, best_first=True, work=RECOMPUTE_WORK_SHARE * work)
    search.recomputing = False
    converged = search.converged
    for seeds in everywhere.values():
        if search.out_of_time():
            return False
        starts = startable(evaluator, seeds, allowed, overlap_steps)
        search.run(starts, best_first=True, work=KIND_WORK_SHARE * work)
        converged = converged and search.converged
    return converged


def _everywhere(costs: CostTable, ranges: Ranges, kind: str) -> tuple[str, ...]:
    """Every stage recomputing `kind`, where its layers offer it."""
    return tuple(kind if costs.offers(a, b, kind) else NO_RECOMPUTE for a, b in ranges)
