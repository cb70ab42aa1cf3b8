"""The vision-language layers' work on one tensor-parallel rank (Llama-3.2-Vision): the text
stack's cross-attention layers, the vision tower's patch embedding and blocks, and the
projector. Pure functions appending to a `LayerWork`."""

from __future__ import annotations

from octopipe.costmodel.arch import Architecture, LayerSpec
from octopipe.costmodel.attention import attention_core
from octopipe.costmodel.feedforward import mlp
from octopipe.costmodel.settings import Settings
from octopipe.costmodel.shards import split_heads
from octopipe.costmodel.work import LayerWork


def cross_attention(work: LayerWork, arch: Architecture, spec: LayerSpec, s: Settings) -> None:
    """Llama-3.2-Vision: text queries attend to all image tokens (not causal); gated residuals."""
    vision, att = arch.vision, arch.attention
    assert vision is not None
    tp, t, h, a = s.tensor_parallel, s.tokens, arch.hidden_size, s.activation_bytes
    image_tokens = s.micro_batch_size * vision.num_tokens
    heads = split_heads(att.num_heads, tp, "attention heads")
    kv_heads = split_heads(att.num_kv_heads, tp, "key-value heads", replicable=True)
    d = att.head_dim
    work.norm(t, h)
    work.linear(t, h, heads * d)
    work.linear(image_tokens, h, 2 * kv_heads * d)
    work.norm(t * heads, d, replicated=False)  # q_norm
    work.norm(image_tokens * kv_heads, d, replicated=False)  # k_norm
    attention_core(work, s, heads, kv_heads, d, d, vision.num_tokens, kv_len=vision.num_tokens)
    work.linear(t, heads * d, h, replicated_input=False)
    work.tp_all_reduce(t, h)
    work.elementwise(3 * t * h * a, 3 * t * h * a)  # tanh-gated residual
    work.params += 2  # attention and MLP gates
    work.norm(t, h)
    mlp(work, t, h, arch.intermediate_size, arch.gated_mlp, tp)
    work.tp_all_reduce(t, h)
    work.elementwise(3 * t * h * a, 3 * t * h * a)


def vision_embed(work: LayerWork, arch: Architecture, spec: LayerSpec, s: Settings) -> None:
    """Patch convolution as a GEMM, class token, position and tile embeddings, pre-norm."""
    v = arch.vision
    assert v is not None
    tokens = s.micro_batch_size * v.num_tokens
    patch_pixels = v.num_channels * v.patch_size**2
    work.linear(tokens, patch_pixels, v.hidden_size, input_grad=False, quantizable=False)
    tiles = v.max_num_tiles
    aspect_ratios = _aspect_ratio_count(tiles) + 1
    work.params += v.hidden_size  # class token
    work.params += v.patches_per_tile * v.hidden_size  # position embedding
    work.params += aspect_ratios * tiles * v.patches_per_tile * v.hidden_size  # tile positions
    work.params += 2 * aspect_ratios * tiles * v.hidden_size  # pre- and post-tile embeddings
    nbytes = tokens * v.hidden_size * s.activation_bytes
    work.elementwise(4 * nbytes, 0.0)
    work.norm(tokens, v.hidden_size, replicated=False)
    work.params += v.hidden_size  # LayerNorm bias
    work.without_input_gradient()


def _aspect_ratio_count(max_tiles: int) -> int:
    """Tile grids (w, h) with w * h <= max_tiles: Mllama's supported aspect ratios."""
    return sum(
        1 for w in range(1, max_tiles + 1) for h in range(1, max_tiles + 1) if w * h <= max_tiles
    )


def vision_block(work: LayerWork, arch: Architecture, spec: LayerSpec, s: Settings) -> None:
    """ViT block over all tiles of an image: LayerNorm, full attention, LayerNorm, GELU MLP."""
    v = arch.vision
    assert v is not None
    tp = s.tensor_parallel
    tokens = s.micro_batch_size * v.num_tokens
    hv = v.hidden_size
    heads = split_heads(v.num_heads, tp, "vision attention heads")
    d = hv // v.num_heads
    work.norm(tokens, hv)
    work.params += hv
    work.linear(tokens, hv, 3 * heads * d)
    attention_core(
        work, s, heads, heads, d, d, v.num_tokens, kv_len=v.num_tokens, q_len=v.num_tokens
    )
    work.linear(tokens, heads * d, hv, replicated_input=False)
    work.tp_all_reduce(tokens, hv)
    work.residual(tokens, hv)
    work.norm(tokens, hv)
    work.params += hv
    mlp(work, tokens, hv, v.intermediate_size, False, tp, bias=True)
    work.tp_all_reduce(tokens, hv)
    work.residual(tokens, hv)
    if spec.index is not None and spec.index >= v.num_layers - v.num_global_layers:
        work.params += 2  # gated global block: attention and MLP gates


def projector(work: LayerWork, arch: Architecture, spec: LayerSpec, s: Settings) -> None:
    """Linear map of the tower's concatenated features into the text width."""
    v = arch.vision
    assert v is not None
    tokens = s.micro_batch_size * v.num_tokens
    work.linear(tokens, v.output_dim, arch.hidden_size, bias=True)
