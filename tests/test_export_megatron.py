"""The Megatron-LM export: a plan's degrees, batch sizes, distributed optimizer,
recomputation and stages as Megatron-LM's arguments (names checked against Megatron-LM's
arguments.py; `benchmarks/megatron_check.py` parses them with its parser), and a one-line
refusal, naming the nearest plan, for what Megatron-LM cannot run."""

from __future__ import annotations

import re
import subprocess
from dataclasses import replace

import pytest

from octopipe.api import baseline, profile_from_config
from octopipe.cli import main
from octopipe.engines.megatron import megatron_arguments, megatron_notes, write_megatron_args
from octopipe.errors import InputError


@pytest.fixture(scope="module")
def prof():
    return profile_from_config("tiny-llama", devices=2, seq_len=64)


def words(args: list[str]) -> dict[str, str | bool]:
    out: dict[str, str | bool] = {}
    for i, w in enumerate(args):
        if w.startswith("--"):
            nxt = args[i + 1] if i + 1 < len(args) else "--"
            out[w] = nxt if not nxt.startswith("--") else True
    return out


def test_degrees_batches_optimizer_and_recomputation(prof):
    plan = baseline(prof, "i1f1b", "uniform", 4, 2, 2)
    plan = plan.with_shape(tp=2, dp=3, microbatch_size=1, zero=1, cp=2, recompute="full")
    got = words(megatron_arguments(plan, prof))
    blocks = sum(n.startswith("layers.") for n in prof.layer_names)
    assert got == {
        "--tensor-model-parallel-size": "2",
        "--pipeline-model-parallel-size": "2",
        "--context-parallel-size": "2",
        "--sequence-parallel": True,
        "--num-layers": str(blocks),
        "--num-virtual-stages-per-pipeline-rank": "2",
        "--micro-batch-size": "1",
        "--global-batch-size": "12",  # DP 3 x M 4 x b 1
        "--seq-length": "64",
        "--use-distributed-optimizer": True,
        "--use-tp-pp-dp-mapping": True,  # the plan's numbering, DP outermost
        "--recompute-granularity": "full",
        "--recompute-method": "uniform",
        "--recompute-num-layers": "1",
        "--bf16": True,  # the profile's precision
    }
    assert megatron_notes(plan) == []  # OctoPipe's i1f1b is Megatron-LM's order


def test_the_rank_order_reaches_megatron_lm(prof):
    """Megatron-LM's own order (PP outermost) is its default; a plan priced in OctoPipe's (DP
    outermost) asks for `tp-cp-ep-pp-dp` by `--use-tp-pp-dp-mapping`."""
    plan = baseline(prof, "1f1b", "uniform", 4, 2)
    for order, mapped in (("megatron", False), ("octopipe", True)):
        shaped = plan.with_shape(tp=1, dp=2, microbatch_size=1, rank_order=order)
        assert ("--use-tp-pp-dp-mapping" in megatron_arguments(shaped, prof)) == mapped


def test_uneven_stages_go_through_the_pipeline_layout(prof):
    plan = baseline(prof, "1f1b", "uniform", 4, 2)
    cut = plan.stages[0].end + 1  # one block moves to stage 0
    stages = (plan.stages[0]._replace(end=cut), plan.stages[1]._replace(start=cut))
    plan = replace(plan, stages=stages)
    layout = words(megatron_arguments(plan, prof))["--pipeline-model-parallel-layout"]
    first, last = layout.split("|")
    assert first.startswith("E") and last.endswith("L")
    blocks = sum(n.startswith("layers.") for n in prof.layer_names)
    assert layout.count("t") == blocks and first.count("t") == last.count("t") + 2


@pytest.mark.parametrize(
    "schedule, chunks, message",
    [
        ("zbh1", None, "schedule: Megatron-LM's schedules run whole backwards, not I/W splits"),
        ("zbv", None, "stages: Megatron-LM places stage s on rank s mod 2"),
    ],
)
def test_what_megatron_cannot_run_is_refused_naming_the_nearest(prof, schedule, chunks, message):
    plan = baseline(prof, schedule, "uniform", 4, 2, chunks)
    with pytest.raises(InputError, match=re.escape(message)) as caught:
        megatron_arguments(plan, prof)
    text = str(caught.value)
    assert "\n" not in text and "the nearest it runs" in text and "--runner megatron" in text


def test_zero3_and_uneven_recomputation_are_refused(prof):
    plan = baseline(prof, "1f1b", "uniform", 4, 2)
    with pytest.raises(InputError, match="ZeRO-3 is Megatron-FSDP"):
        megatron_arguments(plan.with_shape(tp=1, dp=2, microbatch_size=1, zero=3), prof)
    with pytest.raises(InputError, match="the nearest it runs: every stage full"):
        megatron_arguments(replace(plan, recompute=("full", "none")), prof)


def test_the_args_file_is_a_bash_array(prof, tmp_path):
    plan = baseline(prof, "1f1b", "uniform", 4, 2).with_shape(tp=2, dp=1, microbatch_size=1)
    write_megatron_args(plan, prof, tmp_path / "megatron_args.sh")
    done = subprocess.run(
        ["bash", "-c", 'source megatron_args.sh; printf "%s\\n" "${MEGATRON_ARGS[@]}"'],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.split() == megatron_arguments(plan, prof)


def test_plan_megatron_writes_or_refuses_in_one_line(tmp_path, capsys):
    argv = ["plan", "--model", "tiny-llama", "--devices", "2", "--microbatches", "4"]
    argv += ["--no-png", "--quiet", "--time-budget", "1", "--megatron", "-o", str(tmp_path)]
    assert main(argv) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("Megatron-LM")]
    assert len(lines) == 1
    written = (tmp_path / "megatron_args.sh").exists()
    assert lines[0].startswith("Megatron-LM: no megatron_args.sh: ") != written
