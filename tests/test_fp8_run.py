"""`octopipe run` of a plan priced in FP8 trains its blocks' linears in FP8 (torchao's float8,
emulated on CPU): pipelined and data-parallel, it trains as one process converted alike does,
and not as the BF16 run; a plan's precision it does not run is refused in one line."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from executor_helpers import greedy, layer_count

from octopipe.cli import main
from octopipe.config import JobConfig
from octopipe.config.sources import from_keywords
from octopipe.runtime.job.run_config import Job
from octopipe.runtime.launch.launcher import launch
from octopipe.runtime.model.bundled import build_model
from octopipe.runtime.model.fp8 import convert_to_fp8
from octopipe.runtime.reference import mismatches, train_reference
from octopipe.training import runtime_config

pytest.importorskip("torchao")
MODEL = "tiny-llama"


def test_the_blocks_linears_are_converted_and_the_rest_kept():
    model = build_model("tiny-moe")
    swapped = convert_to_fp8(model)
    kinds = {name: type(m).__name__ for name, m in model.named_modules()}
    fp8 = {name for name, kind in kinds.items() if kind == "Float8Linear"}
    assert swapped == len(fp8) > 0
    assert all(".layers." in f".{name}" for name in fp8)  # nothing outside the blocks
    assert not any(name.rsplit(".", 1)[-1] in ("router", "shared_gate") for name in fp8)
    assert any(".experts." in name for name in fp8)  # the experts' GEMMs too, as priced


def _job(fp8: bool, dp: int = 1, zero: int = 0, steps: int = 3) -> Job:
    plan = greedy([0, 1], 2, 2, num_layers=layer_count(MODEL))
    settings = from_keywords(
        JobConfig(), steps=steps, optimizer="adamw", lr=0.01, seq_len=16, micro_batch_size=2,
        dp=dp, zero=zero,
    )  # fmt: skip
    config = runtime_config(settings, plan, MODEL)
    config = replace(config, stepping=replace(config.stepping, fp8=fp8), collect_state=True)
    return Job(plan, config)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_an_fp8_plan_trains_as_one_fp8_process_does():
    """PP 2 for three steps; PP 2 x DP 2 with ZeRO-1 for one (the replicas' sum is in another
    order than one process's, and FP8's rounding turns such 1e-7 differences of the weights
    into 1e-3 ones a step later: it does for this job's third step)."""
    pp, dp, bf = _job(True), _job(True, dp=2, zero=1, steps=1), _job(False)
    results = launch([pp, dp, bf], 4, "gloo", timeout_s=120)
    for job, result in zip((pp, dp), results):
        reference = train_reference(job.config, job.plan.num_microbatches)
        assert mismatches(result, reference, tol=1e-5) == []
    assert results[0].losses[1:] != results[2].losses[1:]  # FP8 rounds: not BF16's run


def _fp8_plan(tmp_path) -> str:
    prof = tmp_path / "p.json"
    argv = ["profile-arch", MODEL, "--precision", "fp8", "--devices", "2", "--seq-len", "16"]
    assert main([*argv, "-o", str(prof)]) == 0
    argv = ["plan", "--profile", str(prof), "--microbatches", "4", "--quiet", "--no-png"]
    assert main([*argv, "--time-budget", "1", "-o", str(tmp_path / "out")]) == 0
    plan = tmp_path / "out" / "plan.json"
    assert json.loads(plan.read_text())["profile"]["precision"] == "fp8"
    return str(plan)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--tp", "2"], "--tp: 2 with FP8 is not built yet"),
        (["--zero", "3", "--dp", "2"], "--zero: 3 with FP8 is not built yet"),
    ],
)
def test_what_fp8_does_not_run_with_is_one_line(extra, message, tmp_path, capsys):
    plan = _fp8_plan(tmp_path)
    capsys.readouterr()
    assert main(["run", "--plan", plan, "--model", MODEL, "--steps", "1", *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_on_a_cpu_the_run_says_it_is_emulated(tmp_path, capsys):
    plan = _fp8_plan(tmp_path)
    capsys.readouterr()
    assert main(["run", "--plan", plan, "--model", MODEL, "--steps", "1"]) == 0
    err = capsys.readouterr().err
    assert "priced in FP8; cpu has no FP8 tensor cores" in err
