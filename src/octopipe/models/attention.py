"""Attention building blocks: RMSNorm, rotary embeddings, self-attention and cross-attention.

Plain torch, one small module per idea, shapes passed in explicitly (the caller reads them from
the architecture config). Nothing here knows about pipeline layers or activation tuples. Norms
and rotary embeddings keep what fused kernels keep (`lean`); the attention core runs the fused
kernel with its own causal mask and grouped heads wherever it can, so that it keeps q, k, v, its
output and the log-sum-exp only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from octopipe.models.lean import rms_norm, rope


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def causal_mask(seq: int, window: int | None, device: torch.device) -> torch.Tensor:
    """True where query i may attend key j: j <= i, and within `window` tokens when given."""
    i = torch.arange(seq, device=device)[:, None]
    j = torch.arange(seq, device=device)[None, :]
    allowed = j <= i
    if window is not None:
        allowed &= (i - j) < window
    return allowed


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    softcap: float | None = None,
) -> torch.Tensor:
    """Scaled dot-product attention over [batch, heads, seq, head_dim]; k/v may have fewer heads."""
    if softcap is None:
        grouped = k.shape[1] != q.shape[1]
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=scale, enable_gqa=grouped
        )
    # Gemma-2 caps the logits with tanh, which the fused kernel cannot express.
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = softcap * torch.tanh((q @ k.transpose(-2, -1)) * scale / softcap)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(-1) @ v


class AttentionCore(nn.Module):
    """softmax(q k^T) v, weightless: a module of its own so that a stage recomputing its
    attention cores only (selective recomputation) can checkpoint exactly this part.
    `context`, when set, attends over the whole sequence of which q, k, v hold a share (the
    executor's context parallelism: `attend(q, k, v, scale)`)."""

    context = None

    def __init__(self, scale: float, softcap: float | None = None, causal: bool = False):
        super().__init__()
        self.scale, self.softcap, self.causal = scale, softcap, causal

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        if self.context is not None:
            return self.context.attend(q, k, v, self.scale)
        if self.causal:  # the fused kernel's own mask
            grouped = k.shape[1] != q.shape[1]
            return F.scaled_dot_product_attention(
                q, k, v, is_causal=True, scale=self.scale, enable_gqa=grouped
            )
        return attend(q, k, v, mask, self.scale, self.softcap)


class SelfAttention(nn.Module):
    """Grouped-query self-attention; causal with RoPE for text, bidirectional without for vision.
    `context`, when set, gives the positions of the tokens it holds (`positions(n, device)`:
    the executor's context parallelism, whose core then attends over the whole sequence)."""

    context = None

    def __init__(
        self,
        dim: int,
        n_heads: int,
        n_kv_heads: int,
        head_dim: int,
        *,
        causal: bool = True,
        rope_theta: float | None = 10000.0,
        window: int | None = None,
        softcap: float | None = None,
        scale: float | None = None,
        bias: bool = False,
        qk_norm: bool = False,
    ):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.causal, self.rope_theta = causal, rope_theta
        self.window, self.softcap = window, softcap
        self.scale = scale if scale is not None else head_dim**-0.5
        # Causal, unwindowed and uncapped: the fused kernel masks by itself (no mask to keep).
        plain_causal = causal and window is None and softcap is None
        self.core = AttentionCore(self.scale, softcap, causal=plain_causal)
        self.wq = nn.Linear(dim, n_heads * head_dim, bias=bias)
        self.wk = nn.Linear(dim, n_kv_heads * head_dim, bias=bias)
        self.wv = nn.Linear(dim, n_kv_heads * head_dim, bias=bias)
        self.wo = nn.Linear(n_heads * head_dim, dim, bias=False)
        # Gemma-3 / Qwen-3 normalize each head's queries and keys before RoPE.
        self.q_norm = RMSNorm(head_dim) if qk_norm else nn.Identity()
        self.k_norm = RMSNorm(head_dim) if qk_norm else nn.Identity()

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        # Heads counted from the width: under tensor parallelism a rank holds some of them.
        return x.view(x.shape[0], x.shape[1], -1, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.q_norm(self._heads(self.wq(x)))
        k = self.k_norm(self._heads(self.wk(x)))
        v = self._heads(self.wv(x))
        where = None if self.context is None else self.context.positions(x.shape[1], x.device)
        if self.rope_theta is not None:
            q, k = rope(q, self.rope_theta, where), rope(k, self.rope_theta, where)
        mask = None
        if self.causal and self.context is None and not self.core.causal:
            mask = causal_mask(x.shape[1], self.window, x.device)
        out = self.core(q, k, v, mask)
        return self.wo(out.transpose(1, 2).flatten(2))


class CrossAttention(nn.Module):
    """Text queries attend to every image feature (Llama-3.2-Vision: no RoPE, no mask, per-head
    RMSNorm of queries and keys)."""

    def __init__(self, dim: int, n_heads: int, n_kv_heads: int, head_dim: int, eps: float = 1e-5):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.wq = nn.Linear(dim, n_heads * head_dim, bias=False)
        self.wk = nn.Linear(dim, n_kv_heads * head_dim, bias=False)
        self.wv = nn.Linear(dim, n_kv_heads * head_dim, bias=False)
        self.wo = nn.Linear(n_heads * head_dim, dim, bias=False)
        self.q_norm = RMSNorm(head_dim, eps)
        self.k_norm = RMSNorm(head_dim, eps)
        self.core = AttentionCore(head_dim**-0.5)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        # Heads counted from the width: under tensor parallelism a rank holds some of them.
        return x.view(x.shape[0], x.shape[1], -1, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        q = self.q_norm(self._heads(self.wq(x)))
        k = self.k_norm(self._heads(self.wk(image)))
        v = self._heads(self.wv(image))
        out = self.core(q, k, v)
        return self.wo(out.transpose(1, 2).flatten(2))


class LatentAttention(nn.Module):
    """DeepSeek-V2/V3 multi-head latent attention (MLA).

    Queries (optionally) and keys/values pass through low-rank latents; a small slice of each
    query and one shared key slice carry RoPE, the rest carries no position.
    """

    def __init__(
        self,
        dim: int,
        n_heads: int,
        q_lora_rank: int | None,
        kv_lora_rank: int,
        nope_dim: int,
        rope_dim: int,
        v_dim: int,
        rope_theta: float = 10000.0,
    ):
        super().__init__()
        self.n_heads, self.nope_dim, self.rope_dim, self.v_dim = n_heads, nope_dim, rope_dim, v_dim
        self.kv_lora_rank, self.rope_theta = kv_lora_rank, rope_theta
        qk_dim = nope_dim + rope_dim
        if q_lora_rank is None:
            self.wq = nn.Linear(dim, n_heads * qk_dim, bias=False)
        else:
            self.wq = nn.Sequential(
                nn.Linear(dim, q_lora_rank, bias=False),
                RMSNorm(q_lora_rank),
                nn.Linear(q_lora_rank, n_heads * qk_dim, bias=False),
            )
        self.wkv_a = nn.Linear(dim, kv_lora_rank + rope_dim, bias=False)
        self.kv_norm = RMSNorm(kv_lora_rank)
        self.wkv_b = nn.Linear(kv_lora_rank, n_heads * (nope_dim + v_dim), bias=False)
        self.wo = nn.Linear(n_heads * v_dim, dim, bias=False)
        self.core = AttentionCore(qk_dim**-0.5, causal=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q = self.wq(x).view(batch, seq, self.n_heads, -1).transpose(1, 2)
        q_nope, q_rope = q.split([self.nope_dim, self.rope_dim], -1)
        latent, k_rope = self.wkv_a(x).split([self.kv_lora_rank, self.rope_dim], -1)
        kv = self.wkv_b(self.kv_norm(latent)).view(batch, seq, self.n_heads, -1).transpose(1, 2)
        k_nope, v = kv.split([self.nope_dim, self.v_dim], -1)
        k_rope = rope(k_rope[:, None], self.rope_theta).expand(-1, self.n_heads, -1, -1)
        q = torch.cat([q_nope, rope(q_rope, self.rope_theta)], -1)
        k = torch.cat([k_nope, k_rope], -1)
        out = self.core(q, k, v)
        return self.wo(out.transpose(1, 2).flatten(2))
