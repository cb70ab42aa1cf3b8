"""Context parallelism: each rank of a CP group holds 1/C of every sequence, and attention
runs as ring attention over the group.

**The split.** A sequence of s tokens is cut into 2C chunks; CP rank i holds chunks i and
2C-1-i (one from the front, its mirror from the back, as Megatron-Core and torchtitan do), so
every rank has the same share of the causal mask's work. `positions(s, C, i)` are the global
positions of rank i's tokens, in the order it holds them; inputs and targets are cut by them
(`shard`), rotary embeddings use them.

**Ring attention** (`RingAttention`), what docs/COSTMODEL.md prices: the rank's queries attend
to its own keys and values, then to every other rank's, received in turn from its neighbour
while it computes on the block it has (C - 1 point-to-point exchanges of K and V), each block's
result merged by the online-softmax rule (running log-sum-exp). The causal mask (and a sliding
window) is computed from the global positions of both blocks. The backward passes K and V
around the ring again, with the gradients of K and V accumulating as they travel, and one last
hop brings each block's gradients home. torch's own
`torch.distributed.tensor.experimental.context_parallel` does not run here: on CPU (gloo) the
attention op has no sharding strategy in torch 2.13
(`aten._scaled_dot_product_flash_attention_for_cpu`), and it takes only `is_causal`, not the
windows and explicit masks our models use. So it is built on `torch.distributed` point-to-point.

`apply_cp(part, group)` marks a stage's attention modules (ours and transformers' routed ones);
nothing else in a layer needs to know: every other op is per token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from octopipe.errors import InputError

# Set on a stage's pruned model: its CP group (the hf adapter reads its positions there).
CONTEXT = "_octopipe_context"


@dataclass(frozen=True)
class ContextGroup:
    """This rank's CP group: `size` ranks (global `ranks`, in CP order), this one the
    `rank`-th."""

    size: int
    rank: int
    ranks: tuple[int, ...]
    group: dist.ProcessGroup | None  # None at CP 1

    def positions(self, local_len: int, device: torch.device | None = None) -> torch.Tensor:
        """The global positions of the rank's `local_len` tokens."""
        return positions(local_len * self.size, self.size, self.rank, device)

    def shard(self, t: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """The rank's part of a whole sequence (dimension `dim`)."""
        return shard(t, self.size, self.rank, dim)


def positions(seq_len: int, size: int, rank: int, device=None) -> torch.Tensor:
    """Global positions of CP rank `rank`'s tokens: chunks `rank` and `2 size - 1 - rank` of
    `2 size` equal chunks."""
    if seq_len % (2 * size):
        raise InputError(
            "--seq-len",
            f"{seq_len} tokens do not split into {2 * size} equal chunks (context parallelism "
            f"{size}: each rank holds a chunk from the front and its mirror from the back)",
        )
    chunk = seq_len // (2 * size)
    ar = torch.arange(chunk, device=device)
    return torch.cat([ar + rank * chunk, ar + (2 * size - 1 - rank) * chunk])


def shard(t: torch.Tensor, size: int, rank: int, dim: int = 1) -> torch.Tensor:
    if size == 1:
        return t
    return t.index_select(dim, positions(t.shape[dim], size, rank, t.device)).contiguous()


def _allowed(pos_q: torch.Tensor, pos_k: torch.Tensor, window: int | None) -> torch.Tensor:
    ok = pos_k[None, :] <= pos_q[:, None]
    if window is not None:
        ok &= (pos_q[:, None] - pos_k[None, :]) < window
    return ok


class _Ring:
    """Point-to-point exchanges with the ring's neighbours, posted together, waited together."""

    def __init__(self, cp: ContextGroup) -> None:
        self.cp = cp
        self.next = cp.ranks[(cp.rank + 1) % cp.size]
        self.prev = cp.ranks[(cp.rank - 1) % cp.size]

    def shift(self, t: torch.Tensor, tag: int) -> tuple[list[dist.Work], torch.Tensor]:
        """Send `t` to the next rank, receive the previous rank's into a new buffer."""
        got = torch.empty_like(t)
        works = [
            dist.isend(t.contiguous(), self.next, group=self.cp.group, tag=tag),
            dist.irecv(got, self.prev, group=self.cp.group, tag=tag),
        ]
        return works, got


def _wait(works: list[dist.Work]) -> None:
    for w in works:
        w.wait()


class RingAttention(torch.autograd.Function):
    """softmax(q k^T * scale, causal by global position) v over the CP group. q, k, v:
    [batch, heads, local tokens, head dim] (k and v with q's heads)."""

    @staticmethod
    def forward(ctx, q, k, v, cp: ContextGroup, scale: float, window):  # type: ignore[override]
        ring, n = _Ring(cp), q.shape[2]
        pos_q = cp.positions(n, q.device)
        out = torch.zeros_like(q, dtype=torch.float32)
        lse = torch.full(q.shape[:3], float("-inf"), dtype=torch.float32, device=q.device)
        kv = torch.stack([k, v])
        for step in range(cp.size):
            src = (cp.rank - step) % cp.size
            works, nxt = ring.shift(kv, step) if step < cp.size - 1 else ([], kv)
            mask = _allowed(pos_q, positions(n * cp.size, cp.size, src, q.device), window)
            scores = (q.float() @ kv[0].float().transpose(-2, -1) * scale).masked_fill(
                ~mask, float("-inf")
            )
            block_lse = scores.logsumexp(-1)
            safe = torch.where(block_lse.isfinite(), block_lse, torch.zeros_like(block_lse))
            block_out = (scores - safe[..., None]).exp() @ kv[1].float()
            new_lse = torch.logaddexp(lse, block_lse)
            keep = torch.where(lse.isfinite(), (lse - new_lse).exp(), torch.zeros_like(lse))
            take = torch.where(block_lse.isfinite(), (block_lse - new_lse).exp(), keep * 0)
            out = out * keep[..., None] + block_out * take[..., None]
            lse = torch.where(new_lse.isfinite(), new_lse, lse)
            _wait(works)
            kv = nxt
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.cp, ctx.scale, ctx.window = cp, scale, window
        return out

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors
        cp, scale, window = ctx.cp, ctx.scale, ctx.window
        ring, n, C = _Ring(cp), q.shape[2], cp.size
        pos_q = cp.positions(n, q.device)
        g = grad_out.float()
        delta = (g * out.float()).sum(-1)
        dq = torch.zeros_like(q, dtype=torch.float32)
        kv = torch.stack([k, v])
        dkv = torch.zeros_like(kv, dtype=torch.float32)  # the block in hand's, as it travels
        for step in range(C):
            src = (cp.rank - step) % C
            works, nxt = ring.shift(kv, 2 * step) if step < C - 1 else ([], kv)
            kb, vb = kv[0].float(), kv[1].float()
            mask = _allowed(pos_q, positions(n * C, C, src, q.device), window)
            scores = (q.float() @ kb.transpose(-2, -1) * scale).masked_fill(~mask, float("-inf"))
            p = (scores - lse[..., None]).exp()
            dv = p.transpose(-2, -1) @ g
            ds = p * (g @ vb.transpose(-2, -1) - delta[..., None])
            dq += ds @ kb * scale
            dk = ds.transpose(-2, -1) @ q.float() * scale
            dkv = dkv + torch.stack([dk, dv])
            # Pass this block's gradients on with it; after the last step, one more hop takes
            # each block's home (the next rank owns the block held last).
            sent, dkv = ring.shift(dkv, 2 * step + 1) if C > 1 else ([], dkv)
            _wait(works + sent)
            kv = nxt
        return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), None, None, None


