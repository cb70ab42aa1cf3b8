"""Build a real torch model from an architecture config: one module per `LayerSpec`.

The config is the single source of shapes, and `layer_specs` the single source of names and
order, so the cost model's profile and the real model of one config list the same layers.
The model is built on the meta device and split like any other (`octopipe.runtime.model.split`);
every module with tensors of its own has a `reset_parameters()` for the initialization after.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from octopipe.costmodel.arch import Architecture, layer_specs
from octopipe.costmodel.hf_config import shipped_models
from octopipe.models.base import Activation, PipelineModel
from octopipe.models.layers import build_layer
from octopipe.models.synthetic import chain_tokens, pixels

BUNDLED_PREFIX = "tiny-"


def bundled_models() -> list[str]:
    """Configs small enough to train on a CPU (the shipped `tiny-*` configs)."""
    return [name for name in shipped_models() if name.startswith(BUNDLED_PREFIX)]


def parameter_count(arch: Architecture) -> int:
    """Parameters of the real model of `arch`, known without building it: the cost model counts
    every layer's parameters exactly as these modules hold them (tests/test_models.py checks)."""
    from octopipe.costmodel.layercost import layer_work
    from octopipe.costmodel.settings import Settings

    settings = Settings(seq_len=1)
    return sum(layer_work(arch, spec, settings).params for spec in layer_specs(arch))


class ArchModel(PipelineModel):
    """A pipeline model of any supported architecture, trained on synthetic token chains."""

    def __init__(self, arch: Architecture):
        super().__init__()
        self.arch = arch
        specs = layer_specs(arch)
        for spec in specs:
            self.add_layer(spec.name, build_layer(arch, spec))
        self.layer_kinds = [spec.kind for spec in specs]

    def loss(self, output: Activation, target: torch.Tensor) -> torch.Tensor:
        # In float32, as Megatron-Core's cross-entropy runs it and the cost model prices it.
        logits = output[0]
        return F.cross_entropy(logits.flatten(0, 1).float(), target.flatten())

    def synthetic_sequence(
        self, gen: torch.Generator, seq_len: int
    ) -> tuple[Activation, torch.Tensor]:
        """One sequence of `seq_len` tokens and its next tokens (and an image, for a VLM)."""
        tokens = chain_tokens(gen, 1, seq_len + 1, self.arch.vocab_size)[0]
        inputs: Activation = (tokens[:-1],)
        if self.arch.vision is not None:
            v = self.arch.vision
            image = pixels(gen, 1, v.max_num_tiles, v.num_channels, v.image_size)[0]
            inputs = (tokens[:-1], image)
        return inputs, tokens[1:]
