"""Balanced partitions for a fixed placement: contiguous layer ranges that even out the work.

Three pure functions on the profile's prefix sums (`CostTable`):

1. `min_max_stage_ranges`: the split into S non-empty stages whose slowest stage (work / speed of
   its device) is as fast as possible, found by bisection on that time with an exact
   feasibility check over reachable stage ends (O(S * L) per check);
2. `proportional_ranges`: cuts at each stage's fair share of the work (a second start when a
   device holds several stages);
3. `refine_device_loads`: moves single layers across stage boundaries while that lowers the most
   loaded device (a device's load is the sum of its stages' work / its speed), which is what
   bounds a pipeline's steady state when a device holds several stages.

None looks at memory or at the schedule; the tuner does, by simulation.
"""

from __future__ import annotations

import itertools
from bisect import bisect_right
from collections.abc import Sequence

from octopipe.costs import CostTable

Ranges = tuple[tuple[int, int], ...]


def min_max_stage_ranges(
    work: Sequence[float], placement: Sequence[int], speeds: Sequence[float]
) -> Ranges:
    """Non-empty contiguous ranges, one per stage, minimising the slowest stage's time."""
    num_layers, S = len(work) - 1, len(placement)
    if S > num_layers:
        raise ValueError(f"{S} stages need at least {S} layers, the model has {num_layers}")
    stage_speed = [speeds[d] for d in placement]
    # One stage could hold everything: feasible (the margin absorbs rounding in the check).
    lo, hi = 0.0, work[-1] / min(stage_speed) * (1 + 1e-9) + 1e-300
    best = _split_within(work, stage_speed, hi)
    for _ in range(60):  # bisection to float precision of the bound
        mid = (lo + hi) / 2
        split = _split_within(work, stage_speed, mid)
        if split is None:
            lo = mid
        else:
            hi, best = mid, split
        if hi - lo <= 1e-12 * hi:
            break
    assert best is not None
    return best


def _split_within(
    work: Sequence[float], stage_speed: Sequence[float], limit: float
) -> Ranges | None:
    """A split whose every stage takes at most `limit` seconds, or None if there is none.

    Stages run at different speeds, so reaching furthest is not always best (a slow stage may
    then get a heavy layer): this tracks every position each stage can end at, O(S * L).
    """
    num_layers, S = len(work) - 1, len(stage_speed)
    reachable = [0]  # positions where the current stage may start, ascending
    came_from: list[dict[int, int]] = []  # per stage: end -> a start that reaches it
    for s, speed in enumerate(stage_speed):
        last_allowed = num_layers - (S - 1 - s)  # leave a layer for each later stage
        ends: dict[int, int] = {}
        marked = 0
        for start in reachable:
            # Furthest end e with work[e] - work[start] <= limit * speed.
            reach = min(bisect_right(work, work[start] + limit * speed) - 1, last_allowed)
            for end in range(max(start + 1, marked + 1), reach + 1):
                ends[end] = start
            marked = max(marked, reach)
        if not ends:
            return None
        came_from.append(ends)
        reachable = sorted(ends)
    if num_layers not in came_from[-1]:
        return None
    bounds = [num_layers]
    for ends in reversed(came_from):
        bounds.append(ends[bounds[-1]])
    bounds.reverse()
    return tuple(itertools.pairwise(bounds))


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
    costs: CostTable, placement: Sequence[int], speeds: Sequence[float]
) -> list[tuple[str, Ranges]]:
    """The tuner's partition seeds for a placement, labelled: the min-max split and, where a
    device holds several stages, the proportional split too, each refined for device loads."""
    work = costs.work
    ranges = min_max_stage_ranges(work, placement, speeds)
    if len(set(placement)) == len(placement):
        return [("", ranges)]
    options = [("", refine_device_loads(work, ranges, placement, speeds))]
    proportional = refine_device_loads(
        work, proportional_ranges(work, placement, speeds), placement, speeds
    )
    if proportional != options[0][1]:
        options.append(("/fair", proportional))
    return options
