"""`octopipe run --overlap-steps`: steps back to back, each stage updated after its last
backward, clipping and the non-finite check by post-validation; the results of a synchronous run.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from executor_helpers import TOY, TOY_LAYERS, ToyModel, _Swap, greedy, one_f_one_b

from octopipe.actions import B, I
from octopipe.random_plans import random_plan
from octopipe.runtime.job.run_config import Job, RunConfig, Stepping
from octopipe.runtime.launch.launcher import RankFailure, launch
from octopipe.runtime.reference import mismatches, train_reference
from octopipe.runtime.step.optim import OptimizerConfig

pytestmark = pytest.mark.slow  # real process groups

STEPS = 4
ADAM = OptimizerConfig("adam", lr=0.01)


def plans():
    mixed = greedy([0, 1, 2, 0, 1, 2], 4, 3, backward=lambda s, m: I if (s + m) % 2 else B)
    return [one_f_one_b(3, 4), mixed]


def overlapped(optimizer=ADAM, model=TOY) -> RunConfig:
    return RunConfig(
        model,
        steps=STEPS,
        optimizer=optimizer,
        collect_state=True,
        stepping=Stepping(overlap_steps=True),
    )


@pytest.mark.timeout(300)
@pytest.mark.parametrize("clip_norm", [1e6, 0.05], ids=["clipping never acts", "clipping acts"])
def test_overlapped_steps_give_the_synchronous_results(clip_norm):
    optimizer = dataclasses.replace(ADAM, clip_norm=clip_norm)
    config = overlapped(optimizer)
    synchronous = dataclasses.replace(config, stepping=Stepping())
    jobs = [Job(p, c) for p in plans() for c in (config, synchronous)]
    results = launch(jobs, 3, "gloo", timeout_s=60)
    for (job, result), (_, sync) in zip(
        zip(jobs[::2], results[::2]), zip(jobs[1::2], results[1::2])
    ):
        assert result.losses == pytest.approx(sync.losses, rel=1e-6)
        assert mismatches(result, train_reference(config, job.plan.num_microbatches)) == []
        # Clipping that acts fails validation every step: each one is applied again clipped.
        assert (result.redone_steps > 0) == (clip_norm < 1)


class _PoisonOnce(_Swap):
    """The toy's weightless layer, but it turns the gradient through it into NaN once, in its
    process's 6th forward (step 1 of a 4-microbatch plan): a fault a rerun does not repeat."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0  # each run builds its own copy

    def forward(self, h, skip, ids):
        self.calls += 1
        if self.calls == 6 and torch.is_grad_enabled():
            h = h + 0.0
            h.register_hook(lambda g: torch.full_like(g, float("nan")))
        return super().forward(h, skip, ids)


def poisoned_toy() -> ToyModel:
    model = ToyModel()
    model.layers.add_module("2", _PoisonOnce())  # same FQN, same maths
    return model


@pytest.mark.timeout(300)
def test_a_non_finite_gradient_is_caught_and_its_step_run_again():
    plan = one_f_one_b(3, 4)
    poisoned = overlapped(model="test_overlap_executor:poisoned_toy")
    synchronous = dataclasses.replace(poisoned, stepping=Stepping())
    (result,) = launch([Job(plan, poisoned)], 3)
    assert result.redone_steps == 1
    assert mismatches(result, train_reference(overlapped(), 4)) == []  # as if no fault
    with pytest.raises(RankFailure, match="the loss became nan at step 3"):  # the fault is real
        launch([Job(plan, synchronous)], 3)


@pytest.mark.timeout(300)
def test_random_plans_never_deadlock_with_steps_overlapping():
    rng = random.Random(404)
    jobs = [
        Job(random_plan(rng, TOY_LAYERS, 3, rng.randint(1, 5), 6, rng.random()), overlapped())
        for _ in range(8)
    ]
    for job, result in zip(jobs, launch(jobs, 3, "gloo", timeout_s=60)):
        assert mismatches(result, train_reference(job.config, job.plan.num_microbatches)) == []


class _PoisonAlways(_PoisonOnce):
    """NaN gradients from the 6th forward on: a rerun does not help."""

    def forward(self, h, skip, ids):
        self.calls += 1
        if self.calls >= 6 and torch.is_grad_enabled():
            h = h + 0.0
            h.register_hook(lambda g: torch.full_like(g, float("nan")))
        return _Swap.forward(self, h, skip, ids)


def always_poisoned_toy() -> ToyModel:
    model = ToyModel()
    model.layers.add_module("2", _PoisonAlways())
    return model


@pytest.mark.timeout(300)
def test_gradients_non_finite_again_after_a_rerun_stop_the_run_naming_the_step():
    # 4 microbatches a step: the 6th forward is the second step (steps count from 1)
    config = overlapped(model="test_overlap_executor:always_poisoned_toy")
    with pytest.raises(RankFailure, match="step 2: the gradients are not finite, again"):
        launch([Job(one_f_one_b(3, 4), config)], 3, "gloo", timeout_s=60)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("clip_norm", [1e6, 0.05], ids=["clipping never acts", "clipping acts"])
def test_overlapped_steps_with_data_parallel_replicas_give_the_synchronous_results(clip_norm):
    """Each stage is averaged over the replicas, then updated."""
    config = overlapped(dataclasses.replace(ADAM, clip_norm=clip_norm))
    config = dataclasses.replace(config, shape=dataclasses.replace(config.shape, dp=2))
    plan = greedy([0, 1, 0, 1], 2, 2, backward=lambda s, m: I if (s + m) % 2 else B)
    (result,) = launch([Job(plan, config)], 4, "gloo", timeout_s=60)
    assert (result.redone_steps > 0) == (clip_norm < 1)
    assert mismatches(result, train_reference(config, plan.num_microbatches)) == []
