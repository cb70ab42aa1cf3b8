"""Plans whose stages recompute, trained on real gloo process groups: the losses, gradients and
weights of single-process training without recomputation, under split and full backwards,
interleaving, tensor parallelism and FSDP2."""

import pytest
from executor_helpers import recomputing_job

from octopipe.actions import B, I
from octopipe.runtime.launch.launcher import launch
from octopipe.runtime.reference import mismatches, train_reference

pytestmark = pytest.mark.slow  # real process groups: the full suite, not `-m "not slow"`

STEPS = 2


def mixed(stage: int, mb: int) -> str:
    return I if (stage + mb) % 2 else B


def recomputing(model, placement, kinds, backward=mixed, **options):
    return recomputing_job(model, placement, kinds, backward, steps=STEPS, **options)


JOBS = {
    "llama, interleaved, split backward": recomputing(
        "tiny-llama", (0, 1, 0, 1), ("full", "selective", "full", "none"), lambda s, m: I
    ),
    "hybrid, 1F1B, B and I/W mixed": recomputing("tiny-hybrid", (0, 1), ("full", "full")),
    "vlm, V-shape": recomputing("tiny-vlm", (0, 1, 1, 0), ("selective", "full", "none", "full")),
    "llama, TP2 x PP2": recomputing("tiny-llama", (0, 1), ("full", "selective"), tp=2),
    "llama, PP2 x DP2, zero 3": recomputing(
        "tiny-llama", (0, 1), ("selective", "full"), lambda s, m: I, dp=2, zero=3
    ),
}


@pytest.fixture(scope="module")
def results():
    return dict(zip(JOBS, launch(list(JOBS.values()), 4, "gloo", timeout_s=120)))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", JOBS)
def test_recomputing_stages_train_as_one_process_without_recomputation(name, results):
    job, result = JOBS[name], results[name]
    assert job.plan.recompute  # the plan recomputes: the reference never does
    reference = train_reference(job.config, job.plan.num_microbatches)
    assert len(result.losses) == STEPS
    assert mismatches(result, reference, tol=1e-5) == []
