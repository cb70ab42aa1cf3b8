"""What crosses each stage boundary: the shape and dtype of every tensor of an activation tuple.

Ranks learn these once, before training, stage by stage from the stages' owners (each runs
its stage once on the input's spec), so the hot path posts receives into buffers of a known
size and never exchanges shapes. A stage's input gradients mirror the floating-point entries of
its input activation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from octopipe.runtime.model.recipe import Activation
from octopipe.runtime.parallel.dtensors import local


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def carries_grad(self) -> bool:
        """Only floating-point entries take part in autograd and send a gradient back."""
        return self.dtype.is_floating_point

    def empty(self, device: torch.device) -> torch.Tensor:
        return torch.empty(self.shape, dtype=self.dtype, device=device)

    def matches(self, tensor: torch.Tensor) -> bool:
        return tuple(tensor.shape) == self.shape and tensor.dtype == self.dtype


BoundarySpec = tuple[TensorSpec, ...]


def spec_of(activation: Activation) -> BoundarySpec:
    return tuple(TensorSpec(tuple(t.shape), t.dtype) for t in activation)


def grad_specs(boundary: BoundarySpec) -> BoundarySpec:
    return tuple(s for s in boundary if s.carries_grad)


def stand_in(specs: BoundarySpec, device: torch.device) -> Activation:
    """Tensors of the given specs: fixed random floats, zero integers (valid token ids)."""
    gen = torch.Generator().manual_seed(0)
    return tuple(
        torch.randn(s.shape, generator=gen).to(device, s.dtype)
        if s.dtype.is_floating_point
        else torch.zeros(s.shape, dtype=s.dtype, device=device)
        for s in specs
    )


def exchange_boundary_specs(
    owners: Sequence[int],
    stages: dict[int, Callable[..., Activation]],
    sample: Activation,
    device: torch.device,
    tp: int = 1,
    tp_rank: int = 0,
    autocast: torch.dtype | None = None,
) -> list[BoundarySpec]:
    """What enters every stage (index s) and what leaves the last (index S), on every rank.

    Stage by stage, every rank holding it in `stages` runs it once without autograd on the
    spec of its input (the sample microbatch for stage 0), and its owner (global rank
    `owners[s]`) broadcasts what came out. Nobody builds more than its own stages. Under
    tensor parallelism the owner is a group of `tp` consecutive ranks from `owners[s]`, whose
    runs communicate; each broadcasts the spec of its own shard, and every rank keeps the one
    of its `tp_rank`. `autocast`: the dtype the steps' forwards autocast to (what crosses a
    boundary is in it).
    """
    specs = [spec_of(sample)]
    for s, owner in enumerate(owners):
        found: list[BoundarySpec | None] = [None]
        if s in stages:
            inputs = tuple(t.to(device) for t in sample) if s == 0 else stand_in(specs[s], device)
            casting = torch.autocast(device.type, dtype=autocast, enabled=autocast is not None)
            with torch.no_grad(), casting:
                found = [spec_of(tuple(local(t) for t in stages[s](*inputs)))]
        kept = None
        for t in range(tp):
            shard = list(found)
            dist.broadcast_object_list(shard, src=owner + t)
            if t == tp_rank:
                kept = shard[0]
        specs.append(kept)
    return specs
