"""Plans keep what they were made for: the profile's name, microbatch size, sequence length and
device count go into the plan (`profile` key), `run` takes its defaults from them and says when
a run departs from them, `simulate` warns when a profile of another size prices the plan, and a
measured profile lists the devices it was measured on."""

from __future__ import annotations

import json

import pytest

import octopipe as op
from octopipe.api import run_shape
from octopipe.cli import main
from octopipe.errors import InputError
from octopipe.plan import plan_from_dict

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


@pytest.fixture()
def made(tmp_path):
    profile, plan = tmp_path / "p.json", tmp_path / "plan.json"
    argv = ["profile-arch", "tiny-llama", "--devices", "2", "--seq-len", "16"]
    assert main([*argv, "--micro-batch-size", "4", "-o", str(profile)]) == 0
    argv = ["baseline", "--profile", str(profile), "--schedule", "1f1b", "--partition", "uniform"]
    assert main([*argv, "--microbatches", "2", "-o", str(plan)]) == 0
    return profile, plan


def test_baseline_and_plan_record_the_profile_they_were_made_for(made, tmp_path):
    profile, plan = made
    recorded = json.loads(plan.read_text())["profile"]
    name = json.loads(profile.read_text())["name"]
    want = {"name": name, "microbatch_size": 4, "seq_len": 16, "devices": 2, "device": "h100"}
    assert recorded == want
    argv = ["plan", "--profile", str(profile), "--microbatches", "2", "--time-budget", "1"]
    assert main([*argv, "--no-png", "--quiet", "-o", str(tmp_path / "tuned")]) == 0
    tuned = json.loads((tmp_path / "tuned" / "plan.json").read_text())
    assert tuned["profile"] == recorded
    loaded = op.load_plan(plan)
    assert loaded.profile == recorded and loaded.to_dict()["profile"] == recorded


def test_a_plan_without_the_key_means_what_it_meant(made):
    data = json.loads(made[1].read_text())
    del data["profile"]
    plan = plan_from_dict(data)
    assert plan.profile is None and "profile" not in plan.to_dict()
    assert run_shape(plan, None, None) == (32, 2)  # the old defaults


def test_a_run_takes_its_sizes_from_the_plan_unless_given(made):
    plan = op.load_plan(made[1])
    assert run_shape(plan, None, None) == (16, 4)
    assert run_shape(plan, 8, None) == (8, 4)
    assert run_shape(plan, None, 1) == (16, 1)
    cluster = plan.with_shape(
        tp=1, dp=1, microbatch_size=3
    )  # a cluster plan's own microbatch size first
    assert run_shape(cluster, None, None) == (16, 3)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"devices": 3}, "profile.devices: the plan's profile lists 3 devices but the plan has 2"),
        ({"microbatch_size": 0}, "profile.microbatch_size: expected a positive integer"),
        ({"seq_len": "16"}, "profile.seq_len: expected a positive integer, got '16'"),
        ({"name": 7}, "profile.name: expected a string"),
    ],
)
def test_a_faulty_profile_key_is_one_line(made, change, says):
    data = json.loads(made[1].read_text())
    data["profile"].update(change)
    with pytest.raises(InputError) as refused:
        plan_from_dict(data, "plan.json")
    assert says in str(refused.value)


def test_simulate_warns_when_another_size_prices_the_plan(made, tmp_path, capsys):
    other = tmp_path / "other.json"
    argv = ["profile-arch", "tiny-llama", "--devices", "2", "--seq-len", "16"]
    assert main([*argv, "--micro-batch-size", "2", "-o", str(other)]) == 0
    capsys.readouterr()
    assert main(["simulate", "--profile", str(other), "--plan", str(made[1]), "--json"]) == 0
    (warning,) = capsys.readouterr().err.splitlines()
    assert warning == (
        f"octopipe simulate: warning: {made[1]} was made for a microbatch size of 4; "
        f"{other} costs 2"
    )


@pytest.mark.slow
def test_a_run_uses_the_planned_sizes_and_says_when_it_does_not(made, capsys):
    argv = ["run", "--plan", str(made[1]), "--model", "tiny-llama", "--steps", "2", "--json"]
    assert main(argv) == 0
    out = capsys.readouterr()
    summary = json.loads(out.out.splitlines()[-1])
    assert (summary["seq_len"], summary["micro_batch_size"]) == (16, 4)
    step = json.loads(out.out.splitlines()[0])
    assert step["tokens_per_second"] * step["step_time"] == pytest.approx(2 * 4 * 16)
    assert "was made for" not in out.err  # the sizes it was made for: no note of another size
    assert main([*argv, "--micro-batch-size", "2"]) == 0
    out = capsys.readouterr()
    summary = json.loads(out.out.splitlines()[-1])
    assert summary["micro_batch_size"] == 2 and summary["predicted_for"]["microbatch_size"] == 4
    assert (
        f"note: {made[1]} was made for --micro-batch-size 4 (its profile's); this ran 2" in out.err
    )


@pytest.mark.slow
def test_a_profile_measured_in_two_processes_lists_two_devices(tmp_path):
    profile = op.measure_profile(
        "tiny-llama", nproc=2, seq_len=8, repeats=1, warmup=0, progress=False
    )
    assert len(profile.devices) == 2 and profile.devices[0].speed == 1.0
    assert 0 < profile.devices[0].memory_bytes < float("inf")
    plan = op.tune(profile, 4, time_budget=1).best.plan  # no device count needed
    assert plan.num_devices == 2 and plan.profile["devices"] == 2
    assert plan.profile["seq_len"] == 8
