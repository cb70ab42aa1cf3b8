"""Plain single-process training of a model: the ground truth the executor must match.

Same model, same seed, same data, same loss scaling (the mean over microbatches) and the same
optimizer as a pipelined run, with none of the pipeline: tests and the fuzzer compare against it.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from octopipe.runtime.data.batches import replica_batch
from octopipe.runtime.step.optim import clip_factor, scale_grads, set_lr, squared_norm

if TYPE_CHECKING:
    from octopipe.runtime.job.result import RunResult
    from octopipe.runtime.job.run_config import RunConfig


@dataclass(frozen=True)
class ReferenceResult:
    losses: tuple[float, ...]  # per step, mean over microbatches
    params: dict[str, torch.Tensor]  # after the last step
    grads: dict[str, torch.Tensor]  # of the last step
    grad_norms: tuple[float, ...] = ()  # per step, before clipping
    evaluations: tuple[tuple[int, float], ...] = ()  # (step, held-out loss) where one was due


def train_reference(config: RunConfig, num_microbatches: int) -> ReferenceResult:
    """Train `config`'s model as a plan of `num_microbatches` microbatches would, in this
    process: every global batch of the shape's DP x M microbatches at once, the loss their
    mean."""
    # Spawned ranks compute single-threaded; doing the same here keeps float reductions in the
    # same order, so differences left are the pipeline's own (Adam turns reduction noise in
    # near-zero gradients into visible parameter differences).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train(config, num_microbatches)
    finally:
        torch.set_num_threads(threads)


def _train(config: RunConfig, num_microbatches: int) -> ReferenceResult:
    recipe = config.recipe()
    model = recipe.whole(torch.device("cpu"), config.seed)
    if config.stepping.fp8:  # the blocks' linears in FP8, as each rank converts its stages
        from octopipe.runtime.model.fp8 import convert_to_fp8

        convert_to_fp8(model)
    loss_fn = config.loss or recipe.loss
    data = config.data_source(recipe)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = config.optimizer.build(params)
    count = config.shape.dp * num_microbatches * config.stepping.accumulation  # of one global batch
    losses, norms, evaluations = [], [], []
    for step in range(config.steps):
        batch = _microbatches(data, step, count, config.shape.microbatch_size)
        for p in params:
            p.grad = None
        step_losses = []
        for inputs, target in zip(batch.inputs, batch.targets, strict=True):
            with torch.autocast(
                "cpu", config.stepping.autocast_dtype, enabled=config.stepping.autocast is not None
            ):
                loss = loss_fn(model(*inputs), target)
            (loss / count).backward()
            step_losses.append(float(loss.detach()))
        norm = math.sqrt(float(squared_norm(params)))
        if config.optimizer.clip_norm is not None:
            scale_grads(params, clip_factor(norm, config.optimizer.clip_norm))
        set_lr(opt, config.optimizer.lr_at(step))
        opt.step()
        losses.append(statistics.fmean(step_losses))
        norms.append(norm)
        if config.evaluation.data is not None and _evaluates(config, step):
            evaluations.append((step, _held_out_loss(config, recipe, model, count, loss_fn)))
    named = dict(model.part.named_parameters())
    return ReferenceResult(
        tuple(losses),
        {k: p.detach().clone() for k, p in named.items()},
        {k: p.grad.detach().clone() for k, p in named.items() if p.grad is not None},
        tuple(norms),
        tuple(evaluations),
    )


def _microbatches(data, index: int, count: int, micro_batch_size: int):
    """Global batch `index` of `data` as `count` microbatches, in order."""
    sequences = data.global_batch(index, count * micro_batch_size)
    return replica_batch(sequences, 0, count, micro_batch_size)


def _evaluates(config: RunConfig, step: int) -> bool:
    done = step + 1
    return done == config.steps or (
        config.evaluation.every > 0 and done % config.evaluation.every == 0
    )


def _held_out_loss(config: RunConfig, recipe, model, count: int, loss_fn) -> float:
    """The mean loss over every microbatch of the held-out batches, forward only."""
    val = config.val_source(recipe)
    losses = []
    with torch.no_grad():
        for i in range(config.evaluation.batches):
            batch = _microbatches(val, i, count, config.shape.microbatch_size)
            for inputs, target in zip(batch.inputs, batch.targets, strict=True):
                with torch.autocast(
                    "cpu",
                    config.stepping.autocast_dtype,
                    enabled=config.stepping.autocast is not None,
                ):
                    losses.append(float(loss_fn(model(*inputs), target)))
    return statistics.fmean(losses)


def relative_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / max(||b||, tiny): the closeness measure the executor's tests use."""
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def mismatches(result: RunResult, reference: ReferenceResult, tol: float = 1e-5) -> list[str]:
    """Where a pipelined run (a `RunResult` collected with state) differs from the reference
    (from the run's first step: a resumed run has the reference's last losses)."""
    problems = []
    wanted = reference.losses[result.first_step :]
    for k, (got, want) in enumerate(zip(result.losses, wanted, strict=True), result.first_step):
        if abs(got - want) > tol * max(abs(want), 1e-30):
            problems.append(f"step {k} loss {got!r} != {want!r}")
    for kind, got_map, want_map in (
        ("param", result.params, reference.params),
        ("grad", result.grads, reference.grads),
    ):
        # A gradient of zeros stands for none: a replica averages in zeros for a parameter
        # (an expert) that only other replicas' tokens reached.
        got_map, want_map = _without_zeros(got_map), _without_zeros(want_map)
        if set(got_map) != set(want_map):
            problems.append(f"{kind}s differ in names: {sorted(set(got_map) ^ set(want_map))}")
        for name in sorted(set(got_map) & set(want_map)):
            diff = relative_difference(got_map[name], want_map[name])
            if diff > tol:
                problems.append(f"{kind} {name}: relative difference {diff:.2e}")
    return problems


def _without_zeros(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in tensors.items() if v.any()}
