"""Training a team's own model: Hugging Face and torchtitan-style models split by module FQNs,
tuned plans, data parallelism, real data, a loss of one's own; every run equal to one process.

Each run is compared with `train_reference` (the whole model in this process, the same global
batches): losses, gradients and weights after 3 steps, fp32, relative 1e-5.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from executor_helpers import SGD_FLAGS, SGD_KEYWORDS, one_f_one_b, run_config
from model_zoo import label_smoothed_loss, titan_style, token_batches, write_hf_config

import octopipe as op
from octopipe.cli import main
from octopipe.errors import InputError
from octopipe.plan import JobShape, save_plan
from octopipe.runtime.data.batches import GivenBatches, TokenFile, replica_batch
from octopipe.runtime.job.run_config import Job, RunConfig
from octopipe.runtime.launch.launcher import launch
from octopipe.runtime.model.load import load_recipe
from octopipe.runtime.model.split import parameter_bytes
from octopipe.runtime.reference import mismatches, train_reference
from octopipe.runtime.step.optim import OptimizerConfig

pytest.importorskip("transformers")

STEPS, SEQ, MBS = 3, 12, 2
SGD = OptimizerConfig("sgd", lr=0.05, momentum=0.9)


def tuned_plan(config_path, devices: int, microbatches: int):
    """A plan tuned on the analytic profile of the config, named as transformers names it."""
    profile = op.profile_from_config(
        config_path,
        devices=devices,
        seq_len=SEQ,
        micro_batch_size=MBS,
        layer_names="hf",
    )
    return op.tune(profile, microbatches, time_budget=2.0).best.plan


def config(model, dp: int, **options) -> RunConfig:
    return run_config(
        model, MBS, steps=STEPS, optimizer=SGD, collect_state=True, seq_len=SEQ, dp=dp, **options
    )


@pytest.fixture(scope="module")
def hf_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    return {kind: f"hf:{write_hf_config(root / kind, kind)}" for kind in ("llama", "qwen2_moe")}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_hf_models_train_through_tuned_plans_with_data_parallelism_as_in_one_process(hf_models):
    llama, moe = hf_models["llama"], hf_models["qwen2_moe"]
    cases = [  # (model, devices, replicas, microbatches): 2 to 6 processes
        (llama, 2, 1, 4),
        (llama, 2, 3, 2),
        (moe, 3, 2, 2),
        (moe, 2, 1, 3),
    ]
    jobs = [
        Job(tuned_plan(model.removeprefix("hf:"), p, m), config(model, dp))
        for model, p, dp, m in cases
    ]
    results = launch(jobs, 6, "gloo", timeout_s=120)
    for job, result in zip(jobs, results):
        reference = train_reference(job.config, job.plan.num_microbatches)
        assert len(result.losses) == STEPS
        assert result.params.keys() == reference.params.keys()
        assert mismatches(result, reference) == [], (job.config.model, job.config.shape.dp)
    # One global batch, any D: 2 replicas of 2 microbatches see what 1 of 4 does.
    assert (
        train_reference(jobs[0].config, 4).losses == train_reference(config(llama, dp=2), 2).losses
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_torchtitan_style_model_pipelines_unchanged_and_each_rank_holds_its_stages():
    recipe = load_recipe(titan_style)
    assert recipe.layers == (
        "tok_embeddings",
        "layers.0",
        "layers.1",
        "layers.2",
        "layers.3",
        "norm",
        "output",
    )
    plan = one_f_one_b(2, 4, num_layers=len(recipe.layers))  # 3 | 4 layers
    jobs = [Job(plan, config(titan_style, dp)) for dp in (1, 2)]
    results = launch(jobs, 4, "gloo", timeout_s=120)
    for job, result in zip(jobs, results):
        assert mismatches(result, train_reference(job.config, 4)) == []
    # A rank allocates its stages' weights, not the model's.
    meta = recipe.meta_model
    for rank, held in enumerate(results[1].parameter_bytes):
        stage = plan.stages[rank % 2]
        layers = recipe.layers[stage.start : stage.end]
        assert held == sum(parameter_bytes(meta.get_submodule(n)) for n in layers)
        assert held < parameter_bytes(meta)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_python_api_takes_a_factory_a_loss_and_global_batches():
    plan = one_f_one_b(2, 2, num_layers=7)
    batches = token_batches(STEPS, 2 * 2 * MBS)  # D x M x b sequences per step
    result = op.run(
        plan,
        titan_style,
        steps=STEPS,
        dp=2,
        loss=label_smoothed_loss,
        data=batches,
        micro_batch_size=MBS,
        **{**SGD_KEYWORDS, "lr": 0.05},
    )
    reference = train_reference(
        RunConfig(
            titan_style,
            steps=STEPS,
            optimizer=OptimizerConfig("sgd", lr=0.05),
            data=GivenBatches(batches),
            loss=label_smoothed_loss,
            shape=JobShape(tp=1, pp=1, dp=2, microbatch_size=MBS),
        ),
        2,
    )
    assert result.losses == pytest.approx(reference.losses, rel=1e-5)


def test_a_plan_for_other_layers_is_refused_by_name_before_anything_starts(tmp_path, capsys):
    plan = one_f_one_b(2, 2, num_layers=7).with_layer_names(
        ["tok_embeddings", "layers.0", "layers.1", "layers.2", "layers.3", "norm", "head"]
    )
    with pytest.raises(InputError, match="layer 6 is 'head' in the plan but 'output'"):
        launch([Job(plan, config(titan_style, 1))], 2, "gloo")
    with pytest.raises(InputError, match="2 replicas do not divide the 3 processes"):
        launch([Job(one_f_one_b(1, 2, num_layers=7), config(titan_style, 2))], 3, "gloo")


def test_token_file_sequences_depend_on_seed_step_and_index_only(tmp_path):
    path = tmp_path / "tokens.bin"
    np.arange(1000, dtype=np.uint16).tofile(path)
    data = TokenFile(path, seq_len=8, seed=3)
    big, again = data.global_batch(2, 6), TokenFile(path, 8, 3).global_batch(2, 6)
    assert torch.equal(big.inputs[0], again.inputs[0])
    assert torch.equal(big.inputs[0][:, 1:], big.targets[:, :-1])  # next tokens
    assert torch.equal(data.global_batch(2, 4).inputs[0], big.inputs[0][:4])  # by index
    assert not torch.equal(data.global_batch(3, 6).inputs[0], big.inputs[0])
    # Replica 1 of 2 with 3 microbatches of 1 takes sequences 3, 4, 5.
    share = replica_batch(big, 1, 3, 1)
    assert torch.equal(torch.cat([x for (x,) in share.inputs]), big.inputs[0][3:])
    with pytest.raises(InputError, match="not a whole number of uint32"):
        np.arange(3, dtype=np.uint16).tofile(path)
        TokenFile(path, 2, 0, "uint32")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_run_command_trains_an_hf_model_on_a_token_file_with_two_replicas(
    hf_models, tmp_path, capsys
):
    tokens = tmp_path / "tokens.bin"
    np.random.default_rng(0).integers(0, 96, 5000).astype(np.uint16).tofile(tokens)
    plan_path = tmp_path / "plan.json"
    save_plan(tuned_plan(hf_models["llama"].removeprefix("hf:"), 2, 2), plan_path)
    argv = ["run", "--plan", str(plan_path), "--model", hf_models["llama"], "--dp", "2"]
    argv += ["--data", str(tokens), "--seq-len", str(SEQ), "--micro-batch-size", str(MBS)]
    argv += SGD_FLAGS
    assert main([*argv, "--steps", str(STEPS), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    reference = train_reference(
        RunConfig(
            hf_models["llama"],
            steps=STEPS,
            seq_len=SEQ,
            data=TokenFile(tokens, SEQ, 0),
            shape=JobShape(tp=1, pp=1, dp=2, microbatch_size=MBS),
        ),
        2,
    )
    assert summary["losses"] == pytest.approx(reference.losses, rel=1e-5)
    assert len(summary["peak_memory_bytes"]) == 4


ADAMW = OptimizerConfig(
    "adamw",
    lr=0.01,
    weight_decay=0.1,
    warmup_steps=2,
    decay="cosine",
    min_lr=0.001,
    total_steps=6,
    clip_norm=0.5,  # below the gradients' norm on these steps: clipping acts
)


def adamw_config(model, dp, **options) -> RunConfig:
    return run_config(
        model, MBS, optimizer=ADAMW, seq_len=SEQ, collect_state=True, dp=dp, **options
    )


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_checkpoint_resumes_under_another_plan_and_another_d_with_identical_losses(tmp_path):
    """AdamW with weight decay, warm-up and cosine decay, clipping, ZeRO-1: 4 steps on 2 devices
    x 2 replicas, then on from the checkpoint at step 4 on 3 devices, 1 replica, to step 6."""
    layers = len(load_recipe(titan_style).layers)
    first = one_f_one_b(2, 2, num_layers=layers)  # 3 | 4 layers, 2 microbatches x 2 replicas
    second = one_f_one_b(3, 4, num_layers=layers)  # 2 | 3 | 2 layers, 4 microbatches
    ckpt = str(tmp_path / "ckpt")
    before = adamw_config(titan_style, 2, steps=4, zero=1, checkpoint_dir=ckpt, checkpoint_every=2)
    after = adamw_config(titan_style, 1, steps=6, checkpoint_dir=ckpt, resume=True)
    (ran,) = launch([Job(first, before)], 4, "gloo", timeout_s=120)
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("step-*")) == ["step-2", "step-4"]
    (resumed,) = launch([Job(second, after)], 3, "gloo", timeout_s=120)
    straight = train_reference(adamw_config(titan_style, 1, steps=6), 4)
    assert resumed.first_step == 4 and len(resumed.losses) == 2
    assert ran.losses == pytest.approx(straight.losses[:4], rel=1e-5)
    assert resumed.losses == pytest.approx(straight.losses[4:], rel=1e-5)
    assert mismatches(resumed, straight) == []  # weights and last gradients after step 6
    # The same checkpoint into a ZeRO-1 run again: each rank loads the state of its shard.
    sharded = adamw_config(titan_style, 2, steps=6, zero=1, checkpoint_dir=ckpt, resume=True)
    (again,) = launch([Job(one_f_one_b(2, 2, num_layers=layers), sharded)], 4, "gloo")
    assert mismatches(again, straight) == []


def test_a_checkpoint_of_another_model_is_refused(tmp_path):
    from octopipe.runtime.checkpoint.folder import Marker, Resumable
    from octopipe.runtime.checkpoint.store import check_compatible

    marker = Marker(format="octopipe.checkpoint/1", step=2, model="m", layers=("a",), seed=0)
    recipe = load_recipe(titan_style)
    with pytest.raises(InputError, match="another model"):
        check_compatible(
            Resumable(tmp_path, 2, marker),
            recipe.layers,
            recipe.meta_model,
            seed=0,
            optimizer="sgd",
            model_id="m",
        )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bf16_autocast_runs_split_backwards_as_one_process_does():
    from executor_helpers import greedy

    from octopipe.actions import B, I

    plan = greedy([0, 1, 0, 1], 4, 2, backward=lambda s, m: I if (s + m) % 2 else B, num_layers=7)
    bf16 = config(titan_style, 1, autocast="bf16")
    (result,) = launch([Job(plan, bf16)], 2, "gloo", timeout_s=120)
    reference = train_reference(bf16, 4)
    assert mismatches(result, reference) == []
    assert reference.losses != train_reference(config(titan_style, 1), 4).losses  # it is on


@pytest.mark.slow
def test_profile_of_an_hf_model_names_its_layers_as_profile_arch_does(hf_models, tmp_path):
    path = hf_models["qwen2_moe"]
    out = tmp_path / "measured.json"
    argv = ["profile", "--model", path, "--seq-len", "8", "--micro-batch-size", "1"]
    assert main([*argv, "--repeats", "1", "--warmup", "0", "-o", str(out)]) == 0
    measured = op.load_profile(out)
    analytic = op.profile_from_config(path.removeprefix("hf:"), layer_names="hf")
    assert measured.layer_names == analytic.layer_names
    assert all(layer.f > 0 and layer.param_bytes > 0 for layer in measured.layers)
