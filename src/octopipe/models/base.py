"""The bundled torch models' base: a flat list of named layers run in order, torchtitan style.

A pipeline model registers its layers in order (FQNs such as `tok_embeddings`, `layers.3`,
`norm`, `output`, matching the profile the cost model produces for the same config) and its
`forward` runs those it still holds, so a copy pruned to a stage's layers
(`octopipe.runtime.model.split`) runs that stage unchanged. Activations between layers are tuples of
tensors, so several streams (text hidden states, image features) can cross a stage boundary.
"""

from __future__ import annotations

import torch
from torch import nn

Activation = tuple[torch.Tensor, ...]


class PipelineModel(nn.Module):
    """Subclasses register their layers in order with `add_layer` (FQN -> module)."""

    def __init__(self) -> None:
        super().__init__()
        self.pipeline_layers: list[str] = []

    def add_layer(self, fqn: str, module: nn.Module) -> None:
        parent: nn.Module = self
        *path, leaf = fqn.split(".")
        for part in path:
            if not hasattr(parent, part):
                parent.add_module(part, nn.ModuleDict())
            parent = getattr(parent, part)
        parent.add_module(leaf, module)
        self.pipeline_layers.append(fqn)

    def held_layer(self, fqn: str) -> nn.Module | None:
        """The layer's module, or None where a pipeline split removed it."""
        module: nn.Module | None = self
        for part in fqn.split("."):
            module = getattr(module, part, None) if module is not None else None
        return module

    def layer(self, index: int) -> nn.Module:
        layer = self.held_layer(self.pipeline_layers[index])
        if layer is None:
            raise LookupError(f"layer {index} ({self.pipeline_layers[index]}) is not held here")
        return layer

    def forward_layers(self, start: int, end: int, x: Activation) -> Activation:
        """Run the held layers among [start, end) on an activation tuple."""
        for fqn in self.pipeline_layers[start:end]:
            layer = self.held_layer(fqn)
            if layer is not None:
                out = layer(*x)
                x = out if isinstance(out, tuple) else (out,)
        return x

    def forward(self, *inputs: torch.Tensor) -> Activation:
        return self.forward_layers(0, len(self.pipeline_layers), inputs)
