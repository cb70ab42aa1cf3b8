"""The contract between the bundled torch models and the executor/profiler.

A pipeline model is a flat sequence of named layers (torchtitan-style FQNs such as
`tok_embeddings`, `layers.3`, `norm`, `output`) whose order and count match the profile the
cost model produces for the same config. Activations between layers are tuples of tensors, so
several streams (text hidden states, image features) can cross a stage boundary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

Activation = tuple[torch.Tensor, ...]


class PipelineLayer(Protocol):
    def __call__(self, *inputs: torch.Tensor) -> Activation: ...


@dataclass
class Batch:
    """One step's data, already split into microbatches."""

    inputs: list[Activation]  # per microbatch: what the first layer receives
    targets: list[torch.Tensor]  # per microbatch: what the loss compares against


class PipelineModel(nn.Module):
    """Subclasses register their layers in order with `add_layer` (FQN -> module)."""

    def __init__(self) -> None:
        super().__init__()
        self._layer_names: list[str] = []
        self._skipped: set[str] = set()

    def add_layer(self, fqn: str, module: nn.Module) -> None:
        parent: nn.Module = self
        *path, leaf = fqn.split(".")
        for part in path:
            if not hasattr(parent, part):
                parent.add_module(part, nn.ModuleDict())
            parent = getattr(parent, part)
        parent.add_module(leaf, module)
        self._layer_names.append(fqn)

    def skip_layer(self, fqn: str) -> None:
        """Record a layer this process does not build: a pipeline rank builds only its stages,
        yet keeps the model's full list of names so layer indices mean the same everywhere."""
        self._layer_names.append(fqn)
        self._skipped.add(fqn)

    def has_layer(self, index: int) -> bool:
        return self._layer_names[index] not in self._skipped

    @property
    def layer_names(self) -> list[str]:
        return list(self._layer_names)

    def layer(self, index: int) -> nn.Module:
        name = self._layer_names[index]
        if name in self._skipped:
            raise LookupError(f"layer {index} ({name}) was not built in this process")
        return self.get_submodule(name)

    def forward_layers(self, start: int, end: int, x: Activation) -> Activation:
        """Run layers [start, end) on an activation tuple."""
        for i in range(start, end):
            out = self.layer(i)(*x)
            x = out if isinstance(out, tuple) else (out,)
        return x

    def forward(self, *inputs: torch.Tensor) -> Activation:
        return self.forward_layers(0, len(self._layer_names), inputs)

    def loss(self, output: Activation, target: torch.Tensor) -> torch.Tensor:
        """The loss of the last layer's output; part of the last stage's work."""
        raise NotImplementedError

    def make_batch(self, num_microbatches: int, seed: int, step: int = 0) -> Batch:
        """Deterministic synthetic data: the same seed and step give the same batch."""
        raise NotImplementedError