def ring_attention(q, k, v, cp: ContextGroup, scale: float, window: int | None = None):
    """Causal attention of the rank's queries over the whole sequence of the CP group; k and v
    may have fewer heads than q (grouped-query attention)."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    return RingAttention.apply(q, k, v, cp, scale, window)


class ContextAttention:
    """What an attention module of a CP stage runs: the rank's positions and the ring."""

    def __init__(self, cp: ContextGroup, window: int | None = None) -> None:
        self.cp, self.window = cp, window

    def positions(self, local_len: int, device: torch.device) -> torch.Tensor:
        return self.cp.positions(local_len, device)

    def attend(self, q, k, v, scale: float) -> torch.Tensor:
        return ring_attention(q, k, v, self.cp, scale, self.window)


def apply_cp(part: nn.Module, cp: ContextGroup) -> None:
    """Make a (pruned, meta) model's attention run over the CP group; refuse, in one line, a
    layer context parallelism does not run."""
    from octopipe.models.attention import (
        CrossAttention,
        LatentAttention,
        SelfAttention,
    )
    from octopipe.models.mamba import Mamba2Mixer

    setattr(part, CONTEXT, cp)
    for fqn, module in part.named_modules():
        if isinstance(module, SelfAttention):
            if not module.causal or module.softcap is not None:
                raise _not_run(fqn, "bidirectional or soft-capped attention")
            hook = ContextAttention(cp, module.window)
            module.context = hook
            module.core.context = hook
        elif isinstance(module, LatentAttention | CrossAttention | Mamba2Mixer):
            raise _not_run(fqn, type(module).__name__)
        elif _is_hf_attention(module):
            module._octopipe_context = ContextAttention(cp, getattr(module, "sliding_window", None))


def _is_hf_attention(module: nn.Module) -> bool:
    return all(hasattr(module, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj", "config"))


def _not_run(fqn: str, what: str) -> InputError:
    return InputError("--cp", f"{fqn}: context parallelism does not run {what} yet; use --cp 1")


def context_of(part: nn.Module) -> ContextGroup | None:
    """The CP group a stage's model runs over (None without CP)."""
    return getattr(part, CONTEXT, None)
