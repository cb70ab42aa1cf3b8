"""Tied embeddings in the executor: a Qwen2 config with `tie_word_embeddings: true` (random
weights, built from its config) trains as one process does under any plan.

The embedding and the head on one stage share their table as in one process; on stages of two
ranks each keeps a copy, their gradients summed before the optimizer (so the copies stay
equal); on two stages of one rank (a V-shaped placement) they share one parameter; under TP
the table is vocabulary-parallel in both places; under CP each CP rank's pipeline sums its own
copies; under FSDP2 the copies' shards are summed. Every step's loss, every gradient and every
final weight match `train_reference` at 1e-5. A checkpoint holds the table once, resumes on
one stage, and `export-hf` makes a tied model of it that `from_pretrained` loads.
"""

from __future__ import annotations

import pytest
import torch
from executor_helpers import greedy, layer_count, run_config
from model_zoo import write_hf_config

from octopipe.actions import B, I
from octopipe.costmodel import load_architecture
from octopipe.costmodel.build import build_profile
from octopipe.costmodel.hardware import hardware_preset
from octopipe.costmodel.settings import Settings
from octopipe.runtime.checkpoint.metadata import read_metadata
from octopipe.runtime.job.run_config import Job
from octopipe.runtime.launch.launcher import launch
from octopipe.runtime.reference import mismatches, train_reference
from octopipe.runtime.step.optim import OptimizerConfig

pytest.importorskip("transformers")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SGD = OptimizerConfig("sgd", lr=0.05, momentum=0.9, clip_norm=0.5)


def mixed(stage: int, mb: int) -> str:
    return I if (stage + mb) % 2 else B


def job(model: str, placement, steps: int = 2, tp: int = 1, **options) -> Job:
    devices = max(placement) + 1
    plan = greedy(list(placement), 2, devices, backward=mixed, num_layers=layer_count(model))
    config = run_config(
        model, 2, steps=steps, optimizer=SGD, collect_state=True, seq_len=8, tp=tp, **options
    )
    return Job(plan, config)


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    root = tmp_path_factory.mktemp("tied")
    path = write_hf_config(root, "llama", model_type="qwen2", tie_word_embeddings=True)
    return f"hf:{path}", root


def test_a_tied_model_trains_as_one_process_on_two_stages_tp_cp_zero3_and_a_v_shape(tied):
    model, root = tied
    ckpt = root / "ckpt"
    jobs = {
        "PP 2, saves step 2": job(model, (0, 1), checkpoint_dir=str(ckpt), checkpoint_every=2),
        "TP 2 x PP 2": job(model, (0, 1), tp=2),
        "V-shape: embedding and head on device 0": job(model, (0, 1, 1, 0)),
        "CP 2 x PP 2": job(model, (0, 1), cp=2),
        "PP 2 x DP 2, zero 3: the copies sharded": job(model, (0, 1), dp=2, zero=3),
    }
    results = launch(list(jobs.values()), 4, "gloo", timeout_s=120)
    for (name, ran), result in zip(jobs.items(), results, strict=True):
        reference = train_reference(ran.config, 2)
        assert "lm_head.weight" not in result.params, name  # one table, by its first name
        assert mismatches(result, reference) == [], name
    # Each rank holds its copy: the cost model's param_bytes of its layers (the head counts
    # its own copy of the table), fp32 weights and gradients and SGD's momentum.
    ran, result = jobs["PP 2, saves step 2"], results[0]
    settings = Settings(
        seq_len=8, micro_batch_size=2, weight_bytes=4, grad_bytes=4, optimizer_bytes=4
    )
    arch = load_architecture(model.removeprefix("hf:"))
    layers = build_profile(arch, hardware_preset("h100"), settings, 2).layers
    expected = [sum(x.param_bytes for x in layers[st.start : st.end]) for st in ran.plan.stages]
    assert list(result.state_bytes[:2]) == expected
    # The checkpoint holds the table once.
    keys = read_metadata(ckpt / "step-2").state_dict_metadata
    assert "model.model.embed_tokens.weight" in keys
    assert not any("lm_head" in k for k in keys)
    # Resumed on one stage (one parameter again), to step 4: as four steps in one process.
    (resumed,) = launch(
        [job(model, (0,), steps=4, checkpoint_dir=str(ckpt), resume=True)],
        1,
        "gloo",
        timeout_s=120,
    )
    assert resumed.first_step == 2
    assert mismatches(resumed, train_reference(job(model, (0,), steps=4).config, 2)) == []


def test_a_tied_checkpoint_exports_to_a_tied_model(tied, tmp_path):
    from transformers import AutoModelForCausalLM

    from octopipe.cli import main

    model, root = tied
    ckpt = tmp_path / "ckpt"
    (result,) = launch(
        [job(model, (0, 1), steps=2, checkpoint_dir=str(ckpt), checkpoint_every=2)],
        2,
        "gloo",
        timeout_s=120,
    )
    out = tmp_path / "exported"
    assert main(["export-hf", "--checkpoint", str(ckpt), "--model", model, "-o", str(out)]) == 0
    loaded = AutoModelForCausalLM.from_pretrained(out).eval()
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    assert torch.equal(loaded.model.embed_tokens.weight, result.params["model.embed_tokens.weight"])
