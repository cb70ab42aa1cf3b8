"""The bounds of `sim/bounds.py` are never beaten: on generated heterogeneous profiles (layers of
any cost, devices of any speed, slow links), every plan, random or generated, simulates at or
above its partition's bound, which is at or above the joint bound; and they are tight where the
answer is known."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sim_helpers import random_profile

import octopipe as op
from octopipe.profile import Device, LayerCost, Profile
from octopipe.random_plans import random_plan
from octopipe.sim import Simulator
from octopipe.sim.bounds import _one_machine, joint_bound

EPS = 1e-9


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    layers=st.integers(1, 9),
    devices=st.integers(1, 4),
    microbatches=st.integers(1, 6),
)
def test_no_random_plan_beats_its_bounds(seed, layers, devices, microbatches):
    rng = random.Random(seed)
    profile = random_profile(rng, layers, devices)
    sim = Simulator(profile)
    for _ in range(5):
        plan = random_plan(rng, layers, devices, microbatches)
        bounds = sim.bounds(plan)
        time = sim.run(plan, detail=False).iteration_time
        assert bounds.joint <= bounds.plan + EPS
        assert bounds.plan <= time + EPS, (bounds, time)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "i1f1b", "zbh1", "zbv", "dualpipev"])
def test_no_generated_schedule_beats_its_bounds(schedule):
    rng = random.Random(7)
    for _ in range(5):
        profile = random_profile(rng, 16, 4)
        sim = Simulator(profile)
        for partition in ("uniform", "balanced"):
            plan = op.baseline(profile, schedule, partition, 8)
            bounds = sim.bounds(plan)
            assert bounds.joint <= bounds.plan <= sim.run(plan).iteration_time + EPS


def test_the_tuned_plan_never_beats_the_joint_bound():
    profile = op.profile_from_config("gemma2-9b", devices=4)
    tuned = op.tune(profile, num_microbatches=16)
    sim = Simulator(profile)
    bounds = sim.bounds(tuned.best.plan)
    time = sim.run(tuned.best.plan).iteration_time
    assert bounds.joint <= bounds.plan <= time + EPS
    assert bounds.gap(time) < 0.05  # the tuner reaches near the bound on its default case


def _layer(name: str, f: float, b: float, w: float) -> LayerCost:
    # Nothing sent between stages: the chain is compute alone.
    return LayerCost(
        name=name, f=f, b=b, w=w, act_bytes=1, wact_bytes=1, param_bytes=1, out_bytes=0
    )


def test_the_bounds_are_tight_where_the_optimum_is_known():
    # One device: every order runs the work back to back.
    layers = tuple(_layer(f"l{i}", 1.0, 2.0, 0.5) for i in range(3))
    one = Profile(name="one", layers=layers, devices=(Device(),))
    sim = Simulator(one)
    plan = op.baseline(one, "1f1b", "uniform", 4)
    assert sim.bounds(plan).joint == pytest.approx(4 * 3 * 3.5)
    assert sim.bounds(plan).plan == pytest.approx(sim.run(plan).iteration_time)
    # GPipe of one microbatch over a chain: the chain is the step.
    chain = Profile(name="chain", layers=layers, devices=(Device(),) * 3)
    plan = op.baseline(chain, "gpipe", "uniform", 1)
    assert Simulator(chain).bounds(plan).plan == pytest.approx(
        Simulator(chain).run(plan).iteration_time
    )


def test_one_machine_relaxation_is_jacksons_preemptive_schedule():
    # A job released late with a long tail preempts a job with a short one.
    jobs = [(0.0, 10.0, 0.0), (2.0, 1.0, 20.0)]
    assert _one_machine(jobs) == pytest.approx(23.0)  # 2 + 1 + 20
    assert _one_machine([(0.0, 3.0, 1.0), (0.0, 2.0, 5.0)]) == pytest.approx(7.0)
    assert _one_machine([]) == 0.0


def test_the_joint_bound_counts_the_fill_of_a_pipeline():
    # Eight equal layers on eight devices, one microbatch each way: no plan hides the chain.
    layers = tuple(_layer(f"l{i}", 1.0, 1.0, 0.0) for i in range(8))
    profile = Profile(name="even", layers=layers, devices=(Device(),) * 8)
    assert joint_bound(profile, profile.devices, 1) == pytest.approx(16.0)
    # Against the work alone (16 of 8 devices' capacity: 2 s) the fill is 8x.
    assert joint_bound(profile, profile.devices, 1) > 8 * 16 / 8 - EPS


def test_simulate_and_plan_print_both_bounds(tmp_path, capsys):
    import json

    from octopipe.cli import main

    profile = tmp_path / "p.json"
    assert main(["profile-arch", "tiny-llama", "-o", str(profile)]) == 0
    out = tmp_path / "out"
    argv = ["plan", "--profile", str(profile), "--devices", "2", "--no-png", "-o", str(out)]
    assert main([*argv, "--time-budget", "20"]) == 0
    assert "the tuned plan: within " in capsys.readouterr().out
    plan = str(out / "plan.json")
    assert main(["simulate", "--profile", str(profile), "--plan", plan, "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    bounds = found["bounds"]
    assert 0 < bounds["joint"] <= bounds["plan"] <= found["iteration_time"] * (1 + EPS)
    assert main(["simulate", "--profile", str(profile), "--plan", plan, "--overlap-steps"]) == 0
    assert "best any plan can do" not in capsys.readouterr().out  # no bound of a steady step


def test_the_search_gives_a_heavy_head_a_device_of_its_own_by_itself():
    # gemma2-9b's vocabulary head is about a device's share of the work at PP 8: the tuner's
    # seeds deal the blocks over seven devices and the head to the eighth alone.
    profile = op.profile_from_config("gemma2-9b", devices=8)
    plan = op.tune(profile, num_microbatches=32).best.plan
    last = plan.stages[-1]
    alone = [i for i, st in enumerate(plan.stages) if st.device == last.device]
    assert alone == [len(plan.stages) - 1] and last.end == profile.num_layers
    others = {st.device for st in plan.stages[:-1]}
    assert len(others) == 7 and len(plan.stages) - 1 > 7  # dealt: several stages a device


def test_the_joint_bound_knows_layers_are_indivisible():
    # Nine equal layers on four devices: some device holds three of them each microbatch.
    layers = tuple(_layer(f"l{i}", 1.0, 1.0, 1.0) for i in range(9))
    profile = Profile(name="nine", layers=layers, devices=(Device(),) * 4)
    assert joint_bound(profile, profile.devices, 10) == pytest.approx(10 * 3 * 3.0)


def test_the_joint_bound_sends_layers_to_the_faster_devices_first():
    # Four equal layers, one device twice as fast: it takes three, the slow one one; no
    # better split exists (the fast one alone: 4 / 2 = 2; three and one: max(1.5, 1) = 1.5).
    layers = tuple(_layer(f"l{i}", 0.5, 0.5, 0.0) for i in range(4))
    devices = (Device(speed=2.0), Device(speed=1.0))
    profile = Profile(name="mixed", layers=layers, devices=devices)
    assert joint_bound(profile, devices, 1) >= 1.5 * (1 - 1e-8)
