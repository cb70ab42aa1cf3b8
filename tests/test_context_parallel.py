"""Context parallelism in the executor equals single-process training.

Each CP rank holds chunks i and 2C-1-i of every sequence; attention runs as ring attention
(K/V passed around the CP group by point-to-point transfers, the online-softmax merge), rotary
positions follow each rank's tokens, the loss is the mean over every token, and stage
boundaries move each CP rank's part. On real gloo process groups: CP 2 x PP 2 on our bundled
Llama and a Hugging Face Llama config, CP 2 x TP 2 x PP 2 on both, CP 2 x PP 2 x DP 2, CP 2
with ZeRO-1 (the CP ranks hold the same weights: the optimizer state is sharded over them),
CP 2 x DP 2 with FSDP2 over the four copies, overlapped steps, stages recomputing selectively
and fully (the ring redone in the backward), and CP 2
with EP 2 (the EP group over the CP ranks) on our bundled MoE: every step's loss, every
gradient and every final weight match `train_reference` at 1e-5, split (I/W) and full backward
mixed, clipping on. A checkpoint written at CP 2 resumes at CP 1 under another plan. Ranks hold
the cost model's `param_bytes` (CP divides no weight). One process group runs them all.
"""

from __future__ import annotations

import pytest
import torch
from executor_helpers import (
    PARALLEL_MBS,
    PARALLEL_SEQ,
    PARALLEL_STEPS,
    layer_count,
    one_f_one_b,
    recomputing_job,
    two_devices,
)
from executor_helpers import mixed_backward as mixed
from executor_helpers import parallel_job as job
from model_zoo import write_hf_config

from octopipe.costmodel import load_architecture
from octopipe.costmodel.build import build_profile
from octopipe.costmodel.hardware import hardware_preset
from octopipe.costmodel.settings import Settings
from octopipe.runtime.launch.launcher import launch
from octopipe.runtime.parallel.context import positions, shard
from octopipe.runtime.reference import mismatches, train_reference

STEPS, SEQ, MBS = PARALLEL_STEPS, PARALLEL_SEQ, PARALLEL_MBS
LLAMA, MOE = "tiny-llama", "tiny-moe"


def test_each_rank_holds_a_chunk_from_the_front_and_its_mirror_from_the_back():
    assert positions(16, 2, 0).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert positions(16, 2, 1).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    tokens = torch.arange(24).view(2, 12)
    parts = [shard(tokens, 3, r) for r in range(3)]
    assert parts[2].tolist() == [[4, 5, 6, 7], [16, 17, 18, 19]]
    assert sorted(torch.cat(parts, 1)[0].tolist()) == list(range(12))  # every token once


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return tmp_path_factory.mktemp("checkpoints")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, checkpoints):
    """Every plan of this file, run once in one process group: name -> (job, result)."""
    pytest.importorskip("transformers")
    llama = f"hf:{write_hf_config(tmp_path_factory.mktemp('hf'), 'llama')}"
    saving = {"checkpoint_dir": str(checkpoints), "checkpoint_every": 2}
    jobs = {
        "bundled llama, CP 2 x PP 2, saves step 2": job(LLAMA, two_devices(LLAMA), cp=2, **saving),
        "hf llama, CP 2 x PP 2": job(llama, two_devices(llama), cp=2),
        "bundled llama, CP 2 x TP 2 x PP 2": job(LLAMA, two_devices(LLAMA), tp=2, cp=2),
        "hf llama, CP 2 x TP 2 x PP 2": job(llama, two_devices(llama), tp=2, cp=2),
        "bundled llama, CP 2 x PP 2 x DP 2": job(LLAMA, two_devices(LLAMA), dp=2, cp=2),
        "bundled llama, CP 2 x PP 2, zero 1 over the CP ranks": job(
            LLAMA, two_devices(LLAMA), cp=2, zero=1
        ),
        "hf llama, CP 2 x PP 2 x DP 2, zero 3 over replicas and CP ranks": job(
            llama, two_devices(llama), dp=2, cp=2, zero=3
        ),
        "bundled llama, CP 2 x PP 2, overlapped steps": job(
            LLAMA, two_devices(LLAMA), cp=2, overlap_steps=True
        ),
        "hf llama, CP 2 x PP 2, stages recompute selective | full": recomputing_job(
            llama, (0, 1), ("selective", "full"), mixed, microbatches=2, cp=2
        ),
        "bundled moe, CP 2 x PP 2, EP 2 over the CP ranks": job(MOE, two_devices(MOE), cp=2, ep=2),
    }
    results = launch(list(jobs.values()), 8, "gloo", timeout_s=120)
    return dict(zip(jobs, zip(jobs.values(), results, strict=True), strict=True))


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_context_parallel_plans_train_as_one_process(runs):
    for name, (ran, result) in runs.items():
        reference = train_reference(ran.config, ran.plan.num_microbatches)
        assert len(result.losses) == STEPS, name
        assert mismatches(result, reference) == [], name


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_ranks_hold_the_cost_models_param_bytes_under_cp(runs):
    """CP divides the sequence, not the weights: each rank holds its layers' whole
    `param_bytes` at context_parallel 2 (TP 2: the cost model's TP split)."""
    for name in ("bundled llama, CP 2 x PP 2, saves step 2", "bundled llama, CP 2 x TP 2 x PP 2"):
        ran, result = runs[name]
        cfg, plan = ran.config, ran.plan
        settings = Settings(
            seq_len=SEQ,
            micro_batch_size=MBS,
            tensor_parallel=cfg.shape.tp,
            context_parallel=cfg.shape.cp,
            weight_bytes=4,
            grad_bytes=4,
            optimizer_bytes=4,
        )
        profile = build_profile(load_architecture(LLAMA), hardware_preset("h100"), settings, 2)
        per_device = [0] * plan.num_devices
        for st in plan.stages:
            per_device[st.device] += sum(x.param_bytes for x in profile.layers[st.start : st.end])
        expected = [
            per_device[d]
            for d in range(plan.num_devices)
            for _ in range(cfg.shape.cp * cfg.shape.tp)
        ]
        assert list(result.state_bytes[: cfg.shape.world_size]) == expected, name


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_context_parallel_checkpoint_resumes_at_cp1(runs, checkpoints):
    """Written at CP 2 x PP 2 (step 2), resumed at CP 1 on three devices to step 4: four steps
    of one process."""
    three = one_f_one_b(3, 2, layer_count(LLAMA))
    resumed = job(LLAMA, three, steps=4, checkpoint_dir=str(checkpoints), resume=True)
    (at_cp1,) = launch([resumed], 3, "gloo", timeout_s=120)
    straight = train_reference(job(LLAMA, three, steps=4).config, 2)
    saved = runs["bundled llama, CP 2 x PP 2, saves step 2"][1]
    assert saved.losses == pytest.approx(straight.losses[:2], rel=1e-5)
    assert at_cp1.first_step == 2
    assert mismatches(at_cp1, straight) == []
