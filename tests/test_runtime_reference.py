"""The yardstick the executor is held to: single-process training and the comparison with it."""

import dataclasses

from executor_helpers import TOY

from octopipe.runtime.job.result import RunResult
from octopipe.runtime.job.run_config import RunConfig
from octopipe.runtime.reference import mismatches, relative_difference, train_reference
from octopipe.runtime.step.optim import OptimizerConfig

SGD = OptimizerConfig("sgd", lr=0.1)


def as_run_result(ref):
    return RunResult(
        ref.losses, (1.0,), None, (0,), "cpu_max_rss", ((),), dict(ref.params), dict(ref.grads)
    )


def test_reference_is_deterministic_and_learns():
    config = RunConfig(TOY, seed=4, steps=30, optimizer=SGD)
    a = train_reference(config, 3)
    b = train_reference(config, 3)
    assert a.losses == b.losses
    assert mismatches(as_run_result(a), b) == []
    assert max(a.losses[-5:]) < min(a.losses[:5])  # batches differ: compare ends, not steps


def test_a_small_difference_in_any_tensor_or_loss_is_reported():
    ref = train_reference(RunConfig(TOY, seed=4, steps=2, optimizer=SGD), 2)
    name = sorted(ref.params)[3]
    bumped = dict(ref.params)
    bumped[name] = bumped[name] * (1 + 1e-4)
    assert relative_difference(bumped[name], ref.params[name]) > 1e-5
    problems = mismatches(dataclasses.replace(as_run_result(ref), params=bumped), ref)
    assert problems == [f"param {name}: relative difference {1e-4:.2e}"]
    missing = dict(ref.grads)
    missing.pop(name)
    assert mismatches(dataclasses.replace(as_run_result(ref), grads=missing), ref)
    off_loss = (ref.losses[0] * (1 + 1e-4), *ref.losses[1:])
    assert mismatches(dataclasses.replace(as_run_result(ref), losses=off_loss), ref)
