"""Tensor parallelism and FSDP2 in the executor equal single-process training.

Every plan runs on real gloo process groups, TP 2 x PP 2 and TP 2 x PP 2 x DP 2 (8 ranks), on
our bundled Llama and MoE models and on Hugging Face Llama and Qwen2-MoE configs (random
weights): the loss of every step, every parameter's last gradient and every parameter after
the run match `train_reference` at 1e-5 (fp32), split backward (I/W) and full backward mixed,
with and without `--zero 3`, and a model's own `tp_plan`. The weights, gradients and optimizer
state each rank holds are the analytic cost model's `param_bytes` of its layers (divided by the
replicas under `--zero 3`).
One process group runs every plan.
"""

from __future__ import annotations

import pytest
from executor_helpers import greedy, layer_count, one_f_one_b, run_config
from model_zoo import tp_titan_style, write_hf_config

from octopipe.actions import B, I
from octopipe.costmodel import load_architecture
from octopipe.costmodel.build import build_profile
from octopipe.costmodel.hardware import hardware_preset
from octopipe.costmodel.settings import Settings
from octopipe.runtime.job.run_config import Job
from octopipe.runtime.launch.launcher import launch
from octopipe.runtime.reference import mismatches, train_reference
from octopipe.runtime.step.optim import OptimizerConfig

pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # real process groups: the full suite, not `-m "not slow"`

STEPS, SEQ, MBS = 2, 8, 2
SGD = OptimizerConfig("sgd", lr=0.05, momentum=0.9)
CLIPPED = OptimizerConfig("sgd", lr=0.05, momentum=0.9, clip_norm=0.5)  # acts on these steps
LLAMA, MOE = "tiny-llama", "tiny-moe"


def mixed(stage: int, mb: int) -> str:
    return I if (stage + mb) % 2 else B


def split(_stage: int, _mb: int) -> str:
    return I


def job(model: str, plan, tp: int, dp: int = 1, optimizer=SGD, zero: int = 0, **options) -> Job:
    config = run_config(
        model,
        MBS,
        steps=options.pop("steps", STEPS),
        optimizer=optimizer,
        collect_state=True,
        seq_len=SEQ,
        tp=tp,
        dp=dp,
        zero=zero,
        **options,
    )
    return Job(plan, config)


def two_devices(model: str, backward=mixed, placement=(0, 1), microbatches: int = 2):
    return greedy(
        list(placement), microbatches, 2, backward=backward, num_layers=layer_count(model)
    )


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return tmp_path_factory.mktemp("checkpoints")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, checkpoints):
    """Every plan of this file, run once in one process group: name -> (job, result)."""
    root = tmp_path_factory.mktemp("hf")
    hf = {kind: f"hf:{write_hf_config(root / kind, kind)}" for kind in ("llama", "qwen2_moe")}
    jobs = {
        "bundled llama, TP2 x PP2, interleaved, saves step 2": job(
            LLAMA,
            two_devices(LLAMA, placement=(0, 1, 0, 1), microbatches=4),
            tp=2,
            checkpoint_dir=str(checkpoints),
            checkpoint_every=2,
        ),
        "hf llama, TP2 x PP2, 1F1B": job(
            hf["llama"], one_f_one_b(2, 4, layer_count(hf["llama"])), tp=2
        ),
        "bundled moe, TP2 x PP2 x DP2, clipping": job(
            MOE, two_devices(MOE), tp=2, dp=2, optimizer=CLIPPED
        ),
        "hf qwen2-moe, TP2 x PP2 x DP2, zero 3": job(
            hf["qwen2_moe"], two_devices(hf["qwen2_moe"]), tp=2, dp=2, zero=3
        ),
        "bundled llama, TP2 x PP2 x DP2, zero 3, clipping": job(
            LLAMA, two_devices(LLAMA, split), tp=2, dp=2, optimizer=CLIPPED, zero=3
        ),
        "bundled llama, PP2 x DP2, interleaved, zero 3": job(
            LLAMA, two_devices(LLAMA, split, placement=(0, 1, 0, 1)), tp=1, dp=2, zero=3
        ),
        "a user's own tp_plan, TP2 x PP2": job(
            tp_titan_style, two_devices(tp_titan_style, split), tp=2
        ),
    }
    results = launch(list(jobs.values()), 8, "gloo", timeout_s=120)
    return dict(zip(jobs, zip(jobs.values(), results)))


