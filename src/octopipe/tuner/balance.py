"""Balanced partitions for a fixed placement: contiguous layer ranges that even out the work.

The seeds start from the partitioners' min-max split (`octopipe.partition.min_max_ranges`: the
slowest stage, work / speed of its device, as fast as possible) with its back-loaded tie-break,
which leaves the early stages (those holding the most activations) the most memory. The
leximax split the balanced baselines use reaches the search too, as the seed "from" each
baseline; seeding from it here as well steered the local search to worse plans on some cases
(benchmarks/bench_tuner.py: llama3-70b on 4 devices 0.961 instead of 0.965 efficiency).

Two refinements here, pure functions on the profile's prefix sums (`CostTable`):

1. `proportional_ranges`: cuts at each stage's fair share of the work (a second start when a
   device holds several stages);
2. `refine_device_loads`: moves single layers across stage boundaries while that lowers the most
   loaded device (a device's load is the sum of its stages' work / its speed), which is what
   bounds a pipeline's steady state when a device holds several stages.

None looks at memory or at the schedule; the tuner does, by simulation.
"""

from __future__ import annotations

import itertools
import math
from bisect import bisect_right
from collections.abc import Sequence

from octopipe.costs import CostTable
from octopipe.partition import min_max_ranges

Ranges = tuple[tuple[int, int], ...]


def device_loads(
    work: Sequence[float], ranges: Ranges, placement: Sequence[int], speeds: Sequence[float]
) -> list[float]:
    """Seconds of work per microbatch on each device."""
    loads = [0.0] * len(speeds)
    for (a, b), d in zip(ranges, placement):
        loads[d] += (work[b] - work[a]) / speeds[d]
    return loads


def refine_device_loads(
    work: Sequence[float],
    ranges: Ranges,
    placement: Sequence[int],
    speeds: Sequence[float],
    max_moves: int = 10_000,
) -> Ranges:
    """Hill-climb on single-layer boundary moves, lowering (max, sum of squares) of the loads."""
    bounds = [a for a, _ in ranges] + [ranges[-1][1]]
    S = len(ranges)

    def score(bs: list[int]) -> tuple[float, float]:
        loads = device_loads(work, tuple(itertools.pairwise(bs)), placement, speeds)
        return max(loads), sum(x * x for x in loads)

    current = score(bounds)
    for _ in range(max_moves):
        best_move, best_score = None, current
        for k in range(1, S):  # inner boundary k sits between stage k-1 and stage k
            for step in (-1, 1):
                moved = bounds[k] + step
                if not bounds[k - 1] < moved < bounds[k + 1]:
                    continue
                trial = bounds[:k] + [moved] + bounds[k + 1 :]
                sc = score(trial)
                if sc < best_score:
                    best_move, best_score = trial, sc
        if best_move is None:
            break
        bounds, current = best_move, best_score
    return tuple(itertools.pairwise(bounds))


def proportional_ranges(
    work: Sequence[float], placement: Sequence[int], speeds: Sequence[float]
) -> Ranges:
    """Cut where each stage gets its device's fair share of the work, split evenly among the
    device's stages; rounding to layer boundaries then errs both ways and partly cancels."""
    num_layers, S = len(work) - 1, len(placement)
    count = [0] * len(speeds)
    for d in placement:
        count[d] += 1
    share = [speeds[d] / count[d] for d in placement]
    scale = work[-1] / sum(share)
    bounds, target = [0], 0.0
    for s in range(S - 1):
        target += share[s] * scale
        lo, hi = bounds[-1] + 1, num_layers - (S - 1 - s)  # keep every stage non-empty
        cut = min(max(bisect_right(work, target), lo), hi)
        if cut > lo and target - work[cut - 1] < work[cut] - target:
            cut -= 1  # the boundary before `target` is nearer
        bounds.append(cut)
    bounds.append(num_layers)
    return tuple(itertools.pairwise(bounds))


def balanced_ranges(
    costs: CostTable,
    placement: Sequence[int],
    speeds: Sequence[float],
    deadline: float = math.inf,
    recompute: str = "none",
) -> list[tuple[str, Ranges]]:
    """The tuner's partition seeds for a placement, labelled: the back-loaded min-max split
    ("/back") and, where a device holds several stages, the proportional split too ("/fair"),
    each then refined for device loads; duplicates once. OutOfTime past `deadline`.
    `recompute`: balance the work of every layer recomputed so (where it offers it)."""
    work = costs.work_under(recompute)
    stage_speeds = [speeds[d] for d in placement]
    splits = [
        ("/back", min_max_ranges(work, stage_speeds, back_loaded=True, deadline=deadline)),
    ]
    if len(set(placement)) < len(placement):
        splits = [(tag, refine_device_loads(work, r, placement, speeds)) for tag, r in splits]
        splits.append(
            (
                "/fair",
                refine_device_loads(
                    work, proportional_ranges(work, placement, speeds), placement, speeds
                ),
            )
        )
    options: list[tuple[str, Ranges]] = []
    for tag, ranges in splits:
        if all(ranges != r for _, r in options):
            options.append((tag, ranges))
    return options
