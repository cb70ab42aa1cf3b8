"""torchtitan 0.3's own configs by the model they build: the config `octopipe_torchtitan.py`
starts from where `--torchtitan-config` is not given.

    model_base(arch)        # TorchtitanBase("torchtitan.models.llama3.config_registry", ...)
    no_base_reason(arch)    # why there is none, in words, where model_base is None

The table below names torchtitan 0.3.0's config functions (`torchtitan/models/NAME/
config_registry.py`) with the shape of the model each builds (the flavor its `model_registry`
returns); nothing is imported. A config is taken only where the model it builds has the
architecture's shape exactly: the layers, the width, the attention (heads, KV heads, head
width; MLA's ranks), the dense and expert feed-forward widths, the experts and which layers
hold them, the vocabulary, the sliding windows and an untied output head. Then its modules are
the plan's stages' names one to one and its costs are the ones priced; a model of another
shape (another vocabulary, one layer more) would train something else, so it gets none.

Left out on purpose: configs whose model ties its embeddings to the output head (llama3's 1B
and 3B flavors, qwen3's 0.6B, 1.7B and 4B: torchtitan 0.3 refuses weight tying under pipeline
parallelism), those with a vision tower the plan does not hold (kimi_k2_7's Kimi-VL and
Kimi K2.5, qwen3_5's, muse_glimmer's multimodal flavors), flux (an image model) and the debug
models. Qwen3-8B is only in a fine-tuning config (`sft_qwen3_8b_math`: a math SFT dataset,
variable-length attention): named in the reason, never chosen by itself.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from octopipe.costmodel.arch import Architecture
from octopipe.engines.torchtitan.config import TorchtitanBase


@dataclass(frozen=True)
class DecoderShape:
    """What decides a decoder's modules and costs, as the registry and an Architecture say it."""

    layers: int
    hidden: int
    attention: tuple  # ("gqa", heads, kv_heads, head_dim) or ("mla", heads, q_rank, kv_rank, ...)
    dense_ffn: int  # the dense layers' feed-forward width (0: no dense layer)
    dense_layers: int  # the first this many layers are dense, the rest MoE
    experts: tuple | None  # (experts, top_k, expert width, shared experts' width)
    vocabulary: int
    windows: tuple  # per layer: the sliding window, or None
    tied: bool = False  # the output head is the embedding's weight

    def differs(self, other: DecoderShape) -> str | None:
        """The first way `other` (an architecture's) differs from this (a config's), or None."""
        for field in fields(self):
            mine, theirs = getattr(self, field.name), getattr(other, field.name)
            if mine != theirs:
                return f"{_WORDS[field.name]} {_show(mine)}, not {_show(theirs)}"
        return None


_WORDS = {
    "layers": "layers",
    "hidden": "hidden size",
    "attention": "attention",
    "dense_ffn": "dense feed-forward width",
    "dense_layers": "dense layers",
    "experts": "experts (count, top-k, width, shared width)",
    "vocabulary": "vocabulary",
    "windows": "sliding windows",
    "tied": "tied embeddings",
}


def _show(value: object) -> str:
    if isinstance(value, tuple) and value and value[0] in ("gqa", "mla"):
        return f"{value[0].upper()} {value[1:]}"
    if isinstance(value, tuple) and len(value) > 4:  # per-layer windows
        kinds = sorted({"full" if w is None else str(w) for w in value})
        return "/".join(kinds)
    return str(value)


def shape_of(arch: Architecture) -> DecoderShape | None:
    """The architecture's decoder shape; None for one torchtitan's decoders do not build (a
    vision tower, cross-attention, Mamba layers, MoE layers not all after the dense ones)."""
    if arch.vision is not None or arch.cross_attention_layers or arch.hybrid_pattern is not None:
        return None
    moe = arch.moe_layers if arch.moe is not None else ()
    dense = arch.num_layers - sum(moe)
    if moe and moe != tuple(i >= dense for i in range(arch.num_layers)):
        return None
    latent = arch.latent_attention
    if latent is not None:
        attention: tuple = (
            "mla",
            latent.num_heads,
            latent.q_lora_rank or 0,
            latent.kv_lora_rank,
            latent.qk_nope_head_dim,
            latent.qk_rope_head_dim,
            latent.v_head_dim,
        )
    else:
        a = arch.attention
        attention = ("gqa", a.num_heads, a.num_kv_heads, a.head_dim)
    m = arch.moe
    return DecoderShape(
        layers=arch.num_layers,
        hidden=arch.hidden_size,
        attention=attention,
        dense_ffn=arch.intermediate_size if dense else 0,
        dense_layers=dense,
        experts=(
            (m.num_experts, m.top_k, m.expert_intermediate_size, m.shared_intermediate_size)
            if m is not None and dense < arch.num_layers
            else None
        ),
        vocabulary=arch.vocab_size,
        windows=tuple(arch.layer_windows) or (None,) * arch.num_layers,
        tied=arch.tie_word_embeddings,
    )


@dataclass(frozen=True)
class TitanConfig:
    """One config function of a torchtitan 0.3 model registry and the model it builds."""

    model: str  # the registry (torchtitan's --module short name)
    config: str  # the function
    model_types: tuple[str, ...]  # the Hugging Face model types of that architecture
    shape: DecoderShape
    fine_tuning: bool = False  # a fine-tuning config: named, never chosen by itself

    @property
    def base(self) -> TorchtitanBase:
        return TorchtitanBase.parse(f"{self.model}:{self.config}")


