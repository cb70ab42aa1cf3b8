"""`--global-batch`: a step of several passes of the plan, gradients accumulated, trains as one
process does on the whole global batch (losses, gradients and weights at 1e-5)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from executor_helpers import greedy, layer_count

from octopipe.actions import B, I
from octopipe.config import JobConfig
from octopipe.config.sources import from_keywords
from octopipe.errors import InputError
from octopipe.runtime.launch.launcher import launch
from octopipe.runtime.reference import mismatches, train_reference
from octopipe.training import runtime_config

MODEL = "tiny-llama"


def _job(placement, passes, dp=1, tp=1, backward=lambda s, m: B, **keywords):
    from octopipe.runtime.job.run_config import Job

    plan = greedy(placement, 2, 2, backward=backward, num_layers=layer_count(MODEL))
    one_pass = dp * plan.num_microbatches * 2
    settings = from_keywords(
        JobConfig(),
        steps=3,
        optimizer="sgd",
        lr=0.05,
        momentum=0.9,
        seq_len=8,
        micro_batch_size=2,
        global_batch=passes * one_pass,
        dp=dp,
        tp=tp,
        **keywords,
    )
    config = runtime_config(settings, plan, MODEL)
    assert config.stepping.accumulation == passes
    return Job(plan, replace(config, collect_state=True))


def test_the_global_batch_is_a_multiple_of_one_pass():
    plan = greedy([0, 1], 2, 2, num_layers=layer_count(MODEL))
    settings = from_keywords(JobConfig(), micro_batch_size=2, global_batch=6)
    with pytest.raises(InputError, match="6 sequences are not a multiple of one pass"):
        runtime_config(settings, plan, MODEL)
    one_pass = from_keywords(JobConfig(), micro_batch_size=2, global_batch=4)
    assert runtime_config(one_pass, plan, MODEL).stepping.accumulation == 1
    assert runtime_config(JobConfig(), plan, MODEL).stepping.accumulation == 1
    fsdp = from_keywords(JobConfig(), micro_batch_size=2, global_batch=8, dp=1, zero=3)
    with pytest.raises(InputError, match="not supported with --zero 3"):
        runtime_config(fsdp, plan, MODEL)


JOBS = {
    "PP 2, 3 passes": _job([0, 1], 3),
    "interleaved, split backward, 2 passes": _job([0, 1, 0, 1], 2, backward=lambda s, m: I),
    "PP 2 x DP 2, ZeRO-1, 2 passes": _job([0, 1], 2, dp=2, zero=1),
    "TP 2 x PP 2, 2 passes": _job([0, 1], 2, tp=2),
}


@pytest.fixture(scope="module")
def results():
    return dict(zip(JOBS, launch(list(JOBS.values()), 4, "gloo", timeout_s=120)))


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", JOBS)
def test_accumulated_passes_train_as_one_process(name, results):
    job, result = JOBS[name], results[name]
    reference = train_reference(job.config, job.plan.num_microbatches)
    assert len(result.losses) == 3
    assert mismatches(result, reference, tol=1e-5) == []
    # The reference saw the whole global batch: a run of one pass would differ from it.
    one_pass = train_reference(
        replace(job.config, stepping=replace(job.config.stepping, accumulation=1)),
        job.plan.num_microbatches,
    )
    assert mismatches(result, one_pass, tol=1e-5) != []
