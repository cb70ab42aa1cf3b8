"""Expert parallelism in the executor equals single-process training.

Routed experts divided over EP groups, tokens dispatched and combined by all-to-all (gloo on
127.0.0.1, real process groups): EP 2 x PP 2 over the replicas of our bundled MoE and of Hugging
Face Qwen2-MoE and Mixtral configs (fused 3-D expert weights cut by expert index), EP 2 folded
over TP 2 on the Qwen2-MoE config, EP 4 folded over TP 2 x DP 2 on the bundled MoE
(Megatron-Core's MoE parallel folding), and EP 2 over the replicas under TP 2 with ZeRO-1 (the
dense state sharded over the replicas, each expert's over the ranks holding it). Every step's
loss, every gradient and every final weight match `train_reference` at 1e-5 (split and full
backward mixed, clipping on). A checkpoint written at EP 2 resumes at EP 1 on another plan and
back at EP 2. Each rank holds the analytic cost model's `param_bytes` of its layers at its TP
and EP degrees. One process group runs them all.
"""

from __future__ import annotations

import pytest
from executor_helpers import (
    PARALLEL_MBS,
    PARALLEL_SEQ,
    PARALLEL_STEPS,
    layer_count,
    one_f_one_b,
    two_devices,
)
from executor_helpers import parallel_job as job
from model_zoo import write_hf_config

from octopipe.costmodel import load_architecture
from octopipe.costmodel.build import build_profile
from octopipe.costmodel.hardware import hardware_preset
from octopipe.costmodel.settings import Settings
from octopipe.runtime.launch.launcher import launch
from octopipe.runtime.reference import mismatches, train_reference

pytest.importorskip("transformers")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

STEPS, SEQ, MBS = PARALLEL_STEPS, PARALLEL_SEQ, PARALLEL_MBS
MOE = "tiny-moe"
# A tiny Mixtral: the Llama config with four fused experts (no shared one).
MIXTRAL = {
    "model_type": "mixtral",
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "intermediate_size": 16,
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return tmp_path_factory.mktemp("checkpoints")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, checkpoints):
    """Every plan of this file, run once in one process group: name -> (job, result)."""
    qwen = f"hf:{write_hf_config(tmp_path_factory.mktemp('hf'), 'qwen2_moe')}"
    mixtral = f"hf:{write_hf_config(tmp_path_factory.mktemp('mixtral'), 'llama', **MIXTRAL)}"
    saving = {"checkpoint_dir": str(checkpoints), "checkpoint_every": 2}
    jobs = {
        "bundled moe, EP 2 x PP 2 (DP 2), saves step 2": job(
            MOE, two_devices(MOE), dp=2, ep=2, **saving
        ),
        "hf qwen2-moe, EP 2 x PP 2 (DP 2)": job(qwen, two_devices(qwen), dp=2, ep=2),
        "hf qwen2-moe, EP 2 folded over TP 2, PP 2": job(qwen, two_devices(qwen), tp=2, ep=2),
        "hf mixtral, EP 2 x PP 2 (DP 2)": job(mixtral, two_devices(mixtral), dp=2, ep=2),
        "bundled moe, EP 4 folded over TP 2 x DP 2, PP 2": job(
            MOE, two_devices(MOE), tp=2, dp=2, ep=4
        ),
        "bundled moe, EP 2 x TP 2 x PP 2 x DP 2, zero 1": job(
            MOE, two_devices(MOE), tp=2, dp=2, ep=2, zero=1
        ),
    }
    results = launch(list(jobs.values()), 8, "gloo", timeout_s=120)
    return dict(zip(jobs, zip(jobs.values(), results, strict=True), strict=True))


def test_expert_parallel_plans_train_as_one_process(runs):
    for name, (ran, result) in runs.items():
        reference = train_reference(ran.config, ran.plan.num_microbatches)
        assert len(result.losses) == STEPS, name
        assert mismatches(result, reference) == [], name


def analytic_state_bytes(model: str, plan, tp: int, dp: int, ep: int) -> list[int]:
    """Per rank, in rank order: the cost model's `param_bytes` of its layers at TP and EP
    (fp32 weights and gradients, SGD's momentum: 12 bytes per parameter)."""
    settings = Settings(
        seq_len=SEQ,
        micro_batch_size=MBS,
        tensor_parallel=tp,
        expert_parallel=ep,
        weight_bytes=4,
        grad_bytes=4,
        optimizer_bytes=4,
    )
    profile = build_profile(load_architecture(model), hardware_preset("h100"), settings, 2)
    per_device = [0] * plan.num_devices
    for stage in plan.stages:
        per_device[stage.device] += sum(
            x.param_bytes for x in profile.layers[stage.start : stage.end]
        )
    return [per_device[d] for _ in range(dp) for d in range(plan.num_devices) for _ in range(tp)]


def test_ranks_hold_the_cost_models_share_of_the_experts(runs):
    """EP divides the routed experts (each whole), TP the shared expert, heads and vocabulary;
    routers stay whole: the cost model's split, to the byte."""
    for name in (
        "bundled moe, EP 2 x PP 2 (DP 2), saves step 2",
        "bundled moe, EP 4 folded over TP 2 x DP 2, PP 2",
    ):
        ran, result = runs[name]
        cfg = ran.config
        expected = analytic_state_bytes(MOE, ran.plan, cfg.shape.tp, cfg.shape.dp, cfg.shape.ep)
        assert list(result.state_bytes[: cfg.shape.world_size]) == expected, name


def test_an_expert_parallel_checkpoint_resumes_at_ep1_and_back(runs, checkpoints):
    """Written at EP 2 x PP 2 x DP 2 (step 2), resumed at EP 1 on three devices (to step 4,
    saving), and that one at EP 2 over TP 2 on one device (to step 6): six steps of one
    process. Every run's step is one global batch of 4 microbatches (D x M)."""
    three = one_f_one_b(3, 4, layer_count(MOE))
    where = {"checkpoint_dir": str(checkpoints), "resume": True}
    ep1 = job(MOE, three, steps=4, checkpoint_every=2, **where)
    ep2 = job(MOE, one_f_one_b(1, 2, layer_count(MOE)), tp=2, dp=2, ep=2, steps=6, **where)
    at_ep1, at_ep2 = launch([ep1, ep2], 4, "gloo", timeout_s=120)
    straight = train_reference(job(MOE, three, steps=6).config, 4)
    saved = runs["bundled moe, EP 2 x PP 2 (DP 2), saves step 2"][1]
    assert saved.losses == pytest.approx(straight.losses[:2], rel=1e-5)
    assert (at_ep1.first_step, at_ep2.first_step) == (2, 4)
    assert at_ep1.losses == pytest.approx(straight.losses[2:4], rel=1e-5)
    assert mismatches(at_ep2, straight) == []
