"""Balanced partitions: the min-max split is exact; refinement never worsens device loads."""

from __future__ import annotations

from itertools import accumulate, combinations, pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from octopipe.placement import interleaved, seed_placements, v_shape
from octopipe.profile import Device
from octopipe.tuner.balance import device_loads, min_max_stage_ranges, refine_device_loads


def slowest_stage(work, ranges, placement, speeds):
    return max((work[b] - work[a]) / speeds[d] for (a, b), d in zip(ranges, placement))


def brute_force(work, placement, speeds):
    L, S = len(work) - 1, len(placement)
    best = None
    for cuts in combinations(range(1, L), S - 1):
        bounds = [0, *cuts, L]
        t = slowest_stage(work, list(pairwise(bounds)), placement, speeds)
        best = t if best is None else min(best, t)
    return best


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 5.0), min_size=1, max_size=9), st.data())
def test_min_max_split_is_optimal(layer_work, data):
    L = len(layer_work)
    P = data.draw(st.integers(1, min(L, 3)))
    S = data.draw(st.integers(P, min(L, 2 * P)))
    placement = (
        interleaved(range(P), 1)
        if S == P
        else tuple(data.draw(st.lists(st.integers(0, P - 1), min_size=S, max_size=S)))
    )
    speeds = data.draw(st.lists(st.sampled_from([0.5, 1.0, 1.5]), min_size=P, max_size=P))
    work = [0.0, *accumulate(layer_work)]
    ranges = min_max_stage_ranges(work, placement, speeds)
    assert len(ranges) == S and ranges[0][0] == 0 and ranges[-1][1] == L
    assert all(a < b for a, b in ranges)
    assert all(ranges[i][1] == ranges[i + 1][0] for i in range(S - 1))
    assert slowest_stage(work, ranges, placement, speeds) == pytest.approx(
        brute_force(work, placement, speeds), rel=1e-9, abs=1e-9
    )


def test_refinement_lowers_the_most_loaded_device():
    work = [0.0, *accumulate([1.0] * 15 + [4.0])]  # a heavy last layer: 19 = 7 + 6 + 6 at best
    placement = v_shape(range(3), 2)
    speeds = [1.0] * 3
    start = min_max_stage_ranges(work, placement, speeds)
    refined = refine_device_loads(work, start, placement, speeds)
    assert max(device_loads(work, start, placement, speeds)) == 8.0
    assert max(device_loads(work, refined, placement, speeds)) == 7.0


def test_seed_placements_cover_every_family_and_respect_the_layer_count():
    devices = [Device(memory_bytes=m) for m in (1e9, 4e9, 2e9)]
    seeds = dict(seed_placements(devices, max_chunks=4, num_layers=7))
    assert seeds["sequential"] == (0, 1, 2)
    assert seeds["interleaved2"] == (0, 1, 2, 0, 1, 2)
    assert seeds["v2"] == (0, 1, 2, 2, 1, 0)
    assert seeds["sequential/order1"] == (1, 2, 0)  # most memory first
    assert all(len(p) <= 7 for p in seeds.values())  # 3 chunks would need 9 layers
