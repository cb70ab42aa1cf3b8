"""Balanced partitions: the min-max split (leximax for the baselines, back-loaded for the tuner's
seeds) is exact and keeps the leximax stage times when stages share a device; refinement never
worsens device loads."""

from __future__ import annotations

from itertools import accumulate, combinations, pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from octopipe.partition import min_max_ranges
from octopipe.placement import interleaved, seed_placements, v_shape
from octopipe.profile import Device
from octopipe.tuner.balance import device_loads, refine_device_loads


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
    stage_speeds = [speeds[d] for d in placement]
    ranges = min_max_ranges(work, stage_speeds, placement)
    assert len(ranges) == S and ranges[0][0] == 0 and ranges[-1][1] == L
    assert all(a < b for a, b in ranges)
    assert all(ranges[i][1] == ranges[i + 1][0] for i in range(S - 1))
    assert slowest_stage(work, ranges, placement, speeds) == pytest.approx(
        brute_force(work, placement, speeds), rel=1e-9, abs=1e-9
    )
    # The placement only picks among splits of the same sorted stage times, for lower loads.
    alone = min_max_ranges(work, stage_speeds)
    assert sorted_times(work, ranges, stage_speeds) == pytest.approx(
        sorted_times(work, alone, stage_speeds), rel=1e-9, abs=1e-9
    )
    loads = device_loads(work, ranges, placement, speeds)
    assert max(loads) <= max(device_loads(work, alone, placement, speeds)) * (1 + 1e-9) + 1e-9


def sorted_times(work, ranges, stage_speeds):
    return sorted((work[b] - work[a]) / s for (a, b), s in zip(ranges, stage_speeds))


def test_refinement_lowers_the_most_loaded_device():
    work = [0.0, *accumulate([1.0] * 14 + [4.0, 4.0])]  # two heavy last layers: 22 = 11 + 11
    placement = v_shape(range(2), 2)
    speeds = [1.0] * 2
    start = min_max_ranges(work, [1.0] * 4, placement)  # stage times 6, 6, 6, 4 at best
    refined = refine_device_loads(work, start, placement, speeds)
    assert max(device_loads(work, start, placement, speeds)) == 12.0
    assert max(device_loads(work, refined, placement, speeds)) == 11.0


def test_shared_devices_pick_the_split_with_lower_loads():
    # Stage times 2, 1, 1, 2 and 1, 2, 1, 2 tie in the leximax order; V-shape pairs stages
    # (0, 3) on device 0 and (1, 2) on device 1.
    work = [0.0, *accumulate([1.0, 1.0, 1.0, 1.0, 2.0])]
    placement = v_shape(range(2), 2)
    alone = min_max_ranges(work, [1.0] * 4)
    assert alone == ((0, 2), (2, 3), (3, 4), (4, 5))  # later stages as light as they can be
    shared = min_max_ranges(work, [1.0] * 4, placement)
    assert shared == ((0, 1), (1, 3), (3, 4), (4, 5))
    assert device_loads(work, alone, placement, [1.0] * 2) == [4.0, 2.0]
    assert device_loads(work, shared, placement, [1.0] * 2) == [3.0, 3.0]


def test_seed_placements_cover_every_family_and_respect_the_layer_count():
    devices = [Device(memory_bytes=m) for m in (1e9, 4e9, 2e9)]
    seeds = dict(seed_placements(devices, max_chunks=4, num_layers=7))
    assert seeds["sequential"] == (0, 1, 2)
    assert seeds["interleaved2"] == (0, 1, 2, 0, 1, 2)
    assert seeds["v2"] == (0, 1, 2, 2, 1, 0)
    assert seeds["sequential/order1"] == (1, 2, 0)  # most memory first
    assert all(len(p) <= 7 for p in seeds.values())  # 3 chunks would need 9 layers
