"""The tuner: valid fitting plans, never behind a baseline, heterogeneity and memory honoured."""

from __future__ import annotations

import math

import pytest

from octopipe.baselines import all_baselines
from octopipe.plan import check_structure
from octopipe.profile import Device, LayerCost, Link, Profile
from octopipe.sim import Simulator
from octopipe.tuner import tune
from octopipe.tuner.balance import device_loads

GB = 10**9


def layer(name: str, f: float, act: int = GB, param: int = GB) -> LayerCost:
    return LayerCost(
        name=name,
        f=f,
        b=f,
        w=0.8 * f,
        act_bytes=act,
        wact_bytes=act // 2,
        param_bytes=param,
        out_bytes=10**6,
    )


def model(
    blocks: int = 10, head: float = 1.0, memory: float = float("inf"), speeds=(1.0, 1.0, 1.0, 1.0)
) -> Profile:
    layers = [layer("tok_embeddings", 0.05)]
    layers += [layer(f"layers.{i}", 1.0) for i in range(blocks)]
    layers += [layer("norm", 0.01), layer("output", head, param=3 * GB)]
    devices = tuple(Device(speed=s, memory_bytes=memory) for s in speeds)
    return Profile(
        name="toy", layers=tuple(layers), devices=devices, link=Link(bandwidth=100e9, latency=1e-4)
    )


CASES = {
    "uniform": model(),
    "big head": model(head=4.0),
    "mixed speeds": model(speeds=(1.0, 1.0, 0.5, 1.0)),
}


@pytest.mark.parametrize("name", CASES)
def test_tuned_plan_is_valid_fits_and_beats_or_equals_every_baseline(name):
    profile = CASES[name]
    baselines = all_baselines(profile, 4, 8)
    result = tune(profile, 8, 4, baselines=baselines, time_budget=math.inf)
    best = result.best
    check_structure(best.plan, "<tuned>", profile.num_layers)
    assert best.sim.fits
    resim = Simulator(profile).run(best.plan)
    assert best.plan.predicted["iteration_time"] == resim.iteration_time
    for base in result.baselines:
        if base.sim.fits:
            assert best.sim.iteration_time <= base.sim.iteration_time + 1e-12, base.label
    assert len(result.baselines) == len(baselines)


def test_slow_device_gets_less_work():
    profile = model(blocks=16, speeds=(1.0, 1.0, 0.5, 1.0))
    best = tune(profile, 16, 4, time_budget=math.inf).best
    ranges = tuple((s.start, s.end) for s in best.plan.stages)
    work_units = device_loads(
        Simulator(profile).costs.work, ranges, best.plan.placement, [1.0] * 4
    )  # layer work, not time
    assert work_units[2] < 0.75 * min(work_units[d] for d in (0, 1, 3))
    assert best.sim.efficiency > 0.85


def test_memory_limited_case_returns_a_fitting_plan():
    loose = tune(model(), 16, 4, time_budget=math.inf).best
    # Capacity below what the unconstrained plan uses, but enough for a leaner one.
    cap = 0.8 * max(loose.sim.peak_memory_bytes)
    tight = tune(model(memory=cap), 16, 4, time_budget=math.inf, baselines=[]).best
    assert not all(p <= cap for p in loose.sim.peak_memory_bytes)
    assert tight.sim.fits
    assert max(tight.sim.peak_memory_bytes) <= cap


def test_impossible_memory_reports_the_leanest_plan():
    result = tune(model(memory=2 * GB), 8, 4, time_budget=math.inf)
    sim = result.best.sim
    assert not sim.fits
    # Static memory alone (about 4-6 GB a device) exceeds 2 GB: the shortfall is positive.
    assert max(sim.memory_excess_bytes) > 0


def test_deterministic_for_a_seed():
    # No time budget: the search runs to its end, however loaded the machine is.
    profile = CASES["big head"]
    one = tune(profile, 8, 4, time_budget=math.inf, seed=3)
    two = tune(profile, 8, 4, time_budget=math.inf, seed=3)
    assert one.converged and two.converged
    assert one.best.plan == two.best.plan


