"""Per-layer analytic work: FLOPs, bytes, saved activations and parameters of each layer kind.

`layer_work(arch, spec, settings)` describes what one tensor-parallel rank does for one
microbatch; `boundary_bytes` what crosses a stage boundary after a layer. Megatron-style tensor
parallelism splits heads, MLP width, experts and vocabulary; norms, routers and MLA's
down-projections stay replicated. Pure functions of their arguments.
"""

from __future__ import annotations

import math

from octopipe.costmodel import arch as A
from octopipe.costmodel.arch import Architecture, LayerSpec
from octopipe.costmodel.settings import Settings
from octopipe.costmodel.work import F, I, LayerWork, mean_attended_keys
from octopipe.errors import InputError

TOKEN_ID_BYTES = 8  # int64 token ids travel with the image stream through the vision tower


def split(n: int, tp: int) -> int:
    """This rank's share of a dimension Megatron splits (padded up, as Megatron pads vocab)."""
    return math.ceil(n / tp)


def split_heads(heads: int, tp: int, what: str, replicable: bool = False) -> int:
    """This rank's heads: TP must divide them, or, for `replicable` ones (key-value heads,
    Mamba groups), may be a multiple of them (each rank then keeps a replica)."""
    if heads % tp and not (replicable and tp % heads == 0):
        raise InputError(
            "settings",
            f"tensor-parallel degree {tp} does not fit {heads} {what}",
            "tensor_parallel",
        )
    return max(1, heads // tp)  # fewer KV heads than ranks: each rank keeps a replica


def layer_work(arch: Architecture, spec: LayerSpec, settings: Settings) -> LayerWork:
    """The work of one layer for one microbatch on one tensor-parallel rank."""
    work = LayerWork(
        settings.tensor_parallel,
        settings.sequence_parallel,
        settings.activation_bytes,
        settings.tp_comm_overlap,
    )
    builder = _BUILDERS[spec.kind]
    builder(work, arch, spec, settings)
    return work


# Text-stack blocks ------------------------------------------------------------------------


def _decoder(work: LayerWork, arch: Architecture, spec: LayerSpec, s: Settings) -> None:
    """Pre-norm self-attention and feed-forward (dense or MoE); Gemma adds post-norms."""
    t, h, dropout = s.tokens, arch.hidden_size, s.dropout > 0
    work.norm(t, h, bias=arch.norm_bias)
    if spec.mixer == "mla":
        _latent_attention(work, arch, s)
    else:
        _self_attention(work, arch, s, spec.window)
    _post_norm(work, arch, t)
    work.residual(t, h, dropout)
    work.norm(t, h, bias=arch.norm_bias)
    if spec.ffn == "moe":
        _moe(work, arch, s)
    else:
        _mlp(
            work,
            t,
            h,
            arch.intermediate_size,
            arch.gated_mlp,
            s.tensor_parallel,
            bias=arch.mlp_bias,
        )
        work.tp_all_reduce(t, h)
    _post_norm(work, arch, t)
    work.residual(t, h, dropout)


def _post_norm(work: LayerWork, arch: Architecture, tokens: int) -> None:
    if arch.family == A.GEMMA:
        work.norm(tokens, arch.hidden_size)


def _hybrid_attention(work: LayerWork, arch: Architecture, spec: LayerSpec, s: Settings) -> None:
    work.norm(s.tokens, arch.hidden_size)
    _self_attention(work, arch, s, spec.window)
    work.residual(s.tokens, arch.hidden_size, s.dropout > 0)


def _hybrid_mlp(work: LayerWork, arch: Architecture, spec: LayerSpec, s: Settings) -> None:
    work.norm(s.tokens, arch.hidden_size)
    _mlp(
        work, s.tokens, arch.hidden_size, arch.intermediate_size, arch.gated_mlp, s.tensor_parallel
    )
    work.tp_all_reduce(s.tokens, arch.hidden_size)
    work.residual(s.tokens, arch.hidden_size, s.dropout > 0)


def _self_attention(work: LayerWork, arch: Architecture, s: Settings, window: int | None) -> None:
    """GQA: q/k/v column-parallel over heads, rope (unless positions are learned), the causal
    core, o row-parallel."""
    att, tp, t, h, a = (
        arch.attention,
        s.tensor_parallel,
        s.tokens,
        arch.hidden_size,
        s.activation_bytes,
    )
    heads = split_heads(att.num_heads, tp, "attention heads")
    kv_heads = split_heads(att.num_kv_heads, tp, "key-value heads", replicable=True)
    d = att.head_dim
    work.linear(t, h, heads * d, bias=att.bias)
    work.linear(t, h, 2 * kv_heads * d, bias=att.bias, save_input=False)
    if att.qk_norm:
        work.norm(t * heads, d, replicated=False)
        work.norm(t * kv_heads, d, replicated=False)
    if not arch.learned_positions:
        rope_bytes = t * (heads + kv_heads) * d * a
        work.elementwise(2 * rope_bytes, 2 * rope_bytes)
    keys = mean_attended_keys(s.seq_len, window)
    _attention_core(
        work, s, heads, kv_heads, d, d, keys, model_keys=min(window or s.seq_len, s.seq_len)
    )
    work.linear(t, heads * d, h, bias=arch.mlp_bias, replicated_input=False)
    work.tp_all_reduce(t, h)


def _attention_core(
    work: LayerWork,
    s: Settings,
    heads: int,
    kv_heads: int,
    qk_dim: int,
    v_dim: int,
    keys_per_query: float,
    kv_len: int | None = None,
    sequences: int | None = None,
    q_len: int | None = None,
    model_keys: int | None = None,
) -> None:
    """The attention core of this rank's heads, by the settings' kernel, for `sequences`
    (default: the microbatch's) of `q_len` queries (default: this rank's tokens of a text
    sequence) over `kv_len` keys each (default: the whole sequence). Under context parallelism
    the ring exchanges every other rank's K/V chunk (backward: K/V and their gradients),
    overlapped with the blocks' compute. What the core computes and saves is marked, so
    selective recomputation can redo it (`LayerWork.core`). `model_keys`: the keys a query
    counts by the model-FLOPs convention (default: all `kv_len`)."""
    n = s.micro_batch_size if sequences is None else sequences
    q = s.local_seq_len if q_len is None else q_len
    kv = s.seq_len if kv_len is None else kv_len
    keys = kv if model_keys is None else model_keys
    work.count_attention(2.0 * n * q * keys * heads * (qk_dim + v_dim))
    with work.core():
        if s.attention == "unfused":
            work.unfused_attention(n, q, kv, heads, kv_heads, qk_dim, v_dim, s.dropout > 0)
        else:
            work.attention(n * q, n * kv, keys_per_query, heads, kv_heads, qk_dim, v_dim)
        c = s.context_parallel
        if c > 1:
            chunk = n * q * kv_heads * (qk_dim + v_dim) * s.activation_bytes
            work.cp_exchange(F, (c - 1) * chunk, s.cp_across_nodes)
            work.cp_exchange(I, 2 * (c - 1) * chunk, s.cp_across_nodes)


def _latent_attention(work: LayerWork, arch: Architecture, s: Settings) -> None:
    """DeepSeek MLA: replicated down-projections with norms, head-split up-projections."""
    mla, tp, t, h = arch.latent_attention, s.tensor_parallel, s.tokens, arch.hidden_size
    assert mla is not None
    heads = split_heads(mla.num_heads, tp, "attention heads")
    if mla.q_lora_rank is None:
        work.linear(t, h, heads * mla.qk_head_dim)
    else:
        work.linear(t, h, mla.q_lora_rank)
        work.norm(t, mla.q_lora_rank)
        work.linear(t, mla.q_lora_rank, heads * mla.qk_head_dim)
    work.linear(t, h, mla.kv_lora_rank + mla.qk_rope_head_dim, save_input=False)
    work.norm(t, mla.kv_lora_rank)
    work.linear(t, mla.kv_lora_rank, heads * (mla.qk_nope_head_dim + mla.v_head_dim))
    rope_bytes = t * (heads + 1) * mla.qk_rope_head_dim * s.activation_bytes
    work.elementwise(2 * rope_bytes, 2 * rope_bytes)
    keys = mean_attended_keys(s.seq_len, None)
    _attention_core(
        work, s, heads, heads, mla.qk_head_dim, mla.v_head_dim, keys, model_keys=s.seq_len
    )
    work.linear(t, heads * mla.v_head_dim, h, replicated_input=False)
    work.tp_all_reduce(t, h)


def _mlp(
    work: LayerWork,
    tokens: float,
    h: int,
    width: int,
    gated: bool,
    tp: int,
    *,
    bias: bool = False,
    experts: int = 1,
) -> None:
    """Column-parallel up (and gate), activation, row-parallel down; gated = SwiGLU/GeGLU."""
    a = work.dtype_bytes
    w = split(width, tp)
    work.linear(tokens, h, (2 if gated else 1) * w, bias=bias, experts=experts)
    # The activation reads gate and up (or up) and writes its product; both inputs are saved.
    inputs = (2 if gated else 1) * tokens * w * a
    work.elementwise(inputs + tokens * w * a, 2 * inputs + tokens * w * a, saved_bytes=inputs)
    work.linear(tokens, w, h, bias=bias, experts=experts, replicated_input=False)


def _moe(work: LayerWork, arch: Architecture, s: Settings) -> None:
    """Router, dispatch of tokens*top_k copies, grouped expert GEMMs, combine, shared experts.
    Without expert parallelism tensor parallelism splits each expert's width (Megatron's
    expert-TP). With EP degree e the experts are spread over e ranks, each whole (expert TP
    1, Megatron-Core's choice with EP): a rank routes its sequence-parallel share of the
    tokens, sends the copies bound for other ranks' experts by an all-to-all and gets as many
    back (dispatch), runs its E / e experts on what it receives, and returns the results by a
    second all-to-all (combine); the backward runs both again. The all-to-alls are exposed."""
    moe, tp, t, h, a = arch.moe, s.tensor_parallel, s.tokens, arch.hidden_size, s.activation_bytes
    assert moe is not None
    ep = s.expert_parallel
    if moe.num_experts % ep:
        raise InputError(
            "settings",
            f"expert-parallel degree {ep} does not divide {moe.num_experts} experts",
            "expert_parallel",
        )
    work.linear(t, h, moe.num_experts, save_input=False)  # the router shares the block's input
    work.elementwise(
        t * moe.num_experts * 8, t * moe.num_experts * 8, saved_bytes=t * moe.num_experts * 4
    )  # softmax/top-k in FP32
    routed = t * moe.top_k
    if ep > 1:
        routed /= tp  # each TP rank routes its sequence-parallel share
    work.elementwise(2 * routed * h * a, 2 * routed * h * a)  # permute tokens to experts
    if ep == 1:
        experts, width_split = moe.num_experts, tp
    else:
        moved = 2 * routed * h * a * (ep - 1) / ep  # dispatch and combine: the other ranks' part
        work.ep_all_to_all(F, moved, s.ep_across_nodes)
        work.ep_all_to_all(I, moved, s.ep_across_nodes)
        experts, width_split = moe.num_experts // ep, 1
    gated = arch.gated_mlp
    _mlp(work, routed, h, moe.expert_intermediate_size, gated, width_split, experts=experts)
    work.elementwise(2 * routed * h * a, 2 * routed * h * a)  # weighted un-permute
    if moe.shared_intermediate_size:
        _mlp(work, t, h, moe.shared_intermediate_size, arch.gated_mlp, tp)
        if moe.shared_expert_gate:
            work.linear(t, h, 1, save_input=False)
            work.elementwise(3 * t * h * a, 3 * t * h * a)
    work.tp_all_reduce(t, h)


def _mamba(work: LayerWork, arch: Architecture, spec: LayerSpec, s: Settings) -> None:
    """Mamba-2: in-projection to (z, x, B, C, dt), causal depthwise conv, chunked SSD scan,
    gated norm, out-projection. TP splits heads and groups as Megatron's Mamba mixer does."""
    m, tp, t, h, a = arch.mamba, s.tensor_parallel, s.tokens, arch.hidden_size, s.activation_bytes
    assert m is not None
    heads = split_heads(m.num_heads, tp, "Mamba heads")
    groups = split_heads(m.n_groups, tp, "Mamba groups", replicable=True)
    inner = heads * m.head_dim
    conv = inner + 2 * groups * m.state_size  # x, B and C: the channels the conv runs over
    work.norm(t, h)
    work.linear(t, h, inner + conv + heads)  # z, (x, B, C), dt
    work.params += conv * (m.conv_kernel + 1) + 3 * heads  # conv weight+bias, dt_bias, A, D
    work.elementwise(2 * t * conv * a, 3 * t * conv * a, saved_bytes=t * conv * a)
    # Chunked SSD: C.B^T within chunks (per group, causal half), scores.x (per head, causal
    # half), chunk states B^T.x and their read-out C.state (per head).
    q, n, p = m.chunk_size, m.state_size, m.head_dim
    flops = t * groups * q * n + t * heads * q * p + 4 * t * heads * n * p
    work.scan(flops, t * (conv + heads * 4 + inner) * a)
    work.act_bytes += t * (conv + inner) * a + t * heads * 4  # x/B/C, z, dt in FP32
    work.norm(t, inner, replicated=False)  # gated RMSNorm over y (this rank's heads)
    work.linear(t, inner, h, replicated_input=False)
    work.tp_all_reduce(t, h)
    work.residual(t, h)


def _cross_attention(work: LayerWork, arch: Architecture, spec: LayerSpec, s: Settings) -> None:
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
    _attention_core(work, s, heads, kv_heads, d, d, vision.num_tokens, kv_len=vision.num_tokens)
    work.linear(t, heads * d, h, replicated_input=False)
    work.tp_all_reduce(t, h)
    work.elementwise(3 * t * h * a, 3 * t * h * a)  # tanh-gated residual
    work.params += 2  # attention and MLP gates
    work.norm(t, h)
    _mlp(work, t, h, arch.intermediate_size, arch.gated_mlp, tp)
    work.tp_all_reduce(t, h)
    work.elementwise(3 * t * h * a, 3 * t * h * a)


# Ends of the text stack -------------------------------------------------------------------


def _embedding(work: LayerWork, arch: Architecture, spec: LayerSpec, s: Settings) -> None:
    """Vocab-parallel gather (each rank looks up its rows, then an all-reduce). No input
    gradient; W scatters the output gradient into the table."""
    tp, t, h, a = s.tensor_parallel, s.tokens, arch.hidden_size, s.activation_bytes
    out = t * h * a
    rows = split(arch.vocab_size + arch.extra_vocab, tp)
    # F reads rows and writes the output. W produces a dense gradient of the whole table (as
    # PyTorch's and Megatron's embeddings do): zero it, then scatter-add the output gradient.
    table = rows * h * a
    work.elementwise(2 * out, 0.0, w_bytes=2 * table + 3 * out)
    work.tp_all_reduce(t, h, backward=False)
    work.params += rows * h
    if arch.learned_positions:  # GPT-2: add a learned position table (replicated across TP)
        positions = arch.learned_positions * h * a
        work.elementwise(3 * out, 0.0, w_bytes=2 * positions + 2 * out)
        work.params += arch.learned_positions * h
    if s.dropout > 0:  # embedding dropout: a 1-byte mask
        work.elementwise(2 * out + t * h, 0.0, saved_bytes=t * h)
    ids = t * TOKEN_ID_BYTES
    work.act_bytes += ids
    work.wact_bytes += ids


def _final_norm(work: LayerWork, arch: Architecture, spec: LayerSpec, s: Settings) -> None:
    work.norm(s.tokens, arch.hidden_size, bias=arch.norm_bias)


def _head(work: LayerWork, arch: Architecture, spec: LayerSpec, s: Settings) -> None:
    """Vocab-parallel output projection, optional logit soft-cap, cross-entropy in FP32. With
    tied embeddings the weight is a copy of the embedding table on this stage."""
    tp, t, h, a = s.tensor_parallel, s.tokens, arch.hidden_size, s.activation_bytes
    vocab = split(arch.vocab_size, tp)
    work.linear(t, h, vocab)
    logits = t * vocab
    if arch.final_logit_softcap is not None:
        work.elementwise(2 * logits * a, 3 * logits * a)
    # Unfused FP32 cross-entropy, as eager PyTorch runs it: F upcasts (read a, write 4) and
    # takes the log-softmax (read 4, write 4, saved for the backward), the loss reads it (4);
    # I writes the loss gradient (4), the log-softmax backward reads two and writes one (12),
    # the downcast reads 4 and writes a. Calibrated against an H200 (docs/COSTMODEL.md).
    work.elementwise(logits * (a + 12), logits * (20 + a), saved_bytes=logits * 4)


# Vision tower and projector ---------------------------------------------------------------


def _vision_embed(work: LayerWork, arch: Architecture, spec: LayerSpec, s: Settings) -> None:
    """Patch convolution as a GEMM, class token, position and tile embeddings, pre-norm."""
    v = arch.vision
    assert v is not None
    tokens = s.micro_batch_size * v.num_tokens
    patch_pixels = v.num_channels * v.patch_size**2
    work.linear(tokens, patch_pixels, v.hidden_size, input_grad=False)
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


def _vision_block(work: LayerWork, arch: Architecture, spec: LayerSpec, s: Settings) -> None:
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
    _attention_core(
        work, s, heads, heads, d, d, v.num_tokens, kv_len=v.num_tokens, q_len=v.num_tokens
    )
    work.linear(tokens, heads * d, hv, replicated_input=False)
    work.tp_all_reduce(tokens, hv)
    work.residual(tokens, hv)
    work.norm(tokens, hv)
    work.params += hv
    _mlp(work, tokens, hv, v.intermediate_size, False, tp, bias=True)
    work.tp_all_reduce(tokens, hv)
    work.residual(tokens, hv)
    if spec.index is not None and spec.index >= v.num_layers - v.num_global_layers:
        work.params += 2  # gated global block: attention and MLP gates


def _projector(work: LayerWork, arch: Architecture, spec: LayerSpec, s: Settings) -> None:
    """Linear map of the tower's concatenated features into the text width."""
    v = arch.vision
    assert v is not None
    tokens = s.micro_batch_size * v.num_tokens
    work.linear(tokens, v.output_dim, arch.hidden_size, bias=True)


_BUILDERS = {
    A.EMBEDDING: _embedding,
    A.DECODER: _decoder,
    A.MOE: _decoder,
    A.MAMBA: _mamba,
    A.ATTENTION: _hybrid_attention,
    A.MLP: _hybrid_mlp,
    A.NORM: _final_norm,
    A.HEAD: _head,
    A.VISION_EMBED: _vision_embed,
    A.VISION_BLOCK: _vision_block,
    A.PROJECTOR: _projector,
    A.CROSS_ATTENTION: _cross_attention,
}


# What crosses a stage boundary --------------------------------------------------------------


def boundary_bytes(arch: Architecture, specs: list[LayerSpec], index: int, s: Settings) -> int:
    """Bytes of every stream leaving layer `index` for one microbatch: the hidden states, and in
    the VLM the vision stream with its collected intermediate features, the token ids, and the
    image features until the last cross-attention layer has used them."""
    spec = specs[index]
    a = s.activation_bytes
    sp = s.tensor_parallel if s.sequence_parallel or s.split_boundary else 1
    if spec.kind == A.HEAD:
        return 4  # the loss
    v = arch.vision
    image_tokens = s.micro_batch_size * v.num_tokens if v is not None else 0
    ids = s.tokens * TOKEN_ID_BYTES
    if spec.kind in (A.VISION_EMBED, A.VISION_BLOCK):
        assert v is not None
        collected = (
            0 if spec.index is None else sum(1 for i in v.intermediate_layers if i <= spec.index)
        )
        width = v.hidden_size * (1 + collected)
        return int(image_tokens * width * a / sp + ids)
    text = s.tokens * arch.hidden_size * a / sp
    if spec.kind == A.PROJECTOR:
        return int(image_tokens * arch.hidden_size * a / sp + ids)
    if arch.cross_attention_layers:
        last = max(arch.cross_attention_layers)
        position = (
            -1 if spec.kind == A.EMBEDDING else (spec.index if spec.index is not None else 1 << 30)
        )
        if position < last:
            text += image_tokens * arch.hidden_size * a / sp
    return int(text)
