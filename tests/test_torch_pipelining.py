"""Our schedule.csv under PyTorch's `_PipelineScheduleRuntime` trains like our executor does.

Two gloo processes on loopback. The same plans (a V-shaped split-backward plan, whose adjacent
stages share a rank, and an interleaved full-backward plan) run once through PyTorch's runtime
loaded from the CSV and once through our executor, in turn on the same processes: the losses of
every step and the gradients of the last step must agree. A PyTorch schedule class must also
refuse a plan whose placement is not the one that class assumes.
"""

from __future__ import annotations

from itertools import pairwise

import pytest
import torch

from octopipe.plan import make_plan
from octopipe.runtime.job.result import RunResult
from octopipe.runtime.job.run_config import Job, RunConfig
from octopipe.runtime.model.load import load_recipe
from octopipe.runtime.torch_pipelining import (
    CSV_RUNTIME,
    TorchJob,
    TorchResult,
    check_placement,
    launch_torch,
)
from octopipe.schedules import generate

pytestmark = pytest.mark.slow  # real process groups: the full suite, not `-m "not slow"`

MODEL = "tiny-gemma"  # embedding, four decoder layers, norm, a large-vocabulary head
MICROBATCHES = 4
STEPS = 2


def _plan(schedule: str):
    spec = generate(schedule, 2, MICROBATCHES)
    num_layers = len(load_recipe(MODEL).layers)
    cuts = [0, 2, 4, 5, num_layers]
    ranges = list(pairwise(cuts))
    return make_plan(2, MICROBATCHES, ranges, spec.placement, spec.orders)


@pytest.mark.timeout(180)
def test_csv_under_pytorch_runtime_matches_our_executor() -> None:
    plans = [_plan("zbv"), _plan("i1f1b")]
    jobs: list[TorchJob | Job] = []
    for p in plans:  # in turn on the same two processes, as the benchmark runs them
        jobs.append(TorchJob(p, CSV_RUNTIME, MODEL, steps=STEPS, collect_grads=True))
        jobs.append(Job(p, RunConfig(MODEL, steps=STEPS, collect_state=True)))
    results = launch_torch(jobs, 2)
    theirs, ours = results[0::2], results[1::2]
    assert all(isinstance(r, TorchResult) for r in theirs)
    assert all(isinstance(r, RunResult) for r in ours)
    for plan, t, o in zip(plans, theirs, ours, strict=True):
        assert len(t.losses) == STEPS
        assert t.losses == pytest.approx(o.losses, rel=1e-5)
        assert t.losses[1] != t.losses[0]  # the first update changed the weights
        assert set(t.grads) == set(o.grads) and len(t.grads) > 0
        for name, grad in o.grads.items():
            assert grad.abs().sum() > 0, name
            torch.testing.assert_close(
                t.grads[name], grad, rtol=1e-4, atol=1e-6, msg=f"{plan.placement}: {name}"
            )
        assert all(x > 0 for x in t.step_times)


def test_schedule_class_refuses_a_placement_it_does_not_use() -> None:
    check_placement(TorchJob(_plan("zbv"), "ScheduleZBVZeroBubble", MODEL))
    with pytest.raises(ValueError, match="places stages"):
        check_placement(TorchJob(_plan("i1f1b"), "ScheduleZBVZeroBubble", MODEL))
