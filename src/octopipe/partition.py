"""Partitioners: which consecutive profile layers form each stage.

    partition(profile, num_stages, "uniform" | "titan" | "balanced", placement=None)
        -> [(start, end), ...]   half-open layer ranges, in model order, covering every layer

- uniform (Megatron-LM): the same number of blocks per stage; layers before the first block
  (embedding) go with the first stage, layers after the last block (norm, head) with the last.
- titan (torchtitan's default split): the embedding and the norm+head each count as one block,
  so the first and last stages get one block fewer than the others.
- balanced: the contiguous split that minimizes the slowest stage, a stage's time being its
  layers' f+b+w divided by the speed of the device it is placed on. Exact (dynamic program).

A "block" is any layer whose kind is not an embedding, norm, head or projector; a non-block
layer between blocks rides with the block before it. When the blocks cannot give every stage
one (titan: counting the ends as blocks), every layer counts as a block. This module knows
nothing of schedules or time beyond a stage's work.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

import numpy as np

from octopipe.errors import InputError
from octopipe.profile import Profile

METHODS = ("uniform", "titan", "balanced")
NON_BLOCK_KINDS = frozenset({"embedding", "vision_embed", "projector", "norm", "head"})

Ranges = list[tuple[int, int]]


def partition(
    profile: Profile, num_stages: int, method: str, placement: Sequence[int] | None = None
) -> Ranges:
    """Layer ranges of `num_stages` stages by `method` (see the module docstring)."""
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
        return balanced(profile, num_stages, stage_speeds(profile, num_stages, placement))
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
    """Prefix sums of layer work (f+b+w): stage [i, j) works prefix[j] - prefix[i]."""
    return [0.0, *accumulate(layer.work for layer in profile.layers)]


def stage_time(prefix: Sequence[float], start: int, end: int, speed: float) -> float:
    return (prefix[end] - prefix[start]) / speed


def bottleneck(profile: Profile, ranges: Ranges, speeds: Sequence[float]) -> float:
    """The slowest stage's time of a split: what `balanced` minimizes."""
    prefix = work_prefix(profile)
    return max(stage_time(prefix, a, b, sp) for (a, b), sp in zip(ranges, speeds, strict=True))


def balanced(profile: Profile, num_stages: int, speeds: Sequence[float]) -> Ranges:
    """The contiguous split minimizing the slowest stage (exact).

    Dynamic program over stages, vectorized over split points: best[j] is the smallest
    bottleneck of layers [0, j) in the stages so far. O(S * L^2) arithmetic in numpy.
    """
    L, S = profile.num_layers, num_stages
    prefix = np.array(work_prefix(profile))
    span = prefix[None, :] - prefix[:, None]  # span[i, j]: work of layers [i, j)
    later = np.triu(np.ones((L + 1, L + 1), dtype=bool), k=1)  # only i < j is a stage
    best = np.full(L + 1, np.inf)
    best[0] = 0.0
    choice = np.zeros((S, L + 1), dtype=np.int64)
    for s in range(S):
        times = np.where(later, span / speeds[s], np.inf)
        candidates = np.maximum(best[:, None], times)  # [i, j]: stages so far then [i, j)
        choice[s] = np.argmin(candidates, axis=0)
        best = candidates[choice[s], np.arange(L + 1)]
    ranges = []
    end = L
    for s in range(S - 1, -1, -1):
        start = int(choice[s, end])
        ranges.append((start, end))
        end = start
    return ranges[::-1]
