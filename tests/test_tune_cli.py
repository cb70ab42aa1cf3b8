"""`octopipe plan`: files written, table printed, bad inputs as one line with exit code 2."""

from __future__ import annotations

import json

import pytest

from octopipe.cli import main
from octopipe.plan import load_plan, load_schedule_csv
from octopipe.profile import Device, LayerCost, Profile, save_profile
from octopipe.sim import simulate


@pytest.fixture()
def profile_path(tmp_path):
    names = ["tok_embeddings", *(f"layers.{i}" for i in range(8)), "norm", "output"]
    layers = tuple(
        LayerCost(
            name=n,
            f=1.0,
            b=1.0,
            w=0.6,
            act_bytes=2**20,
            wact_bytes=2**19,
            param_bytes=2**30,
            out_bytes=1024,
        )
        for n in names
    )
    path = tmp_path / "profile.json"
    save_profile(Profile(name="toy", layers=layers, devices=(Device(),) * 4), path)
    return path


def run(argv, capsys):
    code = main(["plan", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_writes_outputs_and_compares_with_baselines(profile_path, tmp_path, capsys):
    out_dir = tmp_path / "out"
    code, out, err = run(
        [
            "--profile",
            profile_path,
            "--microbatches",
            8,
            "--quiet",
            "--time-budget",
            20,
            "-o",
            out_dir,
        ],
        capsys,
    )
    assert code == 0, err
    plan = load_plan(out_dir / "plan.json", num_layers=11)
    assert plan.predicted is not None
    assert plan.predicted["iteration_time"] == pytest.approx(
        simulate(_profile(profile_path), plan).iteration_time
    )
    assert load_schedule_csv(out_dir / "schedule.csv") == dict(plan.schedule)
    assert (out_dir / "torchtitan.toml").is_file()
    assert (out_dir / "timeline.png").stat().st_size > 0
    assert (out_dir / "timeline.html").stat().st_size > 0
    assert "tuned" in out and "i1f1b/uniform" in out and "1f1b/uniform" in out


def _profile(path):
    from octopipe.profile import load_profile

    return load_profile(path)


@pytest.mark.parametrize(
    "args, fault",
    [
        (["--microbatches", 0], "--microbatches"),
        (["--microbatches", 8, "--devices", 3], "asked for 3 devices"),
        (["--microbatches", 8, "--memory-limit", "lots"], "--memory-limit"),
        (["--microbatches", 8, "--memory-limit", "1GiB"], "needs"),
        (["--microbatches", 8, "--action-overhead", -1], "--action-overhead"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(profile_path, tmp_path, capsys, args, fault):
    code, _out, err = run(
        ["--profile", profile_path, "--quiet", "--time-budget", 5, "-o", tmp_path / "o", *args],
        capsys,
    )
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and fault in lines[0], err
    assert "Traceback" not in err


def test_impossible_memory_names_the_device_and_shortfall(profile_path, tmp_path, capsys):
    code, _, err = run(
        [
            "--profile",
            profile_path,
            "--quiet",
            "--microbatches",
            4,
            "--memory-limit",
            "2GiB",
            "--time-budget",
            5,
            "-o",
            tmp_path / "o",
        ],
        capsys,
    )
    assert code == 2
    assert "device" in err and "GiB more" in err
    assert not (tmp_path / "o" / "plan.json").exists()


def test_profile_without_devices_needs_a_device_count(tmp_path, capsys):
    layers = tuple(
        LayerCost(
            name=f"layers.{i}", f=1, b=1, w=1, act_bytes=0, wact_bytes=0, param_bytes=0, out_bytes=0
        )
        for i in range(4)
    )
    path = tmp_path / "p.json"
    path.write_text(json.dumps(Profile(layers=layers).to_dict()))
    code, _, err = run(
        ["--profile", path, "--microbatches", 4, "--quiet", "-o", tmp_path / "o"], capsys
    )
    assert code == 2 and "lists no devices: give a device count" in err
    code, _, err = run(
        ["--profile", path, "--microbatches", 4, "--devices", 0, "--quiet", "-o", tmp_path / "o"],
        capsys,
    )
    assert code == 2 and "argument --devices: expected an integer from 1 to 4,096, got 0" in err
    code, _, err = run(
        ["--profile", path, "--microbatches", 4, "--devices", 2, "--quiet", "-o", tmp_path / "o"],
        capsys,
    )
    assert code == 0, err


def test_no_png_writes_no_picture(profile_path, tmp_path, capsys):
    out_dir = tmp_path / "out"
    argv = ["--profile", profile_path, "--microbatches", 8, "--quiet", "--time-budget", 2]
    code, out, err = run([*argv, "--no-png", "-o", out_dir], capsys)
    assert code == 0, err
    assert sorted(p.name for p in out_dir.iterdir()) == [
        "plan.json",
        "schedule.csv",
        "torchtitan.toml",
    ]
    assert "timeline" not in out
