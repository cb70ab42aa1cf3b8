"""The rough edges of `plan --gpus`, `estimate` and the CLI's error line found by a new user's
day (issue 43): an exact layout written and launched as given, what a PP 1 plan of several
chunks is, the error band's line never comparing a plan with itself, figures that agree, and a
pasted megabyte named rather than echoed."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from octopipe.cli import main, shortened
from octopipe.commands._plan_band import within_error_line
from octopipe.plan import load_plan

# Small enough to plan in a few seconds, large enough to have several layouts.
JOB = ["plan", "--gpus", "8", "--model", "llama3-8b", "--time-budget", "60"]


def _plan_json(capsys, argv: list[str]) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_layout_writes_and_launches_exactly_the_layout_given(tmp_path, capsys):
    out = tmp_path / "out"
    found = _plan_json(capsys, [*JOB, "--layout", "cp2,pp2,z1", "-o", str(out)])
    chosen = found["chosen"]
    assert [chosen[k] for k in ("tp", "cp", "pp", "dp", "zero")] == [1, 2, 2, 2, 1]
    assert found["search"]["candidates"] == 1  # no other layout was tried
    shape = load_plan(out / "plan.json").shape
    assert (shape.cp, shape.pp, shape.dp, shape.zero) == (2, 2, 2, 1)
    # Without --layout, the search answers something else for this job: the flag decided it.
    searched = _plan_json(capsys, [*JOB, "-o", str(tmp_path / "searched")])["chosen"]
    assert (searched["cp"], searched["pp"]) != (2, 2)


def test_layout_keeps_the_rank_order_given(tmp_path, capsys):
    found = _plan_json(capsys, [*JOB, "--layout", "pp2,dp4,megatron", "-o", str(tmp_path)])
    assert found["chosen"]["rank_order"] == "megatron"
    assert found["search"]["candidates"] == 1


def test_a_pp1_plan_of_several_chunks_says_what_they_are(tmp_path, capsys):
    assert main([*JOB, "-o", str(tmp_path / "out")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    plan = load_plan(tmp_path / "out" / "plan.json")
    if plan.num_devices == 1 and len(plan.stages) > 1:
        assert "are no pipeline stages; each chunk's gradient reduction starts" in out
    else:  # the answer changed; then no such line may be printed
        assert "are no pipeline stages" not in out
    assert "step s: the pipeline (timeline.png's iteration) and the optimizer step" in out


def test_the_error_band_line_never_sets_the_answer_beside_itself():
    from octopipe.layouts import Cluster, Job, parse_gpus, plan_cluster

    job = Job("llama3-8b", Cluster(parse_gpus("8", "h100"), 8), 512, 4096)
    report = plan_cluster(job, tune_evaluations=200)
    best = report.best
    # best_standard the very plan of the answer, under another label: nothing to try.
    same = replace(best, label=f"best_standard: {best.label}")
    assert within_error_line(replace(report, best_standard=same, recipe=None)) is None
    # Another plan of the same step (to a rounding): no "beats best_standard by 0.0%".
    tied = replace(best, label="1f1b/uniform", tail=best.tail + best.step_time * 1e-5)
    assert within_error_line(replace(report, best_standard=tied, recipe=None)) is None
    # A reference faster than the answer (only `--layout` can give that) is named as such.
    faster = replace(best, tail=best.tail - best.step_time * 0.5)
    line = within_error_line(replace(report, best_standard=faster, recipe=None))
    assert line is not None and line.startswith("beyond the model's error: the given layout")


def test_estimate_names_the_gpus_memory_and_the_part_kept_free(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # the cell on one line
    argv = ["estimate", "--model", "llama3-8b", "--gpus", "8", "--pp", "2"]
    assert main(argv) == 0
    assert "of 79.6 GiB (75.7 GiB usable, 5% kept free)" in capsys.readouterr().out


def test_launch_lines_give_the_models_config_by_an_absolute_path(tmp_path, capsys, monkeypatch):
    from octopipe.costmodel.hf_config import config_path

    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "l8.json").write_text(config_path("llama3-8b").read_text())
    assert main(["plan", "--gpus", "16", "--model", "sub/l8.json", "-o", "out"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "-m octopipe run" in x)
    assert f"--model {tmp_path / 'sub' / 'l8.json'}" in line
    assert f"--plan {tmp_path / 'out' / 'plan.json'}" in line
    assert "each node needs the plan's folder" in out


@pytest.mark.parametrize(
    ("message", "expect"),
    [
        ("short: kept whole", "short: kept whole"),
        ("x" * 300 + ": no such file", "x" * 60 + "... (300 characters): no such file"),
        ("--model: " + "y" * 250, "--model: " + "y" * 60 + "... (250 characters)"),
    ],
)
def test_an_error_line_names_a_long_word_by_its_start_and_length(message, expect):
    assert shortened(message) == expect


def test_the_timeline_headline_counts_one_device_in_the_singular():
    from octopipe.viz.style import headline

    class Stats:
        iteration_time, bubble_ratio, efficiency, num_devices = 1.0, 0.1, None, 1

    assert headline(Stats).endswith("   1 device")
    Stats.num_devices = 2
    assert headline(Stats).endswith("   2 devices")
