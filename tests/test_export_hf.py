"""`octopipe export-hf`: a checkpoint written by a pipelined run of an `hf:` model becomes a
Hugging Face folder that `AutoModelForCausalLM.from_pretrained` loads with the trained weights:
its logits equal those of the model holding the run's final weights (gathered from the ranks,
a path independent of the checkpoint files)."""

from __future__ import annotations

import json

import pytest
import torch
from executor_helpers import one_f_one_b
from model_zoo import write_hf_config

from octopipe.cli import main
from octopipe.runtime.job.run_config import Checkpointing, Job, RunConfig
from octopipe.runtime.launch.launcher import launch
from octopipe.runtime.model.load import load_recipe
from octopipe.runtime.step.optim import OptimizerConfig

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def _logits(model, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=tokens).logits


@pytest.mark.slow
def test_an_exported_checkpoint_loads_with_the_trained_weights(tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    specs = {
        kind: f"hf:{write_hf_config(tmp_path / kind, kind)}" for kind in ("llama", "qwen2_moe")
    }
    jobs = []
    for kind, spec in specs.items():
        plan = one_f_one_b(2, 2, num_layers=len(load_recipe(spec).layers))
        config = RunConfig(
            spec,
            seed=4,
            steps=3,
            optimizer=OptimizerConfig("adamw", lr=1e-2),
            collect_state=True,
            seq_len=8,
            checkpoint=Checkpointing(dir=str(tmp_path / f"ckpt-{kind}"), every=3),
        )
        jobs.append(Job(plan.with_layer_names(load_recipe(spec).layers), config))
    results = launch(jobs, 2, "gloo", timeout_s=120)
    tokens = torch.randint(0, 96, (2, 8), generator=torch.Generator().manual_seed(1))
    for (kind, spec), result in zip(specs.items(), results):
        out = tmp_path / f"exported-{kind}"
        argv = ["export-hf", "--checkpoint", str(tmp_path / f"ckpt-{kind}"), "--model", spec]
        assert main([*argv, "-o", str(out)]) == 0
        assert "(3 steps)" in capsys.readouterr().out
        assert (out / "model.safetensors").is_file()
        assert json.loads((out / "config.json").read_text())["model_type"] == kind
        loaded = AutoModelForCausalLM.from_pretrained(out).eval()
        trained = AutoModelForCausalLM.from_config(loaded.config).eval()
        trained.load_state_dict(result.params, strict=False)  # the ranks' final weights
        assert set(result.params) == {n for n, _ in trained.named_parameters()}
        got, want = _logits(loaded, tokens), _logits(trained, tokens)
        assert torch.equal(got, want), (got - want).abs().max()
        untrained = load_recipe(spec).whole(torch.device("cpu"), seed=4).part.eval()
        assert not torch.allclose(got, _logits(untrained, tokens))  # training moved them


def test_export_refuses_a_model_that_is_not_hf_a_full_folder_and_a_missing_checkpoint(
    tmp_path, capsys
):
    spec = f"hf:{write_hf_config(tmp_path / 'llama', 'llama')}"
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    for argv, says in (
        (["--checkpoint", str(tmp_path), "--model", "tiny-llama", "-o", str(tmp_path / "o")],
         "--model: tiny-llama is no transformers model"),
        (["--checkpoint", str(tmp_path / "none"), "--model", spec, "-o", str(tmp_path / "o")],
         "--checkpoint: no such folder"),
        (["--checkpoint", str(tmp_path), "--model", spec, "-o", str(full)],
         "--output: " + str(full) + " is not empty"),
        (["--checkpoint", str(tmp_path), "--model", spec, "-o", str(tmp_path / "o")],
         "holds no checkpoint (no step-K folder)"),
    ):  # fmt: skip
        assert main(["export-hf", *argv]) == 2
        (line,) = capsys.readouterr().err.splitlines()
        assert says in line, line
    assert not (tmp_path / "o").exists()
