"""ZeRO-3 (FSDP2) over tensor-parallel stages: no "returned a view tensor" warning, and the
losses, last gradients and weights still match one process.

A stage whose last layer's output is a tensor-parallel module's local shard returns a view
(`DTensor.to_local()`): our Llama's stage ending on its final norm, a Hugging Face Llama's
stage holding only its embedding. FSDP2 warned of it on every rank holding such a stage
(`runtime/parallel/fsdp.py` says why the warning does not apply there). TP 2 x PP 2 x DP 2 on
8 gloo ranks, one process group for both plans.
"""

from __future__ import annotations

import pytest
from executor_helpers import layer_count, one_f_one_b, run_config
from model_zoo import write_hf_config

from octopipe.plan import make_plan
from octopipe.runtime.job.run_config import Job
from octopipe.runtime.launch.launcher import launch
from octopipe.runtime.reference import mismatches, train_reference
from octopipe.runtime.step.optim import OptimizerConfig

pytestmark = pytest.mark.slow  # real process groups: the full suite, not `-m "not slow"`

STEPS, SEQ, MBS, MICROBATCHES = 2, 8, 2, 2


def split_after(model: str, first_stage_layers: int):
    """1F1B on two devices, the first stage holding the model's first layers."""
    n = layer_count(model)
    orders = one_f_one_b(2, MICROBATCHES, n).schedule
    ranges = [(0, first_stage_layers), (first_stage_layers, n)]
    return make_plan(2, MICROBATCHES, ranges, [0, 1], {d: list(orders[d]) for d in (0, 1)})


def zero3_job(model: str, plan) -> Job:
    config = run_config(
        model,
        MBS,
        steps=STEPS,
        optimizer=OptimizerConfig("sgd", lr=0.05, momentum=0.9),
        collect_state=True,
        seq_len=SEQ,
        tp=2,
        dp=2,
        zero=3,
    )
    return Job(plan, config)


@pytest.mark.timeout(300)
def test_zero3_over_tensor_parallel_views_warns_nothing_and_trains_as_one_process(tmp_path, capfd):
    pytest.importorskip("transformers")
    hf = f"hf:{write_hf_config(tmp_path / 'llama', 'llama')}"
    jobs = {
        "tiny-llama, stage 0 ends on the final norm": zero3_job(
            "tiny-llama", split_after("tiny-llama", layer_count("tiny-llama") - 1)
        ),
        "hf llama, stage 0 is the embedding": zero3_job(hf, split_after(hf, 1)),
    }
    results = launch(list(jobs.values()), 8, "gloo", timeout_s=120)
    said = capfd.readouterr().err
    assert "returned a view tensor" not in said
    for (name, ran), result in zip(jobs.items(), results):
        reference = train_reference(ran.config, ran.plan.num_microbatches)
        assert len(result.losses) == STEPS, name
        assert result.losses == pytest.approx(reference.losses, rel=1e-5), name
        assert mismatches(result, reference) == [], name
