"""Models from outside OctoPipe, as a team would bring them: a torchtitan-style transformer and
tiny Hugging Face configs (random weights, built from config.json, nothing downloaded)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

VOCAB, DIM, HEADS = 96, 32, 4

# Tiny transformers configs: a Llama-style dense model and a Qwen2-MoE-style sparse one.
HF_CONFIGS = {
    "llama": {
        "model_type": "llama",
        "vocab_size": VOCAB,
        "hidden_size": DIM,
        "intermediate_size": 64,
        "num_hidden_layers": 3,
        "num_attention_heads": HEADS,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
        "tie_word_embeddings": False,
    },
    "qwen2_moe": {
        "model_type": "qwen2_moe",
        "vocab_size": VOCAB,
        "hidden_size": DIM,
        "intermediate_size": 64,
        "moe_intermediate_size": 16,
        "shared_expert_intermediate_size": 32,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 3,
        "num_attention_heads": HEADS,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
        "tie_word_embeddings": False,
    },
}


def write_hf_config(folder: Path, kind: str, **changes) -> Path:
    """config.json of one of HF_CONFIGS (with `changes`) in `folder`; its path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.json"
    path.write_text(json.dumps({**HF_CONFIGS[kind], **changes}))
    return path


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(DIM)
        self.qkv = nn.Linear(DIM, 3 * DIM, bias=False)
        self.wo = nn.Linear(DIM, DIM, bias=False)
        self.ffn_norm = nn.RMSNorm(DIM)
        self.w1 = nn.Linear(DIM, 2 * DIM, bias=False)
        self.w2 = nn.Linear(2 * DIM, DIM, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        b, s, _ = h.shape
        q, k, v = self.qkv(self.attention_norm(h)).view(b, s, 3, HEADS, -1).unbind(2)
        attn = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        h = h + self.wo(attn.transpose(1, 2).reshape(b, s, DIM))
        return h + self.w2(F.silu(self.w1(self.ffn_norm(h))))


class TitanStyle(nn.Module):
    """torchtitan's shape: its forward skips what a pipeline split removed or set to None."""

    def __init__(self, layers: int = 4) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleDict({str(i): Block() for i in range(layers)})
        self.norm = nn.RMSNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for layer in self.layers.values():
            h = layer(h)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h


def titan_style() -> TitanStyle:
    return TitanStyle()


class TensorParallelTitan(TitanStyle):
    """A team's model with its own tensor-parallel plan (the `tp_plan` hook): Megatron's MLP
    split without sequence parallelism, so activations stay whole between layers."""

    tp_plan = {"layers.*.w1": ColwiseParallel(), "layers.*.w2": RowwiseParallel()}


def tp_titan_style() -> TensorParallelTitan:
    return TensorParallelTitan()


def token_batches(steps: int, sequences: int, seq_len: int = 12, seed: int = 0):
    """Global batches of random token ids and their next tokens, for the Python API."""
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(steps):
        tokens = torch.randint(0, VOCAB, (sequences, seq_len + 1), generator=gen)
        batches.append(((tokens[:, :-1],), tokens[:, 1:]))
    return batches


def label_smoothed_loss(outputs, target):
    """A loss of the caller's own, picklable, for the Python API."""
    return F.cross_entropy(outputs[0].flatten(0, 1), target.flatten(), label_smoothing=0.1)


# The families `hf:` adapts, each a tiny config of HF_CONFIGS' (base, changes).
FAMILIES = {
    "llama": ("llama", {}),
    "qwen2": ("llama", {"model_type": "qwen2"}),
    "qwen3": ("llama", {"model_type": "qwen3", "head_dim": 8}),
    "mistral": ("llama", {"model_type": "mistral", "sliding_window": 4}),
    "mixtral": (
        "llama",
        {"model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2},
    ),
    "qwen2_moe": ("qwen2_moe", {}),
    "qwen3_moe": ("qwen2_moe", {"model_type": "qwen3_moe", "head_dim": 8}),
}


def hf_family_models(root: Path) -> dict[str, str]:
    """Every family's `--model hf:PATH`, its config written under `root`."""
    return {
        name: f"hf:{write_hf_config(root / name, base, **changes)}"
        for name, (base, changes) in FAMILIES.items()
    }
