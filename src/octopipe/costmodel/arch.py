"""Model architectures: the single source of shapes for the cost model and the real torch models.

`load_architecture` reads a Hugging Face style `config.json` (a path, or the name of a config
shipped in `costmodel/configs/`) into a frozen `Architecture`; `layer_specs` turns it into the
flat, named layer sequence a pipeline splits. The names and kinds here are a contract: the cost
model's profile and the bundled torch models list the same layers in the same order.

This module describes shapes only; it computes no costs (see `layercost.py`) and builds no
torch modules (see `octopipe.models`).
"""

from __future__ import annotations

from dataclasses import dataclass

# Layer kinds (docs/FORMATS.md: a profile layer's `kind`), plain strings so profiles stay JSON.
EMBEDDING = "embedding"
DECODER = "decoder"  # dense block: self-attention + MLP
MOE = "moe"  # self-attention + mixture-of-experts block
MAMBA = "mamba"  # hybrid stack: Mamba-2 mixer only
ATTENTION = "attention"  # hybrid stack: self-attention only
MLP = "mlp"  # hybrid stack: MLP only
MOE_MLP = "moe_mlp"  # hybrid stack: mixture of experts only (Nemotron-H's `E`)
NORM = "norm"
HEAD = "head"
VISION_EMBED = "vision_embed"
VISION_BLOCK = "vision_block"
PROJECTOR = "projector"
CROSS_ATTENTION = "cross_attention"  # cross-attention to image features + MLP

KINDS = (
    EMBEDDING,
    DECODER,
    MOE,
    MAMBA,
    ATTENTION,
    MLP,
    MOE_MLP,
    NORM,
    HEAD,
    VISION_EMBED,
    VISION_BLOCK,
    PROJECTOR,
    CROSS_ATTENTION,
)

# Families: how the text stack is built.
DENSE = "dense"  # LLaMA, Qwen2, Mistral
GEMMA = "gemma"  # Gemma-2/3: sliding + global attention, tied embeddings, big vocabulary
DEEPSEEK = "deepseek"  # DeepSeek-V2/V3: MLA attention, first k dense layers, routed+shared experts
SPARSE = "moe"  # Qwen-MoE, Mixtral: GQA attention with MoE blocks
HYBRID = "hybrid"  # Nemotron-H: Mamba-2 / attention / MLP layers from a pattern string
GPT = "gpt"  # GPT-2 / GPT-NeoX / Megatron-LM's GPT: LayerNorm, GELU MLP, biases everywhere
VLM = "vlm"  # Llama-3.2-Vision: vision tower + projector + text stack with cross-attention

# Hybrid pattern characters (Nemotron-H `hybrid_override_pattern`).
HYBRID_CHARS = {"M": MAMBA, "*": ATTENTION, "-": MLP, "E": MOE_MLP}


@dataclass(frozen=True)
class AttentionShape:
    """Grouped-query self-attention (also multi-head when num_kv_heads == num_heads)."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    bias: bool = False
    """q/k/v projections carry a bias (Qwen2)."""
    logit_softcap: float | None = None
    """Gemma-2: scores become cap * tanh(scores / cap)."""
    query_scale: float | None = None
    """Gemma: scores are scaled by query_scale ** -0.5 instead of head_dim ** -0.5."""
    qk_norm: bool = False
    """Gemma-3: RMSNorm on queries and keys per head."""


@dataclass(frozen=True)
class LatentAttentionShape:
    """DeepSeek multi-head latent attention (MLA): low-rank compressed queries and keys/values."""

    num_heads: int
    q_lora_rank: int | None
    """Rank of the query compression; None means a plain query projection (V2-Lite)."""
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


@dataclass(frozen=True)
class MoEShape:
    """A mixture-of-experts feed-forward block."""

    num_experts: int
    top_k: int
    expert_intermediate_size: int
    shared_intermediate_size: int = 0
    """Total width of the always-on shared expert(s); 0 when there is none."""
    shared_expert_gate: bool = False
    """Qwen-MoE: a sigmoid gate (hidden -> 1) scales the shared expert's output."""
    expert_bias: bool = False
    """gpt-oss: the experts' projections (and the router) carry biases."""


@dataclass(frozen=True)
class MambaShape:
    """A Mamba-2 mixer (selective state space, multi-head with grouped B/C)."""

    num_heads: int
    head_dim: int
    state_size: int
    n_groups: int
    conv_kernel: int
    chunk_size: int = 256

    @property
    def inner_size(self) -> int:
        return self.num_heads * self.head_dim


