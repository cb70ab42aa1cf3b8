"""One pipeline stage's compute: forward, full backward, and split backward (I then W).

A stage keeps, per microbatch in flight, the autograd graph from its inputs to its outputs (or
to the loss on the last stage). Full backward (B) runs the graph once. Split backward: I computes
only the input gradients and keeps the graph; W later computes the weight gradients, entering
the graph where they branch off the input path (`weightgrad`), or, for graphs that cannot be
split so (weights shared inside a stage), from the outputs again. Weight gradients accumulate
into `.grad` as ordinary training does. No communication here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from octopipe.models.base import Activation, PipelineModel
from octopipe.runtime.weightgrad import DeferredWeightGrad, plan_deferral


@dataclass
class _InFlight:
    """What one microbatch leaves on the stage between its F and its last backward action."""

    inputs: Activation
    roots: list[torch.Tensor]  # outputs that need a gradient (the scaled loss on the last stage)
    output_mask: list[bool] = field(default_factory=list)  # which float outputs are roots
    root_grads: list[torch.Tensor | None] | None = None  # set by I, used by W
    deferred: DeferredWeightGrad | None = None  # set by I when W can skip the input path


def as_leaves(tensors: Sequence[torch.Tensor]) -> Activation:
    """Cut the graph at a stage boundary: floating-point entries become leaves needing grad."""
    return tuple(t.detach().requires_grad_(t.is_floating_point()) for t in tensors)


class StageCompute:
    """Layers `[start, end)` of `model`; `loss_scale` divides the last stage's loss."""

    def __init__(
        self, model: PipelineModel, start: int, end: int, is_last: bool, loss_scale: float
    ) -> None:
        self.model, self.start, self.end = model, start, end
        self.is_last, self.loss_scale = is_last, loss_scale
        self.params = [
            p for i in range(start, end) for p in model.layer(i).parameters() if p.requires_grad
        ]
        self._flight: dict[int, _InFlight] = {}

    @property
    def modules(self) -> list[nn.Module]:
        return [self.model.layer(i) for i in range(self.start, self.end)]

    def forward(
        self, mb: int, inputs: Activation, target: torch.Tensor | None
    ) -> tuple[Activation, float | None]:
        """Run the layers; return the outputs (graph attached) and, on the last stage, the loss."""
        outputs = self.model.forward_layers(self.start, self.end, inputs)
        if self.is_last:
            loss = self.model.loss(outputs, target)
            self._flight[mb] = _InFlight(inputs, [loss / self.loss_scale])
            return outputs, float(loss.detach())
        floats = [t for t in outputs if t.is_floating_point()]
        mask = [t.requires_grad for t in floats]
        self._flight[mb] = _InFlight(inputs, [t for t, m in zip(floats, mask) if m], mask)
        return outputs, None

    def backward(self, mb: int, output_grads: Sequence[torch.Tensor] | None) -> list[torch.Tensor]:
        """Full backward: weight gradients accumulate; returns the input gradients."""
        flight = self._flight.pop(mb)
        grads = self._root_grads(flight, output_grads)
        wanted = self._grad_inputs(flight)
        if flight.roots:
            torch.autograd.backward(flight.roots, grads, inputs=self.params + wanted or None)
        return [self._zero_if_none(x.grad, x) for x in wanted]

    def backward_input(
        self, mb: int, output_grads: Sequence[torch.Tensor] | None
    ) -> list[torch.Tensor]:
        """I: the input gradients only; the graph stays for `backward_weight`."""
        flight = self._flight[mb]
        flight.root_grads = self._root_grads(flight, output_grads)
        wanted = self._grad_inputs(flight)
        if not flight.roots:
            return [torch.zeros_like(x) for x in wanted]
        flight.deferred = plan_deferral(flight.roots, flight.root_grads, wanted, self.params)
        if flight.deferred is not None:
            got = flight.deferred.backward_input(flight.roots, flight.root_grads, wanted)
            flight.roots, flight.root_grads = [], None  # the deferral holds what W needs
        elif wanted:
            got = torch.autograd.grad(
                flight.roots, wanted, flight.root_grads, retain_graph=True, allow_unused=True
            )
        else:
            got = ()
        flight.inputs = ()  # their gradients are out
        return [self._zero_if_none(g, x) for g, x in zip(got, wanted)]

    def backward_weight(self, mb: int) -> None:
        """W: the weight gradients of a microbatch whose I has run; frees its graph."""
        flight = self._flight.pop(mb)
        if flight.deferred is not None:
            got = flight.deferred.backward_weight()
        elif flight.roots and self.params:
            got = torch.autograd.grad(
                flight.roots, self.params, flight.root_grads, allow_unused=True
            )
        else:
            return
        for p, g in zip(self.params, got):
            if g is not None:
                p.grad = g if p.grad is None else p.grad.add_(g)

    def in_flight(self) -> int:
        return len(self._flight)

    def _grad_inputs(self, flight: _InFlight) -> list[torch.Tensor]:
        return [x for x in flight.inputs if x.requires_grad]

    def _root_grads(
        self, flight: _InFlight, output_grads: Sequence[torch.Tensor] | None
    ) -> list[torch.Tensor | None]:
        if self.is_last:
            return [None]
        assert output_grads is not None
        return [g for g, m in zip(output_grads, flight.output_mask, strict=True) if m]

    @staticmethod
    def _zero_if_none(grad: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(like) if grad is None else grad
