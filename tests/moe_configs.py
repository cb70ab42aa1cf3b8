"""A small MoE config for the cost model's tests: Qwen3-MoE's shape (the fields of its public
config.json), smaller, and the work of one of its MoE layers."""

from __future__ import annotations

import json
from pathlib import Path

from octopipe.costmodel import layer_specs, load_architecture
from octopipe.costmodel.layercost import layer_work
from octopipe.costmodel.settings import Settings

QWEN3_MOE = {
    "model_type": "qwen3_moe",
    "hidden_size": 1024,
    "num_hidden_layers": 8,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "intermediate_size": 3072,
    "moe_intermediate_size": 384,
    "num_experts": 32,
    "num_experts_per_tok": 4,
    "vocab_size": 32000,
}


def write_qwen3_moe(folder: Path) -> str:
    """The config written as a config.json in `folder`; its path."""
    path = folder / "qwen3_moe.json"
    path.write_text(json.dumps(QWEN3_MOE))
    return str(path)


def moe_work(config: str, **settings):
    """The work of the config's first MoE layer at 2,048 tokens under `settings`."""
    arch = load_architecture(config)
    spec = next(s for s in layer_specs(arch) if s.kind == "moe")
    return layer_work(arch, spec, Settings(seq_len=2048, **settings))