@dataclass(frozen=True)
class VisionShape:
    """A ViT vision tower over image tiles (Llama-3.2-Vision style)."""

    image_size: int
    patch_size: int
    num_channels: int
    hidden_size: int
    num_layers: int
    """Transformer blocks in the tower (local and global together)."""
    num_heads: int
    intermediate_size: int
    output_dim: int
    """Width of the tower's output features (Mllama: several layers' states concatenated)."""
    max_num_tiles: int = 1
    num_global_layers: int = 0
    """The last `num_global_layers` of the tower are gated global blocks (Mllama)."""
    intermediate_layers: tuple[int, ...] = ()
    """Blocks whose outputs are kept and concatenated to the tower's output (Mllama)."""

    @property
    def patches_per_tile(self) -> int:
        """Patches of one tile plus the class token."""
        return (self.image_size // self.patch_size) ** 2 + 1

    @property
    def num_tokens(self) -> int:
        """Vision tokens of one image: every tile's patches."""
        return self.patches_per_tile * self.max_num_tiles


@dataclass(frozen=True)
class Architecture:
    """One model's shapes, as read from its config.json. Per-layer tuples index text layers."""

    name: str
    model_type: str
    family: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    """Layers of the text stack (`layers.0` .. `layers.{num_layers-1}`)."""
    intermediate_size: int
    """Width of a dense MLP."""
    hidden_act: str
    attention: AttentionShape
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    embed_scale: float = 1.0
    """Gemma multiplies embeddings by sqrt(hidden_size)."""
    final_logit_softcap: float | None = None
    layer_windows: tuple[int | None, ...] = ()
    """Per text layer: the sliding attention window, or None for global attention."""
    gated_mlp: bool = True
    """SwiGLU/GeGLU (gate, up, down) vs a plain up/down MLP (Nemotron-H's squared ReLU)."""
    latent_attention: LatentAttentionShape | None = None
    moe: MoEShape | None = None
    moe_layers: tuple[bool, ...] = ()
    """Per text layer: True where the feed-forward is the MoE block."""
    mamba: MambaShape | None = None
    hybrid_pattern: str | None = None
    """Nemotron-H: one character per text layer, 'M' Mamba-2, '*' attention, '-' MLP, 'E' MoE."""
    vision: VisionShape | None = None
    cross_attention_layers: tuple[int, ...] = ()
    """VLM: text layers that are cross-attention layers instead of self-attention ones."""
    extra_vocab: int = 0
    """Embedding rows beyond vocab_size (Mllama adds 8 image/special tokens)."""
    norm_bias: bool = False
    """LayerNorm (weight and bias) instead of RMSNorm (GPT-2, GPT-NeoX)."""
    mlp_bias: bool = False
    """Biases on the MLP and the attention output projection (GPT-2, GPT-NeoX)."""
    learned_positions: int = 0
    """Rows of a learned position-embedding table added to the token embeddings (GPT-2:
    n_positions); 0: rotary positions, applied to q and k in every attention layer."""

    @property
    def has_experts(self) -> bool:
        """Whether any layer routes tokens to experts (a MoE family's config may have none)."""
        if self.moe is None:
            return False
        if self.hybrid_pattern is not None:
            return "E" in self.hybrid_pattern
        return any(self.moe_layers)

    def text_layer_kind(self, index: int) -> str:
        if self.hybrid_pattern is not None:
            return HYBRID_CHARS[self.hybrid_pattern[index]]
        if index in self.cross_attention_layers:
            return CROSS_ATTENTION
        if self.moe_layers and self.moe_layers[index]:
            return MOE
        return DECODER


@dataclass(frozen=True)
class LayerSpec:
    """One entry of the flat layer sequence a pipeline splits."""

    name: str
    """torchtitan-style fully qualified module name, e.g. `layers.3`."""
    kind: str
    index: int | None = None
    """Position within its stack (`layers.i` -> i, `vision.layers.j` -> j); None for singletons."""
    mixer: str | None = None
    """Token mixer: 'gqa', 'mla', 'mamba', 'cross' (to image features), 'vit', or None."""
    ffn: str | None = None
    """Feed-forward: 'dense', 'moe', or None."""
    window: int | None = None
    """Sliding attention window of a self-attention layer; None means global (full causal)."""


def layer_specs(arch: Architecture) -> list[LayerSpec]:
    """The flat layer list: [vision tower, projector,] embedding, text layers, norm, output."""
    specs: list[LayerSpec] = []
    if arch.vision is not None:
        specs.append(LayerSpec("vision.patch_embed", VISION_EMBED))
        for j in range(arch.vision.num_layers):
            specs.append(LayerSpec(f"vision.layers.{j}", VISION_BLOCK, j, "vit", "dense"))
        specs.append(LayerSpec("projector", PROJECTOR))
    specs.append(LayerSpec("tok_embeddings", EMBEDDING))
    specs.extend(_text_layer_spec(arch, i) for i in range(arch.num_layers))
    specs.append(LayerSpec("norm", NORM))
    specs.append(LayerSpec("output", HEAD))
    return specs


def _text_layer_spec(arch: Architecture, i: int) -> LayerSpec:
    kind = arch.text_layer_kind(i)
    name = f"layers.{i}"
    window = arch.layer_windows[i] if arch.layer_windows else None
    self_attn = "mla" if arch.latent_attention is not None else "gqa"
    if kind == MAMBA:
        return LayerSpec(name, kind, i, "mamba", None)
    if kind == ATTENTION:
        return LayerSpec(name, kind, i, self_attn, None, window)
    if kind == MLP:
        return LayerSpec(name, kind, i, None, "dense")
    if kind == MOE_MLP:
        return LayerSpec(name, kind, i, None, "moe")
    if kind == CROSS_ATTENTION:
        return LayerSpec(name, kind, i, "cross", "dense")
    ffn = "moe" if kind == MOE else "dense"
    return LayerSpec(name, kind, i, self_attn, ffn, window)


# Layer names in Hugging Face `transformers` causal LMs (`--layer-names hf`): same layers, same
# order, the FQNs `AutoModelForCausalLM` gives them, so a plan runs on `--model hf:PATH`.
HF_SINGLETONS = {"tok_embeddings": "model.embed_tokens", "norm": "model.norm", "output": "lm_head"}
LAYER_NAMINGS = ("torchtitan", "hf")


def hf_layer_name(name: str) -> str:
    """`tok_embeddings` -> `model.embed_tokens`, `layers.3` -> `model.layers.3`, `norm` ->
    `model.norm`, `output` -> `lm_head`; a vision tower has no such name (ValueError)."""
    if name in HF_SINGLETONS:
        return HF_SINGLETONS[name]
    if name.startswith("layers."):
        return f"model.{name}"
    raise ValueError(f"{name} has no transformers causal-LM name (text models only)")
