"""The yardstick the executor is held to: single-process training and the comparison with it."""

import dataclasses

from executor_helpers import TOY

from octopipe.runtime.reference import mismatches, relative_difference, train_reference
from octopipe.runtime.session import RunResult
from octopipe.runtime.worker import OptimizerConfig

SGD = OptimizerConfig("sgd", lr=0.1)


def as_run_result(ref):
    return RunResult(
        ref.losses, (1.0,), None, (0,), "cpu_max_rss", ((),), dict(ref.params), dict(ref.grads)
    )


def test_reference_is_deterministic_and_learns():
    a = train_reference(TOY, 4, 3, 4, SGD)
    b = train_reference(TOY, 4, 3, 4, SGD)
    assert a.losses == b.losses
    assert mismatches(as_run_result(a), b) == []
    assert a.losses[-1] < a.losses[0]


def test_a_small_difference_in_any_tensor_or_loss_is_reported():
    ref = train_reference(TOY, 4, 2, 2, SGD)
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
