"""Partitioners: which consecutive profile layers form each stage.

    partition(profile, num_stages, "uniform" | "titan" | "balanced", placement=None)
        -> [(start, end), ...]   half-open layer ranges, in model order, covering every layer

- uniform (Megatron-LM): the same number of blocks per stage; layers before the first block
  (embedding) go with the first stage, layers after the last block (norm, head) with the last.
- titan (torchtitan's default split): the embedding and the norm+head each count as one block,
  so the first and last stages get one block fewer than the others.
- balanced: the contiguous split that minimizes the slowest stage, a stage's time being its
  layers' f+b+w divided by the speed of the device it is placed on; then the second slowest,
  and so on (leximax; `min_max_ranges`, which the tuner's seeds start from too). Exact.

A "block" is any layer whose kind is not an embedding, norm, head or projector; a non-block
layer between blocks rides with the block before it. When the blocks cannot give every stage
one (titan: counting the ends as blocks), every layer counts as a block. This module knows
nothing of schedules or time beyond a stage's work.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections.abc import Sequence

from octopipe.costs import CostTable
from octopipe.errors import InputError
from octopipe.profile import Profile

METHODS = ("uniform", "titan", "balanced")
NON_BLOCK_KINDS = frozenset({"embedding", "vision_embed", "projector", "norm", "head"})

Ranges = list[tuple[int, int]]


class OutOfTime(Exception):
    """The min-max partitioner reached its deadline (huge profiles: it is O(S x L log L))."""


def partition(
    profile: Profile,
    num_stages: int,
    method: str,
    placement: Sequence[int] | None = None,
    deadline: float = math.inf,
) -> Ranges:
    """Layer ranges of `num_stages` stages by `method` (see the module docstring). `deadline`
    (a `time.perf_counter()` value) bounds the balanced method: past it, OutOfTime."""
    if method not in METHODS:
        known = ", ".join(METHODS)
        raise InputError("partition", f"unknown method {method!r}; choose one of {known}")
    if num_stages < 1:
        raise InputError("partition", f"needs at least 1 stage, got {num_stages}")
    if profile.num_layers < num_stages:
        raise InputError(
            profile.name, f"{profile.num_layers} layers cannot fill {num_stages} stages", "layers"
        )
    if method == "balanced":
        return balanced(profile, num_stages, placement, deadline)
    blocks = block_positions(profile)
    has_input = bool(blocks) and blocks[0] > 0
    has_output = bool(blocks) and blocks[-1] < profile.num_layers - 1
    if method == "uniform" and len(blocks) >= num_stages:
        counts = even_counts(len(blocks), num_stages)
    elif method == "titan" and len(blocks) + has_input + has_output >= num_stages:
        counts = titan_counts(len(blocks), num_stages, has_input, has_output)
    else:  # too few blocks to give every stage one: every layer counts as a block
        blocks = list(range(profile.num_layers))
        counts = even_counts(profile.num_layers, num_stages)
    return _ranges_from_block_counts(profile.num_layers, blocks, counts)


def block_positions(profile: Profile) -> list[int]:
    """Indices of the layers that are blocks (not embedding, norm, head or projector)."""
    return [i for i, layer in enumerate(profile.layers) if layer.kind not in NON_BLOCK_KINDS]


def even_counts(num_units: int, num_stages: int) -> list[int]:
    """`num_units` spread over the stages as evenly as possible, the first stages one more."""
    base, extra = divmod(num_units, num_stages)
    return [base + (1 if s < extra else 0) for s in range(num_stages)]


def titan_counts(num_blocks: int, num_stages: int, has_input: bool, has_output: bool) -> list[int]:
    """torchtitan's rule: the input and output layers weigh one block each; those "effective
    blocks" are spread evenly (the first stages one more), then the first and last stage give
    back the weight of what they already hold. A stage of 0 blocks holds only the embedding
    (or only norm and head), as torchtitan allows."""
    if num_stages == 1:
        return [num_blocks]
    in_w, out_w = int(has_input), int(has_output)
    effective = even_counts(num_blocks + in_w + out_w, num_stages)
    return [effective[0] - in_w, *effective[1:-1], effective[-1] - out_w]


def _ranges_from_block_counts(num_layers: int, blocks: list[int], counts: list[int]) -> Ranges:
    """Stage ranges holding `counts` blocks each. Layers before the first block join the first
    stage, layers after the last block the last stage, others the block before them."""
    bounds, seen = [0], 0
    for c in counts[:-1]:
        seen += c
        bounds.append(blocks[seen] if seen < len(blocks) else blocks[-1] + 1)
    bounds.append(num_layers)
    return list(zip(bounds, bounds[1:]))


# --- balanced ------------------------------------------------------------------------------

# `min_max_ranges` compares stage times on layer work in units of 2**-RESOLUTION_BITS of the
# model's total work (rounded down to a power of two), as integers.
RESOLUTION_BITS = 40


def min_max_ranges(
    work: Sequence[float],
    speeds: Sequence[float],
    devices: Sequence[int] | None = None,
    back_loaded: bool = False,
    deadline: float = math.inf,
) -> tuple[tuple[int, int], ...]:
    """The split of the layers into `len(speeds)` non-empty contiguous stages, stage s running
    at `speeds[s]`, whose slowest stage (work / speed) is as fast as possible, with the tie-break
    below. The one min-max partitioner: the balanced baselines and the tuner's seeds use it.

    `work` is the prefix sum of layer work (`CostTable.work`): [0, w0, w0 + w1, ...];
    `devices[s]`, when given, is the device of stage s (the placement).

    Stage times are compared on layer work rounded to 2**-RESOLUTION_BITS of the total, in
    integers: stage sums are exact, so stages of equal layers tie exactly (float prefix sums
    differ in their last bits and would pick among ties at random). The bottleneck is exact up
    to that rounding.

    Tie-break (default): the leximax order. The slowest stage as fast as possible, then the
    second slowest, and so on: no stage is slower than the layers force it to be. Splits with
    the same sorted stage times differ in where the heavier stages sit:
    - the later stages are as light as they can be: the last stage as short as possible, then
      the one before it, and so on. On the benchmark zoo's sequential schedules (1F1B, ZB-H1,
      ZB-H2), heavy stages early are up to 5% faster than heavy stages late, and never more
      than 0.01% slower;
    - when stages share a device, whose steady state is bounded by the sum of its stages,
      single-layer boundary moves that keep the sorted stage times (they swap two stages'
      times) then lower the more loaded of the two devices they touch, while one does
      (`_even_out_devices`, a deterministic local search).

    `back_loaded=True`: another tie-break among the min-max splits (not leximax): from the last
    stage back, each stage starts as early as the optimal bottleneck allows, so the first
    stages get what is left. Early stages hold the most activations in 1F1B-like schedules,
    so this split leaves them the most memory; the tuner seeds from this one.

    Method, O(S x L log L) plus the leximax step on the stage ends that survive:
    1. the smallest bottleneck of every prefix of the layers in the first s stages, and of
       every suffix in the last ones (`_prefix_bottlenecks`), give the optimal bottleneck T*
       and the stage ends some split within T* can use;
    2. a dynamic program over those ends keeps, per (stage, end), the leximax-smallest
       vector of the prefix's stage times. Adding a common element keeps the leximax order,
       so the best split of a prefix extends a best split of a shorter one; the candidates
       are the starts whose stage and shorter prefix both stay within the prefix's smallest
       bottleneck (the others have a larger first element).
    """
    num_layers, S = len(work) - 1, len(speeds)
    if not 1 <= S <= num_layers:
        raise ValueError(f"{S} stages need 1 to {num_layers} (the layer count) stages")
    _check_clock(deadline)
    prefix = _integer_prefix(work)
    _check_clock(deadline)
    # forward[s][j - s - 1]: the smallest bottleneck of layers [0, j) in stages 0..s.
    forward = _prefix_bottlenecks(prefix, speeds, deadline)
    limit = forward[-1][-1]  # T*
    if back_loaded:
        return _back_loaded(prefix, speeds, forward, limit)
    # backward[m - 1][(L - j) - m]: that of layers [j, L) in the last m stages.
    backward = _prefix_bottlenecks(
        [prefix[-1] - p for p in reversed(prefix)], list(reversed(speeds)), deadline
    )
    ends_ok = _ends_within(forward, backward, limit, num_layers)
    bounds = _leximax_bounds(prefix, speeds, forward, ends_ok, deadline)
    if devices is not None and len(set(devices)) < S:
        _even_out_devices(prefix, speeds, devices, bounds)
    return tuple(zip(bounds, bounds[1:]))


def _integer_prefix(work: Sequence[float]) -> list[int]:
    """The work prefix in integer units of 2**-RESOLUTION_BITS of the total."""
    total = work[-1] - work[0]
    # The unit, at least the smallest float (a subnormal total would round it to 0).
    unit = max(math.ldexp(1.0, math.frexp(total)[1] - RESOLUTION_BITS), math.ulp(0.0))
    prefix = [0]
    for a, b in zip(work, work[1:]):
        prefix.append(prefix[-1] + max(0, round((b - a) / unit)))
    return prefix


def _ends_within(
    forward: list[list[float]], backward: list[list[float]], limit: float, num_layers: int
) -> list[list[int]]:
    """Per stage: the ends within T* (`limit`) from both sides."""
    S = len(forward)
    ends_ok: list[list[int]] = []
    for s in range(S):
        later = S - 1 - s
        if not later:
            ends_ok.append([num_layers])
            continue
        row = forward[s]
        suffix = backward[later - 1]
        ends_ok.append(
            [
                j
                for j in range(s + 1, s + 1 + len(row))
                if row[j - s - 1] <= limit and suffix[num_layers - j - later] <= limit
            ]
        )
    return ends_ok


def _leximax_bounds(
    prefix: list[int],
    speeds: Sequence[float],
    forward: list[list[float]],
    ends_ok: list[list[int]],
    deadline: float,
) -> list[int]:
    """The stage bounds of the leximax-smallest split over the kept ends (step 2 of
    `min_max_ranges`)."""
    S, num_layers = len(speeds), len(prefix) - 1
    # A vector holds a split's stage times negated, in ascending order, so the larger tuple is
    # the better split.
    vectors: dict[int, tuple[float, ...]] = {0: ()}
    bounds_of: dict[int, float] = {0: 0.0}  # best bottleneck of the prefix ending there
    keys: list[int] = [0]  # the previous stage's kept ends, ascending
    starts: list[dict[int, int]] = []  # per stage: end -> the start of the best split
    for s in range(S):
        speed, row, offset = speeds[s], forward[s], s + 1
        chosen: dict[int, int] = {}
        found: dict[int, tuple[float, ...]] = {}
        for n, j in enumerate(ends_ok[s]):
            if not n % _CLOCK_EVERY:
                _check_clock(deadline)
            bound, pj = row[j - offset], prefix[j]
            top: tuple[float, ...] | None = None
            for idx in range(bisect_left(keys, j) - 1, -1, -1):  # latest start first
                i = keys[idx]
                t = (pj - prefix[i]) / speed
                if t > bound:  # so are the earlier starts
                    break
                if bounds_of[i] > bound:
                    continue
                vec = vectors[i]
                k = bisect_left(vec, -t)
                cand = vec[:k] + (-t,) + vec[k:]
                if top is None or cand > top:  # equal vectors keep the later start
                    top, chosen[j] = cand, i
            assert top is not None  # the start that gives `bound` is among them
            found[j] = top
        starts.append(chosen)
        vectors, keys = found, ends_ok[s]
        bounds_of = {j: row[j - offset] for j in keys}
    bounds = [num_layers]
    for chosen in reversed(starts):
        bounds.append(chosen[bounds[-1]])
    bounds.reverse()
    return bounds


def _back_loaded(
    prefix: Sequence[int], speeds: Sequence[float], forward: list[list[float]], limit: float
) -> tuple[tuple[int, int], ...]:
    """The min-max split whose stages, from the last, each start as early as `limit` (T*)
    allows: the earliest start whose stage and prefix both stay within it."""
    S = len(speeds)
    bounds = [len(prefix) - 1]
    for s in range(S - 1, 0, -1):
        j, prev, speed = bounds[-1], forward[s - 1], speeds[s]
        i = next(
            i
            for i in range(s, j)
            if (prefix[j] - prefix[i]) / speed <= limit and prev[i - s] <= limit
        )
        bounds.append(i)
    bounds.append(0)
    return tuple(zip(bounds[::-1], bounds[-2::-1]))


def _even_out_devices(
    prefix: Sequence[int], speeds: Sequence[float], devices: Sequence[int], bounds: list[int]
) -> None:
    """Move single stage boundaries (in place) where the two stages swap their times and the
    more loaded of their two devices gets less loaded; the steepest such move first, until
    none is left. The sorted stage times never change."""
    S = len(speeds)
    times = [(prefix[bounds[s + 1]] - prefix[bounds[s]]) / speeds[s] for s in range(S)]
    stages_of: dict[int, list[int]] = {}
    for s, d in enumerate(devices):
        stages_of.setdefault(d, []).append(s)

    def load(d: int) -> float:
        return sum(times[s] for s in stages_of[d])

    while True:
        best = None  # (new max of the two loads, boundary, position, the two new times)
        for k in range(1, S):
            a, b = devices[k - 1], devices[k]
            if a == b:
                continue
            now = max(load(a), load(b))
            for cut in (bounds[k] - 1, bounds[k] + 1):
                if not bounds[k - 1] < cut < bounds[k + 1]:
                    continue
                left = (prefix[cut] - prefix[bounds[k - 1]]) / speeds[k - 1]
                right = (prefix[bounds[k + 1]] - prefix[cut]) / speeds[k]
                if (left, right) != (times[k], times[k - 1]):
                    continue  # not a swap of the two times
                old = times[k - 1], times[k]
                times[k - 1], times[k] = left, right
                after = max(load(a), load(b))
                times[k - 1], times[k] = old
                if after < now and (best is None or after < best[0]):
                    best = (after, k, cut, left, right)
        if best is None:
            return
        _, k, bounds[k], times[k - 1], times[k] = best


_CLOCK_EVERY = 4096  # iterations between looks at the clock


def _check_clock(deadline: float) -> None:
    if deadline < math.inf and time.perf_counter() > deadline:
        raise OutOfTime


def _prefix_bottlenecks(
    prefix: Sequence[int], speeds: Sequence[float], deadline: float = math.inf
) -> list[list[float]]:
    """out[s][j - s - 1]: the smallest bottleneck of layers [0, j) in stages 0..s, for every
    end j that leaves a layer to each later stage. O(S x L log L): a row a stage
    (`partition_loop.next_row`, compiled), the clock looked at between rows."""
    import numpy as np

    from octopipe.partition_loop import next_row

    num_layers, S = len(prefix) - 1, len(speeds)
    ints = np.asarray(prefix, np.int64)
    width = num_layers - S + 1
    rows = [ints[1 : width + 1] / speeds[0]]
    starts = np.empty(width, np.int64)
    for s in range(1, S):
        _check_clock(deadline)
        row = np.empty(width)
        next_row(rows[-1], ints, float(speeds[s]), s, S, row, starts)
        rows.append(row)
    return [row.tolist() for row in rows]


def stage_speeds(profile: Profile, num_stages: int, placement: Sequence[int] | None) -> list[float]:
    """Speed of each stage's device: 1.0 without a placement or without devices in the profile."""
    if placement is None:
        return [1.0] * num_stages
    if len(placement) != num_stages:
        raise InputError(
            "partition", f"placement names {len(placement)} stages, expected {num_stages}"
        )
    devices = profile.devices
    if devices is None:
        return [1.0] * num_stages
    for s, d in enumerate(placement):
        if not 0 <= d < len(devices):
            raise InputError(
                "partition", f"stage {s} placed on device {d}, the profile has {len(devices)}"
            )
    return [devices[d].speed for d in placement]


def work_prefix(profile: Profile) -> list[float]:
    """Prefix sums of layer work (f+b+w), as the tuner sees them (`CostTable.work`): stage
    [i, j) works prefix[j] - prefix[i]."""
    return CostTable(profile).work


def bottleneck(profile: Profile, ranges: Ranges, speeds: Sequence[float]) -> float:
    """The slowest stage's time of a split: what `balanced` minimizes first."""
    prefix = work_prefix(profile)
    return max((prefix[b] - prefix[a]) / sp for (a, b), sp in zip(ranges, speeds, strict=True))


def balanced(
    profile: Profile,
    num_stages: int,
    placement: Sequence[int] | None = None,
    deadline: float = math.inf,
) -> Ranges:
    """The leximax split for the stages' device speeds (`min_max_ranges`)."""
    speeds = stage_speeds(profile, num_stages, placement)
    return list(min_max_ranges(work_prefix(profile), speeds, placement, deadline=deadline))
