"""Baseline plans and the `octopipe baseline` command (run in-process)."""

from __future__ import annotations

import json

import pytest
from sim_helpers import uniform_profile

from octopipe.baselines import all_baselines, make_baseline
from octopipe.cli import main
from octopipe.errors import InputError
from octopipe.partition import METHODS
from octopipe.plan import check_structure, load_plan
from octopipe.profile import Device, save_profile
from octopipe.schedules import SCHEDULES
from octopipe.sim import Simulator


@pytest.fixture
def profile():
    return uniform_profile(16, devices=4)


def test_make_baseline_fills_predicted_from_the_simulator(profile):
    plan = make_baseline(profile, "i1f1b", "uniform", 4, 8)
    check_structure(plan, num_layers=16)
    assert plan.num_stages == 8
    assert plan.placement == (0, 1, 2, 3, 0, 1, 2, 3)
    expected = Simulator(profile).run(plan).predicted()
    assert plan.predicted == expected


def test_balanced_partition_sees_the_placement():
    profile = uniform_profile(12, devices=2).with_devices([Device(speed=1.0), Device(speed=2.0)])
    plan = make_baseline(profile, "1f1b", "balanced", 2, 4)
    assert [(s.start, s.end) for s in plan.stages] == [(0, 4), (4, 12)]
    uniform = make_baseline(profile, "1f1b", "uniform", 2, 4)
    assert plan.predicted["iteration_time"] < uniform.predicted["iteration_time"]


def test_all_baselines_cover_every_supported_combination(profile):
    labels = [label for label, _ in all_baselines(profile, 4, 8)]
    assert labels == [f"{s}/{m}" for s in SCHEDULES for m in METHODS]
    # DualPipeV needs 2P microbatches: skipped, not an error.
    labels = [label for label, _ in all_baselines(profile, 4, 6)]
    assert not any(label.startswith("dualpipev/") for label in labels)
    assert "zbv/balanced" in labels


def test_all_baselines_rejects_a_device_count_the_profile_does_not_have(profile):
    with pytest.raises(InputError, match="asked for 2 devices"):
        all_baselines(profile, 2, 8)


# --- the command ---------------------------------------------------------------------------


@pytest.fixture
def profile_file(tmp_path, profile):
    path = tmp_path / "profile.json"
    save_profile(profile, path)
    return path


def run_cli(*argv):
    return main(["baseline", *map(str, argv)])


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("method", METHODS)
def test_cli_writes_a_predicted_plan(tmp_path, profile_file, schedule, method, capsys):
    out = tmp_path / "plan.json"
    rc = run_cli(
        "--profile",
        profile_file,
        "--schedule",
        schedule,
        "--partition",
        method,
        "--microbatches",
        8,
        "-o",
        out,
    )
    assert rc == 0
    plan = load_plan(out, num_layers=16)
    assert plan.num_devices == 4  # the profile's device list
    assert set(plan.predicted) >= {"iteration_time", "peak_memory_bytes", "bubble_ratio"}
    assert json.loads(out.read_text())["format"] == "octopipe.plan/1"
    assert f"{schedule}/{method}" in capsys.readouterr().out


def test_cli_devices_and_chunks(tmp_path, capsys):
    path = tmp_path / "p.json"
    save_profile(uniform_profile(12), path)  # no device list: --devices decides
    out = tmp_path / "plan.json"
    assert (
        run_cli(
            "--profile",
            path,
            "--schedule",
            "i1f1b",
            "--partition",
            "titan",
            "--devices",
            2,
            "--microbatches",
            4,
            "--chunks",
            3,
            "-o",
            out,
        )
        == 0
    )
    plan = load_plan(out)
    assert (plan.num_devices, plan.num_stages) == (2, 6)


@pytest.mark.parametrize(
    "argv,fault",
    [
        (
            ["--schedule", "dualpipev", "--partition", "uniform", "--microbatches", 4],
            "dualpipev: needs at least 2 x devices = 8 microbatches, got 4",
        ),
        (
            ["--schedule", "1f1b", "--partition", "uniform", "--microbatches", 4, "--devices", 3],
            "asked for 3 devices but the profile lists 4",
        ),
        (
            ["--schedule", "1f1b", "--partition", "uniform", "--microbatches", 4, "--chunks", 2],
            "1f1b: runs one stage per device",
        ),
        (
            ["--schedule", "i1f1b", "--partition", "uniform", "--microbatches", 4, "--chunks", 5],
            "16 layers cannot fill 20 stages",
        ),
        (
            ["--schedule", "gpipe", "--partition", "uniform", "--microbatches", 0],
            "argument --microbatches: expected an integer from 1 to 262,144, got 0",
        ),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, profile_file, capsys, argv, fault):
    rc = run_cli("--profile", profile_file, *argv, "-o", tmp_path / "plan.json")
    err = capsys.readouterr().err
    assert rc == 2
    assert fault in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "plan.json").exists()


def test_cli_missing_profile_and_unwritable_output(tmp_path, profile_file, capsys):
    assert (
        run_cli(
            "--profile",
            tmp_path / "nope.json",
            "--schedule",
            "1f1b",
            "--partition",
            "uniform",
            "--microbatches",
            4,
            "-o",
            tmp_path / "plan.json",
        )
        == 2
    )
    assert "cannot read" in capsys.readouterr().err
    assert (
        run_cli(
            "--profile",
            profile_file,
            "--schedule",
            "1f1b",
            "--partition",
            "uniform",
            "--microbatches",
            4,
            "-o",
            tmp_path / "no" / "dir" / "plan.json",
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert err.endswith("--output: folder " + str(tmp_path / "no" / "dir") + " does not exist")
    assert "\n" not in err


def test_cli_profile_without_devices_needs_a_count(tmp_path, capsys):
    path = tmp_path / "p.json"
    save_profile(uniform_profile(8), path)
    assert (
        run_cli(
            "--profile",
            path,
            "--schedule",
            "1f1b",
            "--partition",
            "uniform",
            "--microbatches",
            4,
            "-o",
            tmp_path / "plan.json",
        )
        == 2
    )
    assert "lists no devices" in capsys.readouterr().err
