"""One pipeline stage's compute: forward, full backward, and split backward (I then W).

A stage is a `StageModule` (its layers of the model, `octopipe.runtime.model.recipe`) and keeps, per
microbatch in flight, the autograd graph from its inputs to its outputs (or
to the loss on the last stage). Full backward (B) runs the graph once. Split backward: I runs it
once too, for everything but the linear and embedding weights, and frees it; W computes those
weights' gradients from the layers' inputs and output gradients that I left (`weightgrad`).
Weight gradients accumulate into `.grad` as ordinary training does. A stage the plan has
recompute (`octopipe.runtime.model.recompute`) redoes its checkpointed modules' forward in I or B,
inside autograd; W then takes its inputs from that redone forward. No communication of its
own: tensor-parallel modules communicate inside their forward and backward, and their stage's
output crosses a boundary as each rank's local shard.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field

import torch
from torch.autograd.graph import GradientEdge, get_gradient_edge

from octopipe.runtime.model.recipe import Activation, Loss, StageModule
from octopipe.runtime.model.weightgrad import (
    LayerCall,
    PendingWeightGrad,
    WeightGradTape,
    backward_input,
)
from octopipe.runtime.parallel.dtensors import local
from octopipe.runtime.step.records import HeldTensors


@dataclass
class _InFlight:
    """What one microbatch leaves on the stage between its F and its last backward action."""

    inputs: Activation
    # Where the backward starts: the edges of the outputs that need a gradient, or the scaled
    # loss on the last stage.
    roots: list[GradientEdge | torch.Tensor]
    output_mask: list[bool] = field(default_factory=list)  # which float outputs are roots
    calls: list[LayerCall] = field(default_factory=list)  # deferred layers' calls in F
    pending: PendingWeightGrad | None = None  # set by I, run by W
    kept: list = field(default_factory=list)  # what `HeldTensors` counts the stage keeping


def as_leaves(tensors: Sequence[torch.Tensor]) -> Activation:
    """Cut the graph at a stage boundary: floating-point entries become leaves needing grad."""
    return tuple(t.detach().requires_grad_(t.is_floating_point()) for t in tensors)


class StageCompute:
    """One stage's layers (`module`); `loss_scale` divides the last stage's loss."""

    def __init__(
        self,
        module: StageModule,
        is_last: bool,
        loss: Loss,
        loss_scale: float,
        autocast: torch.dtype | None = None,
        loss_context: Callable[[], AbstractContextManager] = nullcontext,
        held: HeldTensors | None = None,
    ) -> None:
        """`autocast`: run the forward (and the loss) under `torch.autocast` to this dtype.
        `loss_context`: where the last stage's loss and backward run (tensor parallelism's
        parallel loss). `held`: counts what the stage holds for its backward (its rank's)."""
        self.module, self.is_last, self.autocast = module, is_last, autocast
        self.loss_fn, self.loss_scale = loss, loss_scale
        self._loss_context = loss_context if is_last else nullcontext
        # The parameters the optimizer updates; under FSDP2 the sharded ones, while forward and
        # backward see the unsharded ones the module holds then (`_trainable`).
        self.params = self._trainable()
        self._tape = WeightGradTape([module], module.recomputed)
        self._flight: dict[int, _InFlight] = {}
        self._held = held
        self._checkpointed: list[torch.Tensor] = []  # this F's recomputed modules' inputs
        self._in_forward = False
        if held is not None:
            held.exclude([*module.parameters(), *module.buffers()])
            for block in module.recomputed:  # their checkpoints keep their inputs
                block.register_forward_pre_hook(self._note_checkpointed)

    def forward(
        self, mb: int, inputs: Activation, target: torch.Tensor | None
    ) -> tuple[Activation, float | None]:
        """Run the layers; return the outputs (graph attached) and, on the last stage, the loss."""
        with self._tape.recording() as calls, self._autocast(inputs), self._saving():
            outputs = self.module(*inputs)
            with self._loss_context():
                loss = self.loss_fn(outputs, target) if self.is_last else None
        if loss is not None:
            self._flight[mb] = _InFlight(inputs, [loss / self.loss_scale], calls=calls)
            self._keep(mb, [*inputs, *self._checkpointed])
            return outputs, float(loss.detach())
        # What crosses a stage boundary is each rank's shard: a sharded output goes as its
        # local part (differentiably: its gradient comes back the same way).
        outputs = tuple(local(t) for t in outputs)
        floats = [t for t in outputs if t.is_floating_point()]
        mask = [t.requires_grad for t in floats]
        # The backward starts from the outputs' autograd edges, not the outputs: once sent,
        # their bytes are freed, as Megatron-Core frees a stage's output after its send.
        roots = [get_gradient_edge(t) for t, m in zip(floats, mask) if m]
        self._flight[mb] = _InFlight(inputs, roots, mask, calls)
        self._keep(mb, [*inputs, *self._checkpointed])
        return outputs, None

    def evaluate(
        self, inputs: Activation, target: torch.Tensor | None
    ) -> tuple[Activation, float | None]:
        """Forward only, keeping nothing (held-out evaluation): the outputs as they cross a
        boundary and, on the last stage, the loss."""
        with torch.no_grad(), self._autocast(inputs):
            outputs = self.module(*inputs)
            with self._loss_context():
                loss = self.loss_fn(outputs, target) if self.is_last else None
        if loss is not None:
            return outputs, float(loss)
        return tuple(local(t) for t in outputs), None

    def backward(self, mb: int, output_grads: Sequence[torch.Tensor] | None) -> list[torch.Tensor]:
        """Full backward: weight gradients accumulate; returns the input gradients."""
        flight = self._flight.pop(mb)
        grads = self._root_grads(flight, output_grads)
        wanted = self._grad_inputs(flight)
        if flight.roots:
            with self._loss_context():
                torch.autograd.backward(
                    flight.roots, grads, inputs=self._trainable() + wanted or None
                )
        return [self._zero_if_none(x.grad, x) for x in wanted]

    def backward_input(
        self, mb: int, output_grads: Sequence[torch.Tensor] | None
    ) -> list[torch.Tensor]:
        """I: the input gradients, and every weight gradient but the deferred layers'."""
        flight = self._flight[mb]
        wanted = self._grad_inputs(flight)
        with self._loss_context(), self._tape.refilling(flight.calls):
            got, flight.pending = backward_input(
                flight.roots,
                self._root_grads(flight, output_grads),
                wanted,
                flight.calls,
                self._tape.not_deferred(self._trainable()),
            )
        flight.inputs, flight.roots, flight.calls = (), [], []  # the graph is gone
        if self._held is not None and flight.pending is not None:
            flight.kept = self._held.keep(flight.pending.held)
        return [self._zero_if_none(g, x) for g, x in zip(got, wanted)]

    def backward_weight(self, mb: int) -> None:
        """W: the deferred weight gradients of a microbatch whose I has run."""
        pending = self._flight.pop(mb).pending
        assert pending is not None, f"W of microbatch {mb} before its I"
        pending.run()

    @contextmanager
    def _saving(self) -> Iterator[None]:
        """Inside F: what autograd saves and the recomputed modules' inputs are counted."""
        if self._held is None or not self._held.counting:
            yield
            return
        self._in_forward = True
        try:
            with self._held.saving():
                yield
        finally:
            self._in_forward = False

    def _note_checkpointed(self, _module, args) -> None:
        if self._in_forward:  # not the redone forward inside a backward
            self._checkpointed.extend(a for a in args if isinstance(a, torch.Tensor))

    def _keep(self, mb: int, tensors: list[torch.Tensor]) -> None:
        """Count what the stage keeps of microbatch `mb` until its backward frees it."""
        if self._held is not None:
            self._flight[mb].kept = self._held.keep(tensors)
        self._checkpointed = []

    def _autocast(self, inputs: Activation):
        device = inputs[0].device.type if inputs else "cpu"
        return torch.autocast(device, dtype=self.autocast, enabled=self.autocast is not None)

    def _trainable(self) -> list[torch.Tensor]:
        return [p for p in self.module.parameters() if p.requires_grad]

    def in_flight(self) -> int:
        return len(self._flight)

    def close(self) -> None:
        """Take the stage's hooks off the model's modules (for a model that outlives it)."""
        self._tape.remove()

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