def _dense(layers, hidden, heads, kv, head_dim, ffn, vocab) -> DecoderShape:
    return DecoderShape(
        layers, hidden, ("gqa", heads, kv, head_dim), ffn, layers, None, vocab, (None,) * layers
    )


def _mla(layers, hidden, heads, q_rank, ffn, dense, experts, vocab) -> DecoderShape:
    attention = ("mla", heads, q_rank, 512, 128, 64, 128)  # kv rank, nope, rope, v: all alike
    return DecoderShape(layers, hidden, attention, ffn, dense, experts, vocab, (None,) * layers)


def _moe(layers, hidden, heads, kv, head_dim, experts, vocab, windows=None) -> DecoderShape:
    return DecoderShape(
        layers,
        hidden,
        ("gqa", heads, kv, head_dim),
        0,
        0,
        experts,
        vocab,
        windows or (None,) * layers,
    )


_LLAMA3, _QWEN3 = ("llama",), ("qwen3",)
_DEEPSEEK = ("deepseek_v2", "deepseek_v3")  # deepseek_v3's 16B flavor is DeepSeek-V2-Lite's shape
_GPT_OSS_WINDOWS = {n: tuple(128 if i % 2 == 0 else None for i in range(n)) for n in (24, 36)}

# torchtitan 0.3.0 (release/0.3, 0.3.0rc1): config function -> the flavor's shape.
CONFIGS = (
    TitanConfig("llama3", "llama3_8b", _LLAMA3, _dense(32, 4096, 32, 8, 128, 14336, 128256)),
    TitanConfig("llama3", "llama3_70b", _LLAMA3, _dense(80, 8192, 64, 8, 128, 28672, 128256)),
    TitanConfig("llama3", "llama3_405b", _LLAMA3, _dense(126, 16384, 128, 8, 128, 53248, 128256)),
    TitanConfig(
        "qwen3",
        "sft_qwen3_8b_math",
        _QWEN3,
        _dense(36, 4096, 32, 8, 128, 12288, 151936),
        fine_tuning=True,
    ),
    TitanConfig("qwen3", "qwen3_14b", _QWEN3, _dense(40, 5120, 40, 8, 128, 17408, 151936)),
    TitanConfig("qwen3", "qwen3_32b", _QWEN3, _dense(64, 5120, 64, 8, 128, 25600, 151936)),
    TitanConfig(
        "qwen3",
        "qwen3_30b_a3b",
        ("qwen3_moe",),
        _moe(48, 2048, 32, 4, 128, (128, 8, 768, 0), 151936),
    ),
    TitanConfig(
        "deepseek_v3",
        "deepseek_v3_16b",
        _DEEPSEEK,
        _mla(27, 2048, 16, 0, 10944, 1, (64, 6, 1408, 2816), 102400),
    ),
    TitanConfig(
        "deepseek_v3",
        "deepseek_v3_671b",
        _DEEPSEEK,
        _mla(61, 7168, 128, 1536, 18432, 3, (256, 8, 2048, 2048), 129280),
    ),
    TitanConfig(  # Moonlight 16B-A3B: the text-only DeepSeek-V3 of kimi_k2_7's registry
        "kimi_k2_7",
        "moonlight_16b_a3b",
        ("deepseek_v3",),
        _mla(27, 2048, 16, 0, 11264, 1, (64, 6, 1408, 2816), 163840),
    ),
    TitanConfig(
        "gpt_oss",
        "gpt_oss_20b",
        ("gpt_oss",),
        _moe(24, 2880, 64, 8, 64, (32, 4, 2880, 0), 201088, _GPT_OSS_WINDOWS[24]),
    ),
    TitanConfig(
        "gpt_oss",
        "gpt_oss_120b",
        ("gpt_oss",),
        _moe(36, 2880, 64, 8, 64, (128, 4, 2880, 0), 201088, _GPT_OSS_WINDOWS[36]),
    ),
)

# Model types torchtitan 0.3 has a registry for, but only with configs left out above.
_ONLY_LEFT_OUT = {
    "kimi_k2": "kimi_k2_7's Kimi K2.5 config builds a vision tower besides this decoder",
}


def model_base(arch: Architecture) -> TorchtitanBase | None:
    """torchtitan 0.3's config whose model has `arch`'s shape exactly, or None."""
    shape = shape_of(arch)
    for c in CONFIGS:
        if not c.fine_tuning and arch.model_type in c.model_types and c.shape == shape:
            return c.base
    return None


def no_base_reason(arch: Architecture) -> str:
    """Why `model_base(arch)` is None, in a few words: no torchtitan registry for its kind,
    only a fine-tuning config of it, or how the nearest config's model differs."""
    kind = arch.model_type
    mine = [c for c in CONFIGS if kind in c.model_types]
    if not mine:
        return _ONLY_LEFT_OUT.get(kind, f"none builds {kind!r} models")
    shape = shape_of(arch)
    if shape is None:
        return f"its {mine[0].model} decoder does not build this layer mix"
    same = [c for c in mine if c.shape == shape]
    if same:  # only fine-tuning ones
        return f"only the fine-tuning config {same[0].model}:{same[0].config} builds it"
    names = ", ".join(c.config for c in mine if not c.fine_tuning)
    nearest = min(mine, key=lambda c: _distance(c.shape, shape))
    return (
        f"its {mine[0].model} configs ({names}) build other shapes; the nearest, "
        f"{nearest.config}: {nearest.shape.differs(shape)}"
    )


def _distance(a: DecoderShape, b: DecoderShape) -> int:
    return sum(getattr(a, f.name) != getattr(b, f.name) for f in fields(a))
