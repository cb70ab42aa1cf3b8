"""Recomputation per stage: the cost model's per-layer costs, the profile and plan keys, the
simulator's time and memory, the list scheduler's room for W's inputs, and the tuner's choice
where memory binds (and only there)."""

from __future__ import annotations

import json
import math

import pytest

import octopipe as op
from octopipe.actions import Action
from octopipe.errors import InputError
from octopipe.plan import load_plan, make_plan, save_plan
from octopipe.profile import (
    Device,
    LayerCost,
    Profile,
    Recomputation,
    Recomputed,
    load_profile,
    save_profile,
)
from octopipe.sim import Simulator
from octopipe.tuner import tune

GB = 10**9


def layer(name, act=4 * GB, wact=2 * GB, recompute=True) -> LayerCost:
    """F 1 s, I 1 s, W 1 s; full recomputation: I redoes F (2 s), holds 0.5 GB from F and
    W's 2 GB from I to W."""
    alternatives = Recomputation(full=Recomputed(b=2.0, act_bytes=GB // 2, wact_bytes=wact))
    return LayerCost(
        name=name,
        f=1.0,
        b=1.0,
        w=1.0,
        act_bytes=act,
        wact_bytes=wact,
        param_bytes=GB,
        out_bytes=1,
        recompute=alternatives if recompute else None,
    )


def stack(n=4, memory=math.inf, recompute=True, devices=2) -> Profile:
    layers = tuple(layer(f"layers.{i}", recompute=recompute) for i in range(n))
    return Profile(
        name="stack",
        layers=layers,
        devices=tuple(Device(memory_bytes=memory) for _ in range(devices)),
    )


def split_plan(recompute=("full", "none")):
    """Two stages of two layers each, F I W per microbatch, two microbatches."""
    orders = {
        0: [Action.parse(a) for a in "0F0 0F1 0I0 0I1 0W0 0W1".split()],
        1: [Action.parse(a) for a in "1F0 1I0 1W0 1F1 1I1 1W1".split()],
    }
    return make_plan(2, 2, [(0, 2), (2, 4)], [0, 1], orders, recompute)


# --- the cost model -------------------------------------------------------------------------------


def test_the_cost_model_prices_both_kinds_for_every_block_and_none_for_the_rest():
    profile = op.profile_from_config("tiny-llama", devices=2)
    for layer_cost in profile.layers:
        alternatives = layer_cost.recompute
        if layer_cost.kind != "decoder":
            assert alternatives is None, layer_cost.name
            continue
        full, selective = alternatives.full, alternatives.selective
        assert full.b == pytest.approx(layer_cost.b + layer_cost.f)  # the forward, redone in I
        assert full.act_bytes < selective.act_bytes < layer_cost.act_bytes
        assert full.wact_bytes == layer_cost.wact_bytes  # I recomputes W's inputs
        assert layer_cost.b < selective.b < full.b  # the attention core alone is redone


@pytest.mark.parametrize("kind", ["full", "selective"])
def test_each_alternative_is_what_the_global_setting_estimates(kind):
    from octopipe.costmodel import load_architecture
    from octopipe.costmodel.build import build_profile
    from octopipe.costmodel.hardware import hardware_preset
    from octopipe.costmodel.settings import Settings

    plain = op.profile_from_config("tiny-llama", devices=2)
    arch, h100 = load_architecture("tiny-llama"), hardware_preset("h100")
    globally = build_profile(arch, h100, Settings(recompute=kind), 2)
    for mine, theirs in zip(plain.layers, globally.layers, strict=True):
        assert theirs.recompute is None  # recomputed already: no alternative offered
        if mine.recompute is not None:
            alt = mine.recompute.of(kind)
            assert alt.b == pytest.approx(theirs.b)
            assert alt.act_bytes == theirs.act_bytes


# --- the files --------------------------------------------------------------------------------


def test_profile_keys_round_trip_and_are_written_only_where_given(tmp_path):
    profile = stack()
    save_profile(profile, tmp_path / "p.json")
    assert load_profile(tmp_path / "p.json") == profile
    written = json.loads((tmp_path / "p.json").read_text())["layers"][0]["recompute"]
    assert written == {"full": {"b": 2.0, "act_bytes": GB // 2, "wact_bytes": 2 * GB}}
    save_profile(stack(recompute=False), tmp_path / "q.json")
    assert "recompute" not in json.loads((tmp_path / "q.json").read_text())["layers"][0]


def test_plan_key_round_trips_and_absent_means_none(tmp_path):
    plan = split_plan()
    save_plan(plan, tmp_path / "plan.json")
    data = json.loads((tmp_path / "plan.json").read_text())
    assert data["stages"][0]["recompute"] == "full"
    assert "recompute" not in data["stages"][1]
    assert load_plan(tmp_path / "plan.json") == plan
    none = split_plan(("none", "none"))
    assert none.recompute == () and none == split_plan(())
    save_plan(none, tmp_path / "none.json")
    assert "recompute" not in json.loads((tmp_path / "none.json").read_text())["stages"][0]


@pytest.mark.parametrize("value", ["half", True, 1, None])
def test_a_bad_plan_recompute_value_names_its_stage(tmp_path, value):
    save_plan(split_plan(), tmp_path / "plan.json")
    data = json.loads((tmp_path / "plan.json").read_text())
    data["stages"][1]["recompute"] = value
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(InputError, match=r"stages\[1\]\.recompute: expected one of none"):
        load_plan(tmp_path / "bad.json")


# --- the simulator --------------------------------------------------------------------------------


def test_a_recomputing_stage_takes_longer_in_i_and_holds_less_until_it():
    sim = Simulator(stack())
    plain = sim.run(split_plan(("none", "none")))
    recomputed = sim.run(split_plan(("full", "none")))
    durations = {(e.action.stage, e.action.kind.name): e.end - e.start for e in recomputed.events}
    assert durations[(0, "I")] == pytest.approx(4.0)  # two layers of b 2.0
    assert durations[(1, "I")] == pytest.approx(2.0)
    # Device 0 runs F F I I W W. Without recomputation: two microbatches' 8 GB each.
    assert plain.peak_memory_bytes[0] == 2 * GB + 2 * 8 * GB
    # Recomputing: 1 GB each from F; each I then holds W's 4 GB: 1 + 1 -> 4 + 1 -> 4 + 4.
    assert recomputed.peak_memory_bytes[0] == 2 * GB + 2 * 4 * GB
    assert recomputed.end_memory_bytes[0] == 2 * GB
    assert recomputed.iteration_time > plain.iteration_time


def test_recomputation_the_profile_does_not_price_is_an_input_error():
    sim = Simulator(stack(recompute=False))
    with pytest.raises(InputError, match=r"stages\[0\]\.recompute: no layer of \[0, 2\) has full"):
        sim.run(split_plan(), where="plan.json")


# --- the list scheduler and the tuner --------------------------------------------------------


def test_the_scheduler_runs_a_w_before_an_i_that_would_overfill_memory():
    from octopipe.costs import CostTable, stage_costs
    from octopipe.schedules.list_scheduler import Rules, list_schedule

    costs = CostTable(stack(n=2, devices=1))
    stages = stage_costs(costs, [(0, 2)], [0], [Device()], ["full"])
    # Both forwards first, at 1 GB each; an I raises its microbatch to 4 GB.
    budget = 5 * GB  # room for one microbatch past its I and one in flight, not for two past I
    rules = Rules(inflight=(2,), backward_first=False, memory_budget=(budget,))
    sched = list_schedule(stages, 1, 2, rules)
    assert max(sched.peak_activation_bytes) <= budget
    order = [f"{s}{'FIWB'[k]}{m}" for s, k, m in sched.codes[0]]
    assert order == ["0F0", "0F1", "0I0", "0W0", "0I1", "0W1"]


def test_where_memory_binds_the_tuner_recomputes_some_stages_and_fits():
    # Static 4 GB a device; without recomputation one microbatch in flight holds 16 GB.
    profile = stack(n=8, memory=14 * GB)
    plain = tune(stack(n=8, memory=14 * GB, recompute=False), 4, 2, time_budget=math.inf)
    assert not plain.best.sim.fits
    result = tune(profile, 4, 2, time_budget=math.inf)
    best = result.best
    assert best.sim.fits and "full" in best.plan.recompute
    assert Simulator(profile).run(best.plan).iteration_time == best.sim.iteration_time


def test_a_stage_left_with_no_layer_offering_its_kind_recomputes_nothing_in_the_plan():
    """A move can shift a recomputing stage's boundaries onto layers that offer nothing; the
    plan then says none there (priced alike), so the simulator's strict check passes."""
    from octopipe.tuner.candidate import Candidate, Evaluator

    layers = (*stack(n=2).layers, *stack(n=2, recompute=False).layers[:2])
    layers = tuple(lay.model_copy(update={"name": f"layers.{i}"}) for i, lay in enumerate(layers))
    profile = Profile(name="half", layers=layers, devices=(Device(), Device()))
    evaluator = Evaluator(profile, profile.device_list(2), 2)
    cand = Candidate(((0, 2), (2, 4)), (0, 1), recompute=("full", "full"))
    outcome = evaluator.evaluate(cand)
    plan = evaluator.to_plan(outcome)
    assert plan.recompute == ("full", "none")
    assert Simulator(profile).run(plan, check=True).iteration_time == pytest.approx(
        outcome.makespan
    )


def test_where_memory_does_not_bind_nothing_is_recomputed_and_nothing_changes():
    roomy, bare = stack(n=8), stack(n=8, recompute=False)
    with_keys = tune(roomy, 4, 2, time_budget=math.inf).best
    without = tune(bare, 4, 2, time_budget=math.inf).best
    assert with_keys.plan.recompute == ()
    assert with_keys.plan == without.plan


def test_plan_writes_and_reports_the_stages_it_recomputes(tmp_path, capsys):
    from octopipe.cli import main

    save_profile(stack(n=8, memory=14 * GB), tmp_path / "tight.json")
    argv = ["plan", "--profile", str(tmp_path / "tight.json"), "--microbatches", "4"]
    code = main([*argv, "--no-png", "--quiet", "-o", str(tmp_path / "out")])
    assert code == 0
    written = json.loads((tmp_path / "out" / "plan.json").read_text())
    kinds = [st.get("recompute", "none") for st in written["stages"]]
    assert "full" in kinds
    recomputing = sum(k != "none" for k in kinds)
    assert f"{recomputing} of {len(kinds)} stages recompute" in capsys.readouterr().out
    simulated = Simulator(stack(n=8, memory=14 * GB)).run(load_plan(tmp_path / "out/plan.json"))
    assert simulated.fits