def test_never_slower_than_the_best_baseline_even_without_search_time():
    profile = CASES["big head"]
    baselines = all_baselines(profile, 4, 8)
    result = tune(profile, 8, 4, baselines=baselines, time_budget=1e-9)
    fastest = min(b.sim.iteration_time for b in result.baselines if b.sim.fits)
    assert result.best.sim.iteration_time <= fastest


def test_local_reordering_moves_a_binding_action_ahead():
    from octopipe.plan import Action, make_plan
    from octopipe.tuner.reorder import reorder_critical

    unit = LayerCost(
        name="l", f=1.0, b=1.0, w=1.0, act_bytes=1, wact_bytes=0, param_bytes=0, out_bytes=0
    )
    profile = Profile(layers=(unit, unit), devices=(Device(), Device()))
    acts = {0: "0F0 0F1 0B0 0B1", 1: "1F0 1F1 1B1 1B0"}  # the last stage answers mb 1 first
    plan = make_plan(
        2,
        2,
        [(0, 1), (1, 2)],
        [0, 1],
        {d: [Action.parse(a) for a in text.split()] for d, text in acts.items()},
    )
    sim = Simulator(profile)
    before = sim.run(plan)
    polished, after = reorder_critical(sim, plan, before)
    assert after.iteration_time < before.iteration_time
    assert after.iteration_time == sim.run(polished).iteration_time
    check_structure(polished, "<polished>", 2)


def test_small_device_gets_less_static_memory():
    roomy = 40 * GB
    profile = model(blocks=16, memory=roomy)
    even = tune(profile, 8, 4, time_budget=math.inf).best.sim
    small = min(even.peak_memory_bytes) * 0.9  # below what every device used in the even plan
    devices = list(profile.devices)
    devices[1] = Device(memory_bytes=small)
    uneven = tune(profile.with_devices(devices), 8, 4, time_budget=math.inf).best.sim
    assert uneven.fits
    assert uneven.peak_memory_bytes[1] <= small
    others = [uneven.static_memory_bytes[d] for d in (0, 2, 3)]
    assert uneven.static_memory_bytes[1] < sum(others) / 3


@pytest.mark.parametrize(
    "layers, devices, microbatches, fault",
    [
        (2, 4, 4, "4 devices need at least as many layers"),
        (4, 2, 0, "microbatch count must be at least 1"),
    ],
)
def test_impossible_requests_are_input_errors(layers, devices, microbatches, fault):
    from octopipe.errors import InputError

    profile = Profile(
        layers=tuple(layer(f"layers.{i}", 1.0) for i in range(layers)),
        devices=(Device(),) * devices,
    )
    with pytest.raises(InputError, match=fault):
        tune(profile, microbatches, devices, time_budget=math.inf)


@pytest.mark.parametrize("layers, devices, microbatches", [(4, 1, 3), (4, 2, 1), (1, 1, 1)])
def test_degenerate_sizes_still_give_valid_plans(layers, devices, microbatches):
    profile = Profile(
        layers=tuple(layer(f"layers.{i}", 1.0) for i in range(layers)),
        devices=(Device(),) * devices,
    )
    best = tune(profile, microbatches, devices, time_budget=math.inf).best
    check_structure(best.plan, "<tuned>", layers)
    assert best.sim.iteration_time >= best.sim.lower_bound - 1e-9
    if devices == 1:  # one device never waits: the physical limit is reached exactly
        assert best.sim.iteration_time == pytest.approx(best.sim.lower_bound)


def test_action_overhead_steers_the_search_but_not_the_predicted_figures():
    # Tiny layers, each a candidate stage: with a large fixed cost per action, fewer stages win.
    layers = [layer(f"layers.{i}", 0.01) for i in range(12)]
    profile = Profile(name="small", layers=tuple(layers), devices=(Device(), Device()))
    free = tune(profile, 8, time_budget=math.inf)
    costly = tune(profile, 8, time_budget=math.inf, action_overhead=0.05)
    assert costly.best.plan.num_stages <= free.best.plan.num_stages
    assert costly.best.plan.num_stages == 2
    # The exported prediction is the default semantics' figure for that plan.
    default = Simulator(profile).run(costly.best.plan, detail=False)
    assert costly.best.plan.predicted["iteration_time"] == pytest.approx(default.iteration_time)
