"""Plain single-process training of a PipelineModel: the ground truth the executor must match.

Same model, same seed, same data, same loss scaling (the mean over microbatches) and the same
optimizer as a pipelined run, with none of the pipeline: tests and the fuzzer compare against it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from octopipe.runtime.model_source import build_pipeline_model
from octopipe.runtime.worker import OptimizerConfig

if TYPE_CHECKING:
    from octopipe.runtime.session import RunResult


@dataclass(frozen=True)
class ReferenceResult:
    losses: tuple[float, ...]  # per step, mean over microbatches
    params: dict[str, torch.Tensor]  # after the last step
    grads: dict[str, torch.Tensor]  # of the last step


def train_reference(
    model_spec: str, seed: int, num_microbatches: int, steps: int, optimizer: OptimizerConfig
) -> ReferenceResult:
    # Spawned ranks compute single-threaded; doing the same here keeps float reductions in the
    # same order, so differences left are the pipeline's own (Adam turns reduction noise in
    # near-zero gradients into visible parameter differences).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train(model_spec, seed, num_microbatches, steps, optimizer)
    finally:
        torch.set_num_threads(threads)


def _train(
    model_spec: str, seed: int, num_microbatches: int, steps: int, optimizer: OptimizerConfig
) -> ReferenceResult:
    model = build_pipeline_model(model_spec, seed)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = optimizer.build(params)
    losses = []
    for step in range(steps):
        batch = model.make_batch(num_microbatches, seed, step)
        for p in params:
            p.grad = None
        step_losses = []
        for inputs, target in zip(batch.inputs, batch.targets, strict=True):
            loss = model.loss(model(*inputs), target)
            (loss / num_microbatches).backward()
            step_losses.append(float(loss.detach()))
        opt.step()
        losses.append(statistics.fmean(step_losses))
    named = dict(model.named_parameters())
    return ReferenceResult(
        tuple(losses),
        {k: p.detach().clone() for k, p in named.items()},
        {k: p.grad.detach().clone() for k, p in named.items() if p.grad is not None},
    )


def relative_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / max(||b||, tiny): the closeness measure the executor's tests use."""
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def mismatches(result: RunResult, reference: ReferenceResult, tol: float = 1e-5) -> list[str]:
    """Where a pipelined run (a `RunResult` collected with state) differs from the reference."""
    problems = []
    for k, (got, want) in enumerate(zip(result.losses, reference.losses, strict=True)):
        if abs(got - want) > tol * max(abs(want), 1e-30):
            problems.append(f"step {k} loss {got!r} != {want!r}")
    for kind, got_map, want_map in (
        ("param", result.params, reference.params),
        ("grad", result.grads, reference.grads),
    ):
        if set(got_map) != set(want_map):
            problems.append(f"{kind}s differ in names: {sorted(set(got_map) ^ set(want_map))}")
        for name in sorted(set(got_map) & set(want_map)):
            diff = relative_difference(got_map[name], want_map[name])
            if diff > tol:
                problems.append(f"{kind} {name}: relative difference {diff:.2e}")
    return problems
