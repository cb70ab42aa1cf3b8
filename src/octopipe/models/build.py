"""Build a real torch model from an architecture config: one module per `LayerSpec`.

The config is the single source of shapes, and `layer_specs` the single source of names and
order, so the cost model's profile and the real model of one config list the same layers.
Each layer's initial weights are drawn from a generator seeded by (seed, layer name): a
pipeline rank that builds only some layers gets exactly the weights the full model has.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from octopipe.costmodel.arch import Architecture, LayerSpec, layer_specs
from octopipe.costmodel.hf_config import load_architecture, shipped_models
from octopipe.models import synthetic
from octopipe.models.base import Activation, Batch, PipelineModel
from octopipe.models.layers import build_layer

BUNDLED_PREFIX = "tiny-"
DEFAULT_SEQ_LEN = 32
DEFAULT_MICRO_BATCH_SIZE = 2


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


def layer_seed(seed: int, name: str) -> int:
    """A per-layer seed that depends only on the model seed and the layer's name."""
    digest = hashlib.sha256(f"{seed}/{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF


def build_seeded_layer(arch: Architecture, spec: LayerSpec, seed: int) -> nn.Module:
    # fork_rng keeps the caller's global generator untouched; devices=[] leaves CUDA alone.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(layer_seed(seed, spec.name))
        return build_layer(arch, spec)


class ArchModel(PipelineModel):
    """A pipeline model of any supported architecture, trained on synthetic token chains."""

    def __init__(
        self,
        arch: Architecture,
        seed: int = 0,
        layers: Iterable[int] | None = None,
        seq_len: int = DEFAULT_SEQ_LEN,
        micro_batch_size: int = DEFAULT_MICRO_BATCH_SIZE,
    ):
        super().__init__()
        self.arch, self.seq_len, self.micro_batch_size = arch, seq_len, micro_batch_size
        specs = layer_specs(arch)
        wanted = set(range(len(specs))) if layers is None else set(layers)
        unknown = sorted(i for i in wanted if not 0 <= i < len(specs))
        if unknown:
            raise ValueError(f"{arch.name} has {len(specs)} layers; no layer {unknown[0]}")
        for i, spec in enumerate(specs):
            if i in wanted:
                self.add_layer(spec.name, build_seeded_layer(arch, spec, seed))
            else:
                self.skip_layer(spec.name)
        self.layer_kinds = [spec.kind for spec in specs]

    def loss(self, output: Activation, target: torch.Tensor) -> torch.Tensor:
        logits = output[0]
        return F.cross_entropy(logits.flatten(0, 1), target.flatten())

    def make_batch(self, num_microbatches: int, seed: int, step: int = 0) -> Batch:
        gen = synthetic.batch_generator(seed, step)
        inputs: list[Activation] = []
        targets: list[torch.Tensor] = []
        for _ in range(num_microbatches):
            tokens = synthetic.chain_tokens(
                gen, self.micro_batch_size, self.seq_len + 1, self.arch.vocab_size
            )
            if self.arch.vision is None:
                inputs.append((tokens[:, :-1],))
            else:
                v = self.arch.vision
                image = synthetic.pixels(
                    gen, self.micro_batch_size, v.max_num_tiles, v.num_channels, v.image_size
                )
                inputs.append((tokens[:, :-1], image))
            targets.append(tokens[:, 1:])
        return Batch(inputs, targets)


def build_model(
    name_or_config: str | Path | Architecture,
    seed: int = 0,
    *,
    layers: Iterable[int] | None = None,
    seq_len: int = DEFAULT_SEQ_LEN,
    micro_batch_size: int = DEFAULT_MICRO_BATCH_SIZE,
) -> ArchModel:
    """The model of a shipped config name, a config.json path, or an Architecture.

    `layers` (indices into the flat layer list) builds only those layers, with the same weights
    the full model has; the others keep their names but have no module.
    """
    arch = (
        name_or_config
        if isinstance(name_or_config, Architecture)
        else load_architecture(name_or_config)
    )
    return ArchModel(arch, seed, layers, seq_len, micro_batch_size)
