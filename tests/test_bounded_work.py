"""The work a command does is bounded: the min-max partitioner stops at its deadline, and a
tuning run out of time still returns a valid plan (timings themselves: benchmarks/bench_budget.py).
"""

import math
import time

import pytest

from octopipe.api import tune
from octopipe.baselines import all_baselines
from octopipe.partition import OutOfTime, min_max_ranges, work_prefix
from octopipe.plan import check_structure
from tests.sim_helpers import uniform_profile


def test_the_partitioner_stops_at_its_deadline_and_is_unchanged_without_one():
    profile = uniform_profile(20_000, devices=4)
    work = work_prefix(profile)
    with pytest.raises(OutOfTime):
        min_max_ranges(work, [1.0] * 8, deadline=time.perf_counter() - 1)
    assert min_max_ranges(work, [1.0] * 8) == min_max_ranges(work, [1.0] * 8, deadline=math.inf)
    assert min_max_ranges(work, [1.0] * 4) == (
        (0, 5000),
        (5000, 10000),
        (10000, 15000),
        (15000, 20000),
    )


def test_baselines_out_of_time_keep_the_first_and_stop():
    profile = uniform_profile(2_000, devices=4)
    labels = [label for label, _ in all_baselines(profile, 4, 8, time_limit=0.0)]
    assert labels == ["gpipe/uniform"]


def test_a_tuning_run_with_no_time_left_returns_a_valid_plan():
    profile = uniform_profile(50_000, devices=4)
    result = tune(profile, 8, time_budget=1e-9)
    check_structure(result.best.plan, num_layers=profile.num_layers)
    assert not result.converged


def test_the_activation_floor_of_a_measured_layer_is_its_widths_and_masks_four_times_over():
    from octopipe.runtime.measure.memory_floor import MASK_BYTES_PER_PAIR, activation_floor
    from octopipe.runtime.model.load import load_recipe

    # tiny-llama's decoder (hidden 64, 4 heads of 16, 2 KV heads, FFN 176), fp32: the inputs
    # and outputs of wq, wk, wv, wo, gate, up and down per token, and one causal mask.
    width = (64 + 64) + 2 * (64 + 32) + (64 + 64) + 3 * (64 + 176)
    need, layer = activation_floor(load_recipe("tiny-llama"), 256, 2)
    assert layer == "layers.3"  # the decoders tie; the last of them is named
    assert need == 4 * (512 * width * 4 + MASK_BYTES_PER_PAIR * 256 * 256)


def test_experts_count_once_in_the_activation_floor():
    from torch import nn

    from octopipe.runtime.measure.memory_floor import _width_bytes

    experts = nn.Module()
    experts.router = nn.Linear(8, 4)
    experts.experts = nn.ModuleList(nn.Linear(8, 32) for _ in range(4))
    assert _width_bytes(experts) == ((8 + 4) + (8 + 32)) * 4
