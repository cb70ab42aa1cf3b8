"""The typed job config: each setting spelled once, and every surface read off it (run's flags,
the --config job file, octopipe.run's keywords, docs/FORMATS.md's table)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import pytest

from octopipe.cli import build_parser, main
from octopipe.config import JobConfig
from octopipe.config.docs import (
    BEGIN,
    END,
    PLANNING_BEGIN,
    PLANNING_END,
    documented,
    planning_documented,
)
from octopipe.config.job import all_settings
from octopipe.config.sources import add_flags, from_file, from_flags, from_keywords, keywords
from octopipe.errors import InputError

DOCS = Path(__file__).resolve().parents[1] / "docs" / "FORMATS.md"
SETTINGS = all_settings()


def _parse(*argv: str) -> JobConfig:
    parser = argparse.ArgumentParser()
    add_flags(parser)
    return from_flags(parser.parse_args(list(argv)))


def _job_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.toml"
    path.write_text(text)
    return path


def test_every_setting_has_a_doc_and_unique_names():
    assert len(SETTINGS) >= 35
    for names in ([s.key for s in SETTINGS], [s.keyword for s in SETTINGS]):
        assert len(names) == len(set(names))
    flags = [s.spec.flag for s in SETTINGS if s.spec.flag]
    assert len(flags) == len(set(flags))
    for s in SETTINGS:
        assert len(s.spec.doc) > 10, s.key


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.key)
def test_each_setting_is_a_flag_a_file_key_a_keyword_and_a_docs_row(setting, tmp_path, capsys):
    assert main(["run", "--help"]) == 0
    assert setting.spec.flag in capsys.readouterr().out
    value = _a_value(setting)
    section, name = setting.key.split(".")
    literal = json.dumps(value) if not isinstance(value, bool) else str(value).lower()
    from_the_file = from_file(_job_file(tmp_path, f"[{section}]\n{name} = {literal}\n"))
    assert getattr(getattr(from_the_file, section), name) == value
    by_keyword = from_keywords(JobConfig(), **{setting.keyword: value})
    assert getattr(getattr(by_keyword, section), name) == value
    assert f"| `{setting.key}` | `{setting.spec.flag}` | `{setting.keyword}` |" in documented()


def _a_value(s):
    """A valid value of the setting other than its default."""
    if s.spec.choices:
        return next(c for c in s.spec.choices if c != s.default)
    if s.kind is bool:
        return not s.default
    if s.kind is str:
        return "some/path"
    low = s.spec.low or 0
    return (int(low) + 1) if s.kind is int else float(low) + 0.5


def test_the_docs_table_is_the_configs():
    text = DOCS.read_text()
    start, end = text.index(BEGIN), text.index(END) + len(END)
    assert text[start:end] == documented(), "regenerate: python -m octopipe.config.docs"
    start, end = text.index(PLANNING_BEGIN), text.index(PLANNING_END) + len(PLANNING_END)
    assert text[start:end] == planning_documented(), "regenerate: python -m octopipe.config.docs"


def test_flags_override_the_file_even_at_their_default(tmp_path):
    job = _job_file(tmp_path, "[training]\nsteps = 10\n[optimizer]\nname = 'adamw'\nlr = 0.5\n")
    config = _parse("--config", str(job), "--steps", "3", "--lr", "0.25")
    assert config.training.steps == 3  # 3 is the default: given, it still wins
    assert config.optimizer.lr == 0.25
    assert config.optimizer.name == "adamw"  # from the file, no flag given
    assert _parse().training.steps == 3 and _parse().optimizer.name == "adamw"


def test_bool_flags_and_none_defaults():
    config = _parse("--bf16", "--resume", "--checkpoint-dir", "ckpt")
    assert config.training.bf16 and config.checkpoint.resume
    assert config.checkpoint.dir == "ckpt" and config.parallelism.dp is None


@pytest.mark.parametrize(
    "text, expect",
    [
        ("[trainig]\nsteps = 3\n", "unknown section [trainig]"),
        ("[training]\nstep = 3\n", "training.step: unknown key; [training] takes: steps"),
        ("[training]\nsteps = '3'\n", "training.steps: expected integer, got '3'"),
        ("[training]\nsteps = true\n", "training.steps: expected integer, got True"),
        ("[training]\nsteps = 0\n", "training.steps: expected an integer in [1,"),
        ("[optimizer]\nname = 'lion'\n", "optimizer.name: expected one of sgd, adam, adamw"),
        ("[optimizer]\nmomentum = 1.0\n", "optimizer.momentum: expected a number in [0, 1)"),
        ("[optimizer]\nlr = nan\n", "optimizer.lr: expected a finite number"),
        ("training = 3\n", "expected a [training] table"),
        ("[training\n", "not a TOML job file"),
    ],
)
def test_a_bad_job_file_is_one_line_naming_file_and_key(tmp_path, text, expect):
    job = _job_file(tmp_path, text)
    with pytest.raises(InputError) as refused:
        from_file(job)
    assert expect in str(refused.value)
    assert str(job) in str(refused.value) and "\n" not in str(refused.value)


def test_run_with_a_bad_job_file_exits_2_in_one_line(tmp_path, capsys):
    job = _job_file(tmp_path, "[training]\nsteps = 3\nwarmup = 2\n")
    assert main(["run", "--config", str(job)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "training.warmup: unknown key" in err[0]
    assert main(["run", "--config", str(tmp_path / "none.toml")]) == 2
    assert "none.toml does not exist: expected a TOML job file" in capsys.readouterr().err


def test_run_needs_a_plan_and_a_model_from_flags_or_file(tmp_path, capsys):
    job = _job_file(tmp_path, "[model]\nname = 'tiny-llama'\n")
    assert main(["run", "--config", str(job)]) == 2
    assert "required: --plan (or [plan] file in --config)" in capsys.readouterr().err


def test_rules_between_settings_name_a_flag():
    with pytest.raises(InputError, match="--min-lr: 0.5 is above --lr 0.1"):
        from_keywords(JobConfig(), lr=0.1, min_lr=0.5).check()
    with pytest.raises(InputError, match="--keep-last: needs --checkpoint-every"):
        from_keywords(JobConfig(), checkpoint_dir="c", keep_last=2).check()
    assert from_keywords(JobConfig(), eval_every=2).check(val_data_given=True)


def test_keywords_are_the_settings_and_unknown_ones_are_refused():
    assert {"steps", "lr", "warmup_steps", "decay", "checkpoint_dir", "model"} <= set(keywords())
    with pytest.raises(TypeError, match="stepz"):
        from_keywords(JobConfig(), stepz=3)
    with pytest.raises(InputError, match="--steps: expected an integer in"):
        from_keywords(JobConfig(), steps=0)


def test_configs_are_frozen_values():
    config = JobConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.training.steps = 5  # type: ignore[misc]
    assert from_keywords(config, steps=5) == from_keywords(JobConfig(), steps=5) != config


def test_the_run_parser_comes_from_the_config():
    sub = build_parser()._subparsers._group_actions[0].choices["run"]
    flags = {o for a in sub._actions for o in a.option_strings} - {"-h", "--help", "--config"}
    assert flags == {s.spec.flag for s in SETTINGS if s.spec.flag}


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_job_file_trains_as_the_same_flags_do(tmp_path, capsys):
    """`run --config job.toml` and the same settings as flags train the same losses; a flag
    beside the file overrides it (here: the steps)."""
    from executor_helpers import greedy, layer_count

    from octopipe.plan import save_plan

    plan = greedy([0, 1], 2, 2, num_layers=layer_count("tiny-llama"))
    save_plan(plan, tmp_path / "plan.json")
    job = _job_file(
        tmp_path,
        f"[plan]\nfile = {json.dumps(str(tmp_path / 'plan.json'))}\n"
        "[model]\nname = 'tiny-llama'\nseed = 3\n"
        "[training]\nsteps = 5\n"
        "[optimizer]\nname = 'adamw'\nlr = 0.003\n"
        "[lr_schedule]\nwarmup_steps = 1\ndecay = 'cosine'\n"
        "[logging]\njson = true\n",
    )
    assert main(["run", "--config", str(job), "--steps", "2"]) == 0
    from_file = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    flags = ["--plan", str(tmp_path / "plan.json"), "--model", "tiny-llama", "--seed", "3"]
    flags += ["--steps", "2", "--optimizer", "adamw", "--lr", "0.003", "--lr-warmup", "1"]
    assert main(["run", *flags, "--lr-decay", "cosine", "--json"]) == 0
    from_flags = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert len(from_file["losses"]) == 2
    assert from_file["losses"] == from_flags["losses"]
