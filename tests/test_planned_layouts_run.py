"""A `plan --gpus` answer with context parallelism runs from the command it prints.

`plan --gpus 8` for our bundled MoE at 256K tokens per sample chooses CP 4 x DP 2 with ZeRO-1;
its printed `octopipe run` command (the flags after `-m octopipe`), scaled to 64 tokens per
sample for this machine, trains on 8 gloo ranks with the losses of one process.
"""

from __future__ import annotations

import json
import shlex

import pytest

from octopipe.cli import main
from octopipe.config import JobConfig
from octopipe.config.sources import from_keywords
from octopipe.plan import load_plan
from octopipe.runtime.reference import train_reference
from octopipe.training import runtime_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_a_cp_answer_of_plan_gpus_runs_from_its_printed_command(tmp_path, capsys):
    out = tmp_path / "plan"
    argv = ["plan", "--model", "tiny-moe", "--gpus", "8", "--gpus-per-node", "8"]
    argv += ["--global-batch", "2", "--seq-len", "262144", "-o", str(out), "--no-png"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    command = next(line for line in printed.splitlines() if "-m octopipe run" in line)
    plan = load_plan(out / "plan.json")
    assert plan.shape.cp > 1 and plan.shape.dp > 1
    flags = shlex.split(command.split("-m octopipe", 1)[1])  # run --plan ... --model ...
    flags[flags.index("--seq-len") + 1] = "64"  # scaled to what this machine holds
    assert main([*flags, "--steps", "2", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    zero = int(flags[flags.index("--zero") + 1]) if "--zero" in flags else 0
    settings = from_keywords(JobConfig(), seq_len=64, steps=2, zero=zero)
    reference = train_reference(runtime_config(settings, plan, "tiny-moe"), plan.num_microbatches)
    assert summary["losses"] == pytest.approx(reference.losses, rel=1e-5)
