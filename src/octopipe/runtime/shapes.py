"""What crosses each stage boundary: the shape and dtype of every tensor of an activation tuple.

Every rank derives these once, before training, by running the whole model on one sample
microbatch, on the meta device where every op allows (no memory, no arithmetic), else for real
without autograd; so the hot path posts receives into buffers of a known size and never exchanges
shapes. A stage's input gradients mirror the floating-point entries of its input activation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from octopipe.models.base import Activation, PipelineModel


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


def boundary_specs(
    model: PipelineModel, sample: Activation, starts: Iterable[int]
) -> dict[int, BoundarySpec]:
    """The spec of the activation entering layer `b`, for every `b` in `starts`.

    One forward pass without autograd over the layers before the last requested boundary.
    """
    wanted = sorted(set(starts))
    specs: dict[int, BoundarySpec] = {}
    x = sample
    done = 0
    with torch.no_grad():
        for b in wanted:
            x = model.forward_layers(done, b, x)
            done = b
            specs[b] = spec_of(x)
    return specs


def discover_boundary_specs(
    build_full: Callable[[], PipelineModel], sample: Activation, starts: Iterable[int]
) -> dict[int, BoundarySpec]:
    """`boundary_specs` of a freshly built full model: on meta if it can, else on the CPU."""
    starts = list(starts)
    try:
        with torch.device("meta"):
            model = build_full()
        return boundary_specs(model, tuple(t.to("meta") for t in sample), starts)
    except Exception:  # noqa: BLE001 - data-dependent ops (MoE routing) have no meta kernel
        return boundary_specs(build_full(), sample, starts)
