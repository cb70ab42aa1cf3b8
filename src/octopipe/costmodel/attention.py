"""The attention blocks' work on one tensor-parallel rank: grouped-query self-attention, the
attention core (flash or unfused, with context parallelism's ring exchange) and DeepSeek's
multi-head latent attention. Pure functions appending to a `LayerWork`."""

from __future__ import annotations

from octopipe.costmodel.arch import Architecture
from octopipe.costmodel.settings import Settings
from octopipe.costmodel.shards import split_heads
from octopipe.costmodel.work import F, I, LayerWork, mean_attended_keys


def self_attention(work: LayerWork, arch: Architecture, s: Settings, window: int | None) -> None:
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
    work.linear(t, h, heads * d, bias=att.bias, fused_cast=True)  # cast in the norm
    work.linear(t, h, 2 * kv_heads * d, bias=att.bias, save_input=False)
    if att.qk_norm:
        work.norm(t * heads, d, replicated=False)
        work.norm(t * kv_heads, d, replicated=False)
    if not arch.learned_positions:
        rope_bytes = t * (heads + kv_heads) * d * a
        work.elementwise(2 * rope_bytes, 2 * rope_bytes)
    keys = mean_attended_keys(s.seq_len, window)
    attention_core(
        work, s, heads, kv_heads, d, d, keys, model_keys=min(window or s.seq_len, s.seq_len)
    )
    work.linear(t, heads * d, h, bias=arch.mlp_bias, replicated_input=False)
    work.tp_all_reduce(t, h)


def attention_core(
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
            work.attention(n * q, n * kv, keys_per_query, heads, kv_heads, qk_dim, v_dim, q)
        c = s.context_parallel
        if c > 1:
            chunk = n * q * kv_heads * (qk_dim + v_dim) * s.activation_bytes
            work.cp_exchange(F, (c - 1) * chunk, s.cp_across_nodes)
            work.cp_exchange(I, 2 * (c - 1) * chunk, s.cp_across_nodes)


def latent_attention(work: LayerWork, arch: Architecture, s: Settings) -> None:
    """DeepSeek MLA: replicated down-projections with norms, head-split up-projections."""
    mla, tp, t, h = arch.latent_attention, s.tensor_parallel, s.tokens, arch.hidden_size
    assert mla is not None
    heads = split_heads(mla.num_heads, tp, "attention heads")
    if mla.q_lora_rank is None:
        work.linear(t, h, heads * mla.qk_head_dim, fused_cast=True)
    else:
        work.linear(t, h, mla.q_lora_rank, fused_cast=True)
        work.norm(t, mla.q_lora_rank)
        work.linear(t, mla.q_lora_rank, heads * mla.qk_head_dim, fused_cast=True)
    work.linear(t, h, mla.kv_lora_rank + mla.qk_rope_head_dim, save_input=False)
    work.norm(t, mla.kv_lora_rank)
    work.linear(
        t, mla.kv_lora_rank, heads * (mla.qk_nope_head_dim + mla.v_head_dim), fused_cast=True
    )
    rope_bytes = t * (heads + 1) * mla.qk_rope_head_dim * s.activation_bytes
    work.elementwise(2 * rope_bytes, 2 * rope_bytes)
    keys = mean_attended_keys(s.seq_len, None)
    attention_core(
        work, s, heads, heads, mla.qk_head_dim, mla.v_head_dim, keys, model_keys=s.seq_len
    )
    work.linear(t, heads * mla.v_head_dim, h, replicated_input=False)
    work.tp_all_reduce(t, h)
