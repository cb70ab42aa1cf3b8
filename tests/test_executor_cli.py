"""`octopipe run`: JSON report, Perfetto trace, and one-line refusals of plans it cannot run."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from executor_helpers import TOY, greedy, layer_count, one_f_one_b

from octopipe.cli import main
from octopipe.plan import JobShape, save_plan

pytestmark = pytest.mark.slow  # real process groups: the full suite, not `-m "not slow"`


def json_lines(out: str) -> tuple[list[dict], dict]:
    """`run --json`'s stdout: the per-step lines, and the summary (the last line)."""
    *steps, summary = [json.loads(line) for line in out.strip().splitlines()]
    return steps, summary


@pytest.mark.timeout(120)
def test_run_prints_json_and_writes_a_trace(tmp_path, capsys):
    plan = greedy(
        [0, 1, 1, 0],
        3,
        2,
        backward=lambda s, m: "I" if m else "B",
        num_layers=layer_count("tiny-llama"),
    )
    plan_path, trace_path = tmp_path / "plan.json", tmp_path / "trace.json"
    save_plan(plan.with_predicted({"iteration_time": 0.123}), plan_path)
    code = main(
        [
            "run",
            "--plan",
            str(plan_path),
            "--model",
            "tiny-llama",
            "--steps",
            "3",
            "--optimizer",
            "adam",
            "--lr",
            "0.003",
            "--json",
            "--trace",
            str(trace_path),
            "--png",
            str(tmp_path / "measured.svg"),
        ]
    )
    assert code == 0
    steps, report = json_lines(capsys.readouterr().out)
    assert len(report["losses"]) == 3 and all(x > 0 for x in report["losses"])
    # One line per step as it finished, then the summary: the same losses and times.
    assert [s["step"] for s in steps] == [1, 2, 3] and report[
        "first_step"
    ] == 0  # steps done before
    assert [s["loss"] for s in steps] == report["losses"]
    assert [s["step_time"] for s in steps] == report["step_times"]
    assert all(s["tokens_per_second"] > 0 for s in steps)
    assert report["iteration_time"] > 0
    assert report["predicted_iteration_time"] == 0.123
    assert len(report["peak_memory_bytes"]) == 2 and min(report["peak_memory_bytes"]) > 0
    assert report["peak_memory_source"] == "cpu_max_rss"
    events = json.loads(trace_path.read_text())["traceEvents"]
    actions = [e for e in events if e["ph"] == "X" and e["cat"] != "wait"]
    for rank in (0, 1):
        mine = [e["name"] for e in actions if e["pid"] == rank]
        assert mine == [str(a) for a in plan.schedule[rank]] * 3
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in actions)
    # The picture holds the last step's actions, one box each.
    svg = (tmp_path / "measured.svg").read_text()
    assert svg.count('id="action-d') == sum(len(acts) for acts in plan.schedule.values())


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--model", "tiny-vlm"],
            f"stages cover 7 layers but the model has {layer_count('tiny-vlm')}",
        ),
        (["--model", "tiny-llama", "--nproc", "1"], "needs 2 devices but only 1 processes"),
        (["--model", "no-such-model"], "unknown model 'no-such-model'"),
    ],
)
def test_plans_it_cannot_run_exit_2_with_one_line(tmp_path, capsys, args, message):
    plan_path = tmp_path / "plan.json"
    assert layer_count("tiny-llama") == 7
    save_plan(one_f_one_b(2, 2, num_layers=7), plan_path)
    assert main(["run", "--plan", str(plan_path), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_a_cyclic_plan_exits_2_naming_the_waiting_actions(tmp_path, capsys):
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(
        json.dumps(
            {
                "format": "octopipe.plan/1",
                "num_devices": 2,
                "num_microbatches": 2,
                "stages": [{"layers": [0, 3], "device": 0}, {"layers": [3, 7], "device": 1}],
                "schedule": {"0": ["0F0", "0B0", "0F1", "0B1"], "1": ["1F0", "1B1", "1B0", "1F1"]},
            }
        )
    )
    assert main(["run", "--plan", str(plan_path), "--model", "tiny-llama"]) == 2
    err = capsys.readouterr().err
    assert "deadlocks" in err and "waits for" in err and "1B1" in err


@pytest.mark.timeout(120)
def test_run_as_ranks_of_an_existing_job(tmp_path):
    """What torchrun does: start every rank with RANK/WORLD_SIZE set; rank 0 reports.

    The ranks meet through a file here, since torchrun's env:// store listens on every interface.
    """
    plan_path = tmp_path / "plan.json"
    save_plan(greedy([0, 1, 0], 2, 2, backward=lambda s, m: "I"), plan_path)
    env = {
        **os.environ,
        "WORLD_SIZE": "2",
        "LOCAL_WORLD_SIZE": "2",
        "GLOO_SOCKET_IFNAME": "lo",
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]
        ),
    }
    cmd = [
        sys.executable,
        "-m",
        "octopipe",
        "run",
        "--plan",
        str(plan_path),
        "--model",
        TOY,
        "--steps",
        "2",
        "--json",
        "--backend",
        "gloo",
        "--timeout",
        "60",
        "--init-method",
        f"file://{tmp_path / 'store'}",
    ]
    procs = [
        subprocess.Popen(
            cmd,
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    outs = [p.communicate(timeout=100) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(err[-2000:] for _, err in outs)
    _, report = json_lines(outs[0][0])
    assert len(report["losses"]) == 2 and len(report["peak_memory_bytes"]) == 2
    assert outs[1][0] == ""


@pytest.mark.timeout(120)
def test_run_at_the_sizes_the_profile_was_measured_at(tmp_path, capsys):
    """--seq-len and --micro-batch-size size the data: the first step's loss is that of the
    model at those sizes (the default sizes give another)."""
    from octopipe.runtime.job.run_config import RunConfig
    from octopipe.runtime.reference import train_reference

    layers, M = layer_count("tiny-llama"), 3
    save_plan(one_f_one_b(2, M, num_layers=layers), tmp_path / "plan.json")
    args = ["run", "--plan", str(tmp_path / "plan.json"), "--model", "tiny-llama", "--json"]
    assert main([*args, "--steps", "1", "--seq-len", "16", "--micro-batch-size", "1"]) == 0
    measured = json_lines(capsys.readouterr().out)[1]["losses"][0]

    def first_loss(**sizes):
        return train_reference(RunConfig("tiny-llama", **sizes), M).losses[0]

    one = JobShape(tp=1, pp=1, dp=1, microbatch_size=1)
    assert measured == pytest.approx(first_loss(seq_len=16, shape=one), rel=1e-5)
    assert measured != pytest.approx(first_loss(), rel=1e-5)


@pytest.mark.timeout(120)
def test_run_says_when_it_runs_other_replicas_than_planned(tmp_path, capsys):
    plan = one_f_one_b(2, 2, layer_count("tiny-llama")).with_shape(tp=1, dp=4, microbatch_size=1)
    save_plan(plan, tmp_path / "plan.json")
    argv = ["run", "--plan", str(tmp_path / "plan.json"), "--model", "tiny-llama", "--steps", "1"]
    assert main([*argv, "--dp", "1", "--json"]) == 0  # without --dp: the plan's 4
    captured = capsys.readouterr()
    assert "planned for 4 data-parallel replicas" in captured.err and "ran 1" in captured.err
    assert len(json_lines(captured.out)[1]["losses"]) == 1