def test_tensor_parallel_and_zero3_plans_train_as_one_process(runs):
    for name, (ran, result) in runs.items():
        reference = train_reference(ran.config, ran.plan.num_microbatches)
        assert len(result.losses) == STEPS, name
        assert result.params.keys() == reference.params.keys(), name
        assert mismatches(result, reference) == [], name
    # Clipping acts in the clipped runs (else they would not test the sharded norm).
    clipped = runs["bundled moe, TP2 x PP2 x DP2, clipping"][0].config
    unclipped = job(MOE, two_devices(MOE), tp=1, dp=2).config
    assert train_reference(clipped, 2).losses[1] != train_reference(unclipped, 2).losses[1]


def analytic_state_bytes(model: str, plan, tp: int, dp: int, zero: int) -> list[int]:
    """Per rank, in rank order: the cost model's `param_bytes` of the rank's layers (fp32
    weights and gradients, SGD's momentum: 12 bytes per parameter), 1/dp of it under FSDP2."""
    settings = Settings(
        seq_len=SEQ,
        micro_batch_size=MBS,
        tensor_parallel=tp,
        weight_bytes=4,
        grad_bytes=4,
        optimizer_bytes=4,
    )
    arch = load_architecture(model)
    profile = build_profile(arch, hardware_preset("h100"), settings, plan.num_devices)
    per_device = [0] * plan.num_devices
    for stage in plan.stages:
        held = profile.layers[stage.start : stage.end]
        per_device[stage.device] += sum(layer.param_bytes for layer in held)
    share = dp if zero == 3 else 1
    devices = range(plan.num_devices)
    return [per_device[d] // share for _ in range(dp) for d in devices for _ in range(tp)]


def test_ranks_hold_the_cost_models_share_of_weights_gradients_and_state(runs):
    """TP splits what the cost model splits (heads, MLP and expert widths, the vocabulary) and
    keeps what it keeps (norms, the router); FSDP2 divides the rest by the replicas."""
    for name, model in (
        ("bundled moe, TP2 x PP2 x DP2, clipping", MOE),
        ("bundled llama, TP2 x PP2 x DP2, zero 3, clipping", LLAMA),
        ("bundled llama, PP2 x DP2, interleaved, zero 3", LLAMA),
    ):
        ran, result = runs[name]
        cfg, plan = ran.config, ran.plan
        expected = analytic_state_bytes(model, plan, cfg.shape.tp, cfg.shape.dp, cfg.shape.zero)
        assert list(result.state_bytes[: cfg.shape.world_size]) == expected, name


def test_a_tensor_parallel_checkpoint_resumes_at_tp1_under_another_plan_and_back(runs, checkpoints):
    """Written at TP 2 x PP 2 (step 2), resumed at TP 1 on three devices (to step 4, saving
    there as any run does), and that one resumed at TP 2 x DP 2 with FSDP2 on one device (to
    step 6): the losses, weights and gradients of six steps in one process. Every run's step
    is one global batch of 4 microbatches (D x M)."""
    three = one_f_one_b(3, 4, layer_count(LLAMA))
    where = {"checkpoint_dir": str(checkpoints), "resume": True}
    tp1 = job(LLAMA, three, tp=1, steps=4, checkpoint_every=2, **where)
    zero3 = job(LLAMA, one_f_one_b(1, 2, layer_count(LLAMA)), tp=2, dp=2, zero=3, steps=6, **where)
    # One process group, the jobs in order: the second resumes what the first saved.
    at_tp1, at_zero3 = launch([tp1, zero3], 4, "gloo", timeout_s=120)
    straight = train_reference(job(LLAMA, three, tp=1, steps=6).config, 4)
    assert sorted(p.name for p in checkpoints.iterdir() if not p.name.startswith(".")) == [
        "step-2",
        "step-4",
    ]
    saved = runs["bundled llama, TP2 x PP2, interleaved, saves step 2"][1]
    assert saved.losses == pytest.approx(straight.losses[:2], rel=1e-5)
    assert (at_tp1.first_step, at_zero3.first_step) == (2, 4)
    assert at_tp1.losses == pytest.approx(straight.losses[2:4], rel=1e-5)
    assert mismatches(at_zero3, straight) == []  # steps 5 and 6, weights and last gradients
