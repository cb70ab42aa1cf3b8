"""Partitioners: coverage, Megatron/torchtitan definitions, balanced optimality and its
tie-break (brute force)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from octopipe.errors import InputError
from octopipe.partition import METHODS, bottleneck, min_max_ranges, partition
from octopipe.profile import Device, LayerCost, Profile


def layer(name, kind="decoder", work=3.0):
    return LayerCost(
        name=name,
        kind=kind,
        f=work / 3,
        b=work / 3,
        w=work / 3,
        act_bytes=0,
        wact_bytes=0,
        param_bytes=0,
        out_bytes=1,
    )


def llm(num_blocks, head_work=3.0, devices=None):
    """tok_embeddings, layers.0..n-1, norm, output: the torchtitan naming."""
    layers = [layer("tok_embeddings", "embedding", 1.0)]
    layers += [layer(f"layers.{i}") for i in range(num_blocks)]
    layers += [layer("norm", "norm", 0.1), layer("output", "head", head_work)]
    return Profile(name="llm", layers=tuple(layers), devices=devices)


def blocks_per_stage(profile, ranges):
    return [sum(profile.layers[i].kind == "decoder" for i in range(a, b)) for a, b in ranges]


def names(profile, ranges):
    return [[profile.layers[i].name for i in range(a, b)] for a, b in ranges]


def assert_tiles(ranges, num_layers, num_stages):
    assert len(ranges) == num_stages
    assert ranges[0][0] == 0 and ranges[-1][1] == num_layers
    for (_, b), (c, _) in zip(ranges, ranges[1:]):
        assert b == c
    assert all(b > a for a, b in ranges)


def test_uniform_is_megatron_equal_blocks_with_embedding_first_and_head_last():
    p = llm(32)
    ranges = partition(p, 4, "uniform")
    assert blocks_per_stage(p, ranges) == [8, 8, 8, 8]
    assert names(p, ranges)[0][0] == "tok_embeddings"
    assert names(p, ranges)[-1][-2:] == ["norm", "output"]


def test_uniform_spreads_a_remainder_over_the_first_stages():
    p = llm(10)
    assert blocks_per_stage(p, partition(p, 4, "uniform")) == [3, 3, 2, 2]


def test_titan_gives_the_ends_one_block_less():
    # torchtitan: embedding and norm+output weigh one block each; 8 blocks + 2 over 4 stages.
    p = llm(8)
    assert names(p, partition(p, 4, "titan")) == [
        ["tok_embeddings", "layers.0", "layers.1"],
        ["layers.2", "layers.3", "layers.4"],
        ["layers.5", "layers.6"],
        ["layers.7", "norm", "output"],
    ]
    p = llm(14)
    assert blocks_per_stage(p, partition(p, 4, "titan")) == [3, 4, 4, 3]
    assert blocks_per_stage(p, partition(p, 1, "titan")) == [14]


def test_titan_may_leave_the_embedding_alone_in_the_first_stage():
    p = llm(3)  # 3 blocks + 2 weights over 5 stages: one effective block each
    assert names(p, partition(p, 5, "titan")) == [
        ["tok_embeddings"],
        ["layers.0"],
        ["layers.1"],
        ["layers.2"],
        ["norm", "output"],
    ]


def test_non_blocks_inside_the_stack_ride_with_the_block_before():
    kinds = [
        "vision_embed",
        "decoder",
        "decoder",
        "projector",
        "embedding",
        "decoder",
        "decoder",
        "norm",
        "head",
    ]
    p = Profile(name="vlm", layers=tuple(layer(f"l{i}", k) for i, k in enumerate(kinds)))
    assert partition(p, 2, "uniform") == [(0, 5), (5, 9)]
    assert partition(p, 4, "uniform") == [(0, 2), (2, 5), (5, 6), (6, 9)]


def test_few_blocks_count_every_layer():
    p = llm(2)  # 5 layers, only 2 blocks, 4 stages
    for method in METHODS:
        assert_tiles(partition(p, 4, method), 5, 4)


def test_balanced_moves_layers_away_from_a_heavy_head():
    p = llm(8, head_work=12.0)
    uniform = partition(p, 4, "uniform")
    balanced = partition(p, 4, "balanced")
    speeds = [1.0] * 4
    assert bottleneck(p, balanced, speeds) < bottleneck(p, uniform, speeds)
    assert blocks_per_stage(p, balanced)[-1] < 2


def test_balanced_gives_a_fast_device_more_layers():
    p = Profile(
        name="flat",
        layers=tuple(layer(f"layers.{i}") for i in range(12)),
        devices=(Device(speed=1.0), Device(speed=2.0)),
    )
    ranges = partition(p, 2, "balanced", placement=[0, 1])
    assert ranges == [(0, 4), (4, 12)]
    assert partition(p, 2, "balanced", placement=[1, 0]) == [(0, 8), (8, 12)]


@pytest.mark.parametrize("method", METHODS)
def test_errors_are_one_line(method):
    with pytest.raises(InputError, match="5 layers cannot fill 6 stages"):
        partition(llm(2), 6, method)
    with pytest.raises(InputError, match="at least 1 stage"):
        partition(llm(2), 0, method)


def test_bad_method_and_placement():
    with pytest.raises(InputError, match="unknown method"):
        partition(llm(4), 2, "greedy")
    with pytest.raises(InputError, match="placement names 3 stages, expected 2"):
        partition(llm(4), 2, "balanced", placement=[0, 1, 0])
    p = llm(4, devices=(Device(), Device()))
    with pytest.raises(InputError, match="device 2"):
        partition(p, 2, "balanced", placement=[0, 2])


# --- properties ----------------------------------------------------------------------------

KINDS_BEFORE = st.lists(st.sampled_from(["embedding", "vision_embed"]), max_size=2)
KINDS_AFTER = st.lists(st.sampled_from(["norm", "head"]), max_size=2)


@st.composite
def profiles(draw, max_blocks=12):
    before = draw(KINDS_BEFORE)
    after = draw(KINDS_AFTER)
    works = st.floats(0.0, 10.0, allow_nan=False)
    middle_kinds = st.sampled_from(["decoder", "decoder", "projector"])
    middle = draw(st.lists(middle_kinds, max_size=max_blocks))
    kinds = [*before, *middle, *after]
    if not kinds:
        kinds = ["decoder"]
    layers = tuple(layer(f"l{i}", k, draw(works)) for i, k in enumerate(kinds))
    return Profile(name="drawn", layers=layers)


@settings(max_examples=150, deadline=None)
@given(profiles(), st.integers(1, 8), st.sampled_from(METHODS))
def test_every_method_tiles_all_layers(profile, num_stages, method):
    if num_stages > profile.num_layers:
        with pytest.raises(InputError):
            partition(profile, num_stages, method)
        return
    assert_tiles(partition(profile, num_stages, method), profile.num_layers, num_stages)


@settings(max_examples=150, deadline=None)
@given(profiles(), st.integers(1, 6))
def test_uniform_block_counts_differ_by_at_most_one(profile, num_stages):
    num_blocks = sum(layer.kind == "decoder" for layer in profile.layers)
    if num_stages > profile.num_layers or num_blocks < num_stages:
        return
    counts = blocks_per_stage(profile, partition(profile, num_stages, "uniform"))
    assert sum(counts) == num_blocks
    assert max(counts) - min(counts) <= 1
    assert counts == sorted(counts, reverse=True)  # the remainder goes to the first stages


def brute_force_bottleneck(profile, speeds):
    L, S = profile.num_layers, len(speeds)
    best = float("inf")
    for cuts in itertools.combinations(range(1, L), S - 1):
        bounds = [0, *cuts, L]
        ranges = list(zip(bounds, bounds[1:]))
        best = min(best, bottleneck(profile, ranges, speeds))
    return best


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(0.0, 10.0, allow_nan=False), min_size=1, max_size=9),
    st.lists(st.sampled_from([0.5, 1.0, 1.5, 3.0]), min_size=1, max_size=4),
)
def test_balanced_is_optimal(works, speeds):
    if len(speeds) > len(works):
        return
    devices = tuple(Device(speed=s) for s in speeds)
    layers = tuple(layer(f"l{i}", work=w) for i, w in enumerate(works))
    profile = Profile(name="drawn", layers=layers, devices=devices)
    ranges = partition(profile, len(speeds), "balanced", placement=list(range(len(speeds))))
    assert_tiles(ranges, len(works), len(speeds))
    best = brute_force_bottleneck(profile, speeds)
    assert bottleneck(profile, ranges, speeds) == pytest.approx(best)


def leximax_brute_force(layer_work, speeds):
    """Every split, ranked by its stage times sorted slowest first, then (the tie-break) by
    its boundaries read from the last, largest first: the later stages as light as they can
    be."""
    L, S = len(layer_work), len(speeds)
    best = None
    for cuts in itertools.combinations(range(1, L), S - 1):
        bounds = [0, *cuts, L]
        times = [sum(layer_work[a:b]) / sp for a, b, sp in zip(bounds, bounds[1:], speeds)]
        key = (sorted(times, reverse=True), [-b for b in reversed(bounds)])
        if best is None or key < best[0]:
            best = (key, tuple(zip(bounds, bounds[1:])))
    return best[1]


@settings(max_examples=300, deadline=None)
@given(
    # Small whole numbers: sums are exact and ties are frequent (equal layers, 2 = 1 + 1).
    st.lists(st.sampled_from([0.0, 1.0, 2.0, 3.0, 5.0]), min_size=1, max_size=9),
    st.lists(st.sampled_from([0.5, 1.0, 1.5, 2.0]), min_size=1, max_size=5),
)
def test_min_max_ranges_tie_breaks_match_brute_force(layer_work, speeds):
    if len(speeds) > len(layer_work):
        return
    work = [0.0, *itertools.accumulate(layer_work)]
    assert min_max_ranges(work, speeds) == leximax_brute_force(layer_work, speeds)
    # One stage per device: device loads are the stage times, nothing to choose between.
    assert min_max_ranges(work, speeds, range(len(speeds))) == min_max_ranges(work, speeds)
    assert min_max_ranges(work, speeds, back_loaded=True) == back_loaded_brute_force(
        layer_work, speeds
    )


def back_loaded_brute_force(layer_work, speeds):
    """The min-max splits, the one whose boundaries read from the last are smallest: each
    stage from the last starts as early as the optimal bottleneck allows."""
    L, S = len(layer_work), len(speeds)
    best = None
    for cuts in itertools.combinations(range(1, L), S - 1):
        bounds = [0, *cuts, L]
        times = [sum(layer_work[a:b]) / sp for a, b, sp in zip(bounds, bounds[1:], speeds)]
        key = (max(times), list(reversed(bounds)))
        if best is None or key < best[0]:
            best = (key, tuple(zip(bounds, bounds[1:])))
    return best[1]


def test_min_max_ranges_ties_equal_layers_despite_rounding():
    # Prefix sums of 0.1 are not exact: stages of equal layer counts must still tie.
    work = [0.0, *itertools.accumulate([0.1] * 10)]
    assert min_max_ranges(work, [1.0] * 4) == ((0, 3), (3, 6), (6, 8), (8, 10))


def slowest(work, split, speeds) -> float:
    return max((work[b] - work[a]) / sp for (a, b), sp in zip(split, speeds))


def test_min_max_ranges_splits_many_stages_on_mixed_speeds():
    # The tuner's largest seeds: up to 128 stages over 130 layers. (Its speed is measured by
    # benchmarks/bench_tuner.py, not here.)
    layers = [40.0] + [10.0 + (i % 4) * 0.1 for i in range(128)] + [55.0]
    work = [0.0, *itertools.accumulate(layers)]
    for S in (16, 32, 64, 128):
        placement = [s % 32 for s in range(S)]
        speeds = [1.0 if d % 2 else 0.3 for d in placement]
        ranges = min_max_ranges(work, speeds, placement)
        assert [a for a, _ in ranges][1:] == [b for _, b in ranges][:-1]  # they tile
        assert ranges[0][0] == 0 and ranges[-1][1] == len(layers)
        assert all(b > a for a, b in ranges)
        even = [(len(layers) * s // S, len(layers) * (s + 1) // S) for s in range(S)]
        assert slowest(work, ranges, speeds) <= slowest(work, even, speeds)


def torchtitan_module_names(num_stages, num_blocks):
    """The module lists torchtitan's default split produces (input and output weight 1),
    restated stage by stage from its documented behaviour."""
    effective = num_blocks + 2
    per, extra = divmod(effective, num_stages)
    out, next_block = [], 0
    for s in range(num_stages):
        units = per + (1 if s < extra else 0)
        stage = ["tok_embeddings"] if s == 0 else []
        take = units - (s == 0) - (s == num_stages - 1)
        stage += [f"layers.{i}" for i in range(next_block, min(next_block + take, num_blocks))]
        next_block += take
        if s == num_stages - 1:
            stage += ["norm", "output"]
        out.append(stage)
    return out


@pytest.mark.parametrize("num_stages", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("num_blocks", [4, 7, 8, 16, 30, 32])
def test_titan_matches_torchtitan_module_lists(num_stages, num_blocks):
    if num_blocks + 2 < num_stages:  # torchtitan refuses: fewer effective blocks than stages
        return
    p = llm(num_blocks)
    expected = torchtitan_module_names(num_stages, num_blocks)
    assert names(p, partition(p, num_stages, "titan")) == expected
