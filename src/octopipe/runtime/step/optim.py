"""The update after each step: the optimizer, its learning-rate schedule and gradient clipping.

The same on every rank and in the single-process reference. The learning rate is a function of
the step alone (linear warm-up, then constant or cosine decay), so a resumed run needs only the
step to continue the schedule. Clipping is by the global norm over every stage of every replica:
each rank adds its stages' squared norms, one all-reduce over the world sums them (replicas hold
the same averaged gradients and tensor-parallel ranks the same replicated ones, so the sum is
divided by how many ranks hold each stage; shards count as many times), and every rank scales
its gradients by the same factor, as `torch.nn.utils.clip_grad_norm_` does in one process.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from octopipe.runtime.parallel.dtensors import local, shard_count

_CLASSES = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
OPTIMIZERS = tuple(_CLASSES)
DECAYS = ("constant", "cosine")


@dataclass(frozen=True)
class OptimizerConfig:
    """The update applied after each step; the same on every rank."""

    name: str = "sgd"  # one of OPTIMIZERS
    lr: float = 0.01  # the peak learning rate
    momentum: float = 0.0  # SGD only
    weight_decay: float = 0.0
    warmup_steps: int = 0  # linear warm-up from lr / (warmup_steps + 1) to lr
    decay: str = "constant"  # after warm-up: "constant", or "cosine" down to min_lr
    min_lr: float = 0.0
    total_steps: int = 1  # where the cosine reaches min_lr (the run's last step)
    clip_norm: float | None = None  # clip gradients to this global norm

    def __post_init__(self) -> None:
        if self.name not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {self.name!r}, expected one of {OPTIMIZERS}")
        if self.decay not in DECAYS:
            raise ValueError(f"unknown decay {self.decay!r}, expected one of {DECAYS}")

    def lr_at(self, step: int) -> float:
        """The learning rate of step `step` (0-based)."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / (self.warmup_steps + 1)
        if self.decay == "constant":
            return self.lr
        span = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        return self.min_lr + 0.5 * (self.lr - self.min_lr) * (1 + math.cos(math.pi * progress))

    def build(
        self,
        params: list[torch.nn.Parameter],
        shard_group: dist.ProcessGroup | None = None,
        expert_ids: frozenset[int] = frozenset(),
        expert_group: dist.ProcessGroup | None = None,
    ) -> torch.optim.Optimizer:
        """The optimizer of `params`; with `shard_group`, its state sharded across that group
        (ZeRO-1, `zero.ShardedOptimizer`: each rank updates its share, then every rank gets
        the new weights), routed experts' (`expert_ids`) across `expert_group`."""
        options = {"lr": self.lr, "weight_decay": self.weight_decay}
        if self.name == "sgd":
            options["momentum"] = self.momentum
        if shard_group is None:
            return _CLASSES[self.name](params, **options)
        from octopipe.runtime.step.zero import ShardedOptimizer

        dense = [p for p in params if id(p) not in expert_ids]
        routed = [p for p in params if id(p) in expert_ids]
        return ShardedOptimizer(  # type: ignore[return-value]
            [(dense, shard_group), (routed, expert_group)],
            lambda owned: _CLASSES[self.name](owned, **options),
        )


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def clip_factor(total_norm: float, max_norm: float) -> float:
    """What `clip_grad_norm_` multiplies the gradients by."""
    return min(1.0, max_norm / (total_norm + 1e-6))


def squared_norm(
    params: Sequence[torch.Tensor], device: torch.device | None = None
) -> torch.Tensor:
    """The sum of the gradients' squares, in float64, on `device` (default: the CPU). A
    sharded gradient adds its local part times the number of shards, so that summed over the
    S ranks holding a stage (replicas x tensor-parallel ranks) every element counts S times,
    sharded or not, and the world's sum divided by S is the norm's square."""
    total = torch.zeros((), dtype=torch.float64, device=device)
    for p in params:
        if p.grad is not None:
            grad = local(p.grad).detach().double()
            total = total + grad.pow(2).sum().to(total.device) * shard_count(p.grad)
    return total


def global_grad_norm(squares: torch.Tensor, stage_ranks: int) -> float:
    """The norm of all gradients of the model from each rank's `squared_norm` (on the device
    the backend reduces on: the GPU for NCCL), summed over the world (a collective; `squares`
    itself is left as it was); `stage_ranks` ranks hold each stage (replicas x
    tensor-parallel degree)."""
    total = squares.clone().reshape(1)
    dist.all_reduce(total)
    return math.sqrt(float(total) / stage_ranks)


def scale_grads(params: Sequence[torch.Tensor], factor: float) -> None:
    if factor < 1.0:
        for p in params:
            if p.grad is not None:
                p.grad.mul_(factor)
