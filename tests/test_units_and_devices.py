"""Predictions for the machine one runs on: figures in the units that keep their digits (a
small model's too), profiles named after their model, and a plan that says what device its
costs are for, so that `run` on another says so in one line instead of a meaningless error."""

from __future__ import annotations

import dataclasses
import json

import pytest
from executor_helpers import layer_count, one_f_one_b

from octopipe.cli import main
from octopipe.device_kinds import gpu_kind, other_device_note
from octopipe.errors import InputError
from octopipe.plan import load_plan, plan_from_dict, save_plan
from octopipe.units import fmt_column, fmt_count

TINY_LLAMA = {
    "model_type": "llama",
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}


@pytest.mark.parametrize(
    "n, shown",
    [(512, "512"), (213_568, "213.6K"), (1_500_000, "1.5M"), (8.03e9, "8.03B"), (405e9, "405.0B")],
)
def test_counts_keep_their_digits(n, shown):
    assert fmt_count(n) == shown


def test_a_column_gives_its_largest_figure_four_digits():
    assert fmt_column([182.4, 0.05, 2.0]) == ["182.4", "0.1", "2.0"]
    assert fmt_column([3.259, 0.0009]) == ["3.259", "0.001"]
    assert fmt_column([1234.5, 7.0]) == ["1,234", "7"]


def _profile_arch(tmp_path, capsys, config: dict, name: str = "config.json") -> tuple[dict, str]:
    (tmp_path / name).write_text(json.dumps(config))
    out = tmp_path / f"{name}.profile.json"
    argv = ["profile-arch", str(tmp_path / name), "--seq-len", "64", "--devices", "2"]
    assert main([*argv, "--layer-names", "hf", "-o", str(out)]) == 0
    return json.loads(out.read_text()), capsys.readouterr().out


def test_a_small_model_is_shown_in_units_that_keep_its_digits(tmp_path, capsys):
    profile, printed = _profile_arch(tmp_path, capsys, TINY_LLAMA)
    title = printed.splitlines()[0]
    assert "K params" in title and "0.00B" not in title
    header = next(line for line in printed.splitlines() if "kind" in line)
    assert "f µs" in header and "param MiB" in header  # not ms and GB, all zeros
    total = next(line for line in printed.splitlines() if "total" in line)
    assert " 0.00 " not in total


def test_a_config_json_profile_is_named_after_its_model(tmp_path, capsys):
    profile, _ = _profile_arch(tmp_path, capsys, TINY_LLAMA)
    assert profile["name"] == "llama-tp1-h100"  # model_type: a config.json says no more
    named = {**TINY_LLAMA, "_name_or_path": "acme/tiny-llama-v2"}
    profile, _ = _profile_arch(tmp_path, capsys, named)
    assert profile["name"] == "tiny-llama-v2-tp1-h100"
    profile, _ = _profile_arch(tmp_path, capsys, named, name="mine.json")
    assert profile["name"] == "mine-tp1-h100"  # a file named on purpose keeps its name
    assert [d["name"] for d in profile["devices"]] == ["h100", "h100"]


def test_a_plan_records_the_device_its_costs_are_for(tmp_path, capsys):
    _profile_arch(tmp_path, capsys, TINY_LLAMA)
    argv = ["plan", "--profile", str(tmp_path / "config.json.profile.json"), "--no-png"]
    assert (
        main([*argv, "--microbatches", "2", "--time-budget", "2", "-o", str(tmp_path / "p")]) == 0
    )
    plan = load_plan(tmp_path / "p" / "plan.json")
    assert plan.profile["device"] == "h100"
    header = next(line for line in capsys.readouterr().out.splitlines() if "bubble" in line)
    assert "time µs" in header and " MiB " in header  # a narrow terminal wraps "peak"
    note = other_device_note(plan, "p/plan.json", "cpu")
    assert note.startswith(
        "p/plan.json was priced for h100 (profile llama-tp1-h100); this ran on cpu"
    )
    assert other_device_note(plan, "p/plan.json", "h100") is None


def test_a_plan_naming_no_device_or_a_bad_one():
    plan = one_f_one_b(2, 2)
    assert other_device_note(plan, "plan.json", "cpu") is None  # says nothing: no note
    data = json.loads(json.dumps(plan.to_dict()))
    data["profile"] = {"device": 7}
    with pytest.raises(InputError, match="profile.device"):
        plan_from_dict(data, "plan.json")


def test_gpus_are_named_as_the_presets():
    assert gpu_kind("NVIDIA H100 80GB HBM3") == "h100"
    assert gpu_kind("NVIDIA H200") == "h200"
    assert gpu_kind("NVIDIA GeForce RTX 4090") == "nvidia geforce rtx 4090"


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_run_on_another_device_than_the_plans_says_so_in_one_line(tmp_path, capsys):
    plan = one_f_one_b(2, 2, num_layers=layer_count("tiny-llama"))
    plan = plan.with_predicted({"iteration_time": 1e-4})
    plan = dataclasses.replace(plan, profile={"name": "tiny-h100", "device": "h100"})
    save_plan(plan, tmp_path / "plan.json")
    argv = ["run", "--plan", str(tmp_path / "plan.json"), "--model", "tiny-llama", "--steps", "1"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    (note,) = [line for line in captured.err.splitlines() if "priced for" in line]
    assert "priced for h100 (profile tiny-h100); this ran on cpu" in note
    (line,) = [x for x in captured.out.splitlines() if x.startswith("iteration time")]
    assert line.endswith("plan predicted 100.0 us for another job (note above)")
    assert "%" not in line
