"""Per-layer analytic work: FLOPs, bytes, saved activations and parameters of each layer kind.

`layer_work(arch, spec, settings)` describes what one tensor-parallel rank does for one
microbatch; `boundary_bytes` what crosses a stage boundary after a layer. Megatron-style tensor
parallelism splits heads, MLP width, experts and vocabulary; norms, routers and MLA's
down-projections stay replicated. Pure functions of their arguments.
"""

from __future__ import annotations

from octopipe.costmodel import arch as A
from octopipe.costmodel.arch import Architecture, LayerSpec
from octopipe.costmodel.attention import latent_attention, self_attention
from octopipe.costmodel.feedforward import mlp, moe
from octopipe.costmodel.settings import Settings
from octopipe.costmodel.shards import split, split_heads
from octopipe.costmodel.vision import cross_attention, projector, vision_block, vision_embed
from octopipe.costmodel.work import LayerWork

TOKEN_ID_BYTES = 8  # int64 token ids travel with the image stream through the vision tower


def layer_work(arch: Architecture, spec: LayerSpec, settings: Settings) -> LayerWork:
    """The work of one layer for one microbatch on one tensor-parallel rank."""
    work = LayerWork(
        settings.tensor_parallel,
        settings.sequence_parallel,
        settings.activation_bytes,
        settings.tp_comm_overlap,
        settings.precision,
        settings.fp8_scaling,
        ep_overlap=settings.moe_a2a_overlap,
        keeps_gathered=settings.tp_keeps_gathered,
        weight_copies=settings.weight_copies and settings.precision == "bf16",
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
        latent_attention(work, arch, s)
    else:
        self_attention(work, arch, s, spec.window)
    _post_norm(work, arch, t)
    work.residual(t, h, dropout)
    work.norm(t, h, bias=arch.norm_bias)
    if spec.ffn == "moe":
        moe(work, arch, s)
    else:
        mlp(
            work,
            t,
            h,
            arch.intermediate_size,
            arch.gated_mlp,
            s.tensor_parallel,
            bias=arch.mlp_bias,
            fused_casts=True,
        )
        work.tp_all_reduce(t, h)
    _post_norm(work, arch, t)
    work.residual(t, h, dropout)


def _post_norm(work: LayerWork, arch: Architecture, tokens: int) -> None:
    if arch.family == A.GEMMA:
        work.norm(tokens, arch.hidden_size)


def _hybrid_attention(work: LayerWork, arch: Architecture, spec: LayerSpec, s: Settings) -> None:
    work.norm(s.tokens, arch.hidden_size)
    self_attention(work, arch, s, spec.window)
    work.residual(s.tokens, arch.hidden_size, s.dropout > 0)


def _hybrid_moe(work: LayerWork, arch: Architecture, spec: LayerSpec, s: Settings) -> None:
    """Nemotron-H's `E` layer: norm, mixture of experts, residual."""
    work.norm(s.tokens, arch.hidden_size)
    moe(work, arch, s)
    work.residual(s.tokens, arch.hidden_size, s.dropout > 0)


def _hybrid_mlp(work: LayerWork, arch: Architecture, spec: LayerSpec, s: Settings) -> None:
    work.norm(s.tokens, arch.hidden_size)
    mlp(
        work,
        s.tokens,
        arch.hidden_size,
        arch.intermediate_size,
        arch.gated_mlp,
        s.tensor_parallel,
        fused_casts=True,
    )
    work.tp_all_reduce(s.tokens, arch.hidden_size)
    work.residual(s.tokens, arch.hidden_size, s.dropout > 0)


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
    work.linear(t, h, inner + conv + heads, fused_cast=True)  # z, (x, B, C), dt
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
    work.wgrad_bytes += out  # W scatters it into the table


def _final_norm(work: LayerWork, arch: Architecture, spec: LayerSpec, s: Settings) -> None:
    work.norm(s.tokens, arch.hidden_size, bias=arch.norm_bias)


def _head(work: LayerWork, arch: Architecture, spec: LayerSpec, s: Settings) -> None:
    """Vocab-parallel output projection, optional logit soft-cap, cross-entropy in FP32. With
    tied embeddings the weight is a copy of the embedding table on this stage."""
    tp, t, h, a = s.tensor_parallel, s.tokens, arch.hidden_size, s.activation_bytes
    vocab = split(arch.vocab_size, tp)
    work.linear(t, h, vocab, quantizable=False)  # the output layer stays BF16 under FP8
    logits = t * vocab
    if arch.final_logit_softcap is not None:
        work.elementwise(2 * logits * a, 3 * logits * a)
    # Unfused FP32 cross-entropy, as eager PyTorch runs it: F upcasts (read a, write 4) and
    # takes the log-softmax (read 4, write 4, saved for the backward), the loss reads it (4);
    # I writes the loss gradient (4), the log-softmax backward reads two and writes one (12),
    # the downcast reads 4 and writes a. Calibrated against an H200 (docs/COSTMODEL.md).
    work.elementwise(logits * (a + 12), logits * (20 + a), saved_bytes=logits * 4)


_BUILDERS = {
    A.EMBEDDING: _embedding,
    A.DECODER: _decoder,
    A.MOE: _decoder,
    A.MAMBA: _mamba,
    A.ATTENTION: _hybrid_attention,
    A.MLP: _hybrid_mlp,
    A.MOE_MLP: _hybrid_moe,
    A.NORM: _final_norm,
    A.HEAD: _head,
    A.VISION_EMBED: vision_embed,
    A.VISION_BLOCK: vision_block,
    A.PROJECTOR: projector,
    A.CROSS_ATTENTION: cross_attention,
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
