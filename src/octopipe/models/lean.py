"""Autograd functions that keep for the backward what fused GPU kernels keep, and no more.

Eager PyTorch saves every intermediate of a norm, a gated activation or a rotary embedding;
Megatron-Core's fused and Transformer Engine kernels keep only their inputs (and a norm's
per-token scale). The cost model prices the fused kernels (docs/COSTMODEL.md, "Saved
activations"), so our models run these: what a plan prices is what a rank holds. The math is
the eager one; each backward recomputes the little it needs.

- `rms_norm(x, weight, eps, offset)`: saves x and the per-token 1/rms (float32);
- `gated(gate, up, act)`: act(gate) * up, saves gate and up (SwiGLU, GeGLU, squared ReLU);
- `rope(x, theta, positions)`: rotary embedding, saves nothing but the positions it was given;
- `in_compute_dtype(x)`: x in the autocast dtype where autocast is on: the residual stream
  starts there (at the token embedding), so that it is kept in BF16 as Megatron-Core keeps it,
  not in the FP32 of autocast's weights.

Under autocast a norm answers in the autocast dtype, as a fused norm in a BF16 region does: the
projections after it share its output instead of each keeping a cast of their own.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype x's device computes in: autocast's where it is on, else x's own."""
    device = x.device.type
    if x.is_floating_point() and torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return x.dtype


def in_compute_dtype(x: torch.Tensor) -> torch.Tensor:
    return x.to(compute_dtype(x))


def _wide(x: torch.Tensor) -> torch.Tensor:
    """x in at least float32 (float64 stays)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps: float, offset: float):
        # 1/rms in float32, as fused kernels and Hugging Face's eager norms compute it.
        rstd = torch.rsqrt(_wide(x).pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        ctx.offset = offset
        scaled = (_wide(x) * rstd) * (weight + offset if offset else weight)
        return scaled.to(compute_dtype(x))

    @staticmethod
    def backward(ctx, grad):
        x, weight, rstd = ctx.saved_tensors
        normed = _wide(x) * rstd
        g = _wide(grad) * (weight + ctx.offset if ctx.offset else weight)
        dx = rstd * (g - normed * (g * normed).mean(-1, keepdim=True))
        dweight = None
        if ctx.needs_input_grad[1]:
            dweight = (_wide(grad) * normed).reshape(-1, normed.shape[-1]).sum(0)
            dweight = dweight.to(weight.dtype)
        return dx.to(x.dtype), dweight, None, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0):
    """x / rms(x) * (weight + offset), keeping x and the per-token 1/rms for the backward."""
    return _RMSNorm.apply(x, weight, eps, offset)


class _Gated(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up, act: Callable[[torch.Tensor], torch.Tensor]):
        ctx.save_for_backward(gate, up)
        ctx.act = act
        return act(gate) * up

    @staticmethod
    def backward(ctx, grad):
        gate, up = ctx.saved_tensors
        with torch.enable_grad():  # the activation redone, its derivative by autograd
            g = gate.detach().requires_grad_(True)
            activated = ctx.act(g)
            (dgate,) = torch.autograd.grad(activated, g, grad * up)
        return dgate, grad * activated.detach(), None


def gated(gate: torch.Tensor, up: torch.Tensor, act: Callable[[torch.Tensor], torch.Tensor]):
    """act(gate) * up, keeping gate and up only (the activation is redone in the backward)."""
    return _Gated.apply(gate, up, act)


def _rotation(x: torch.Tensor, theta: float, positions: torch.Tensor | None):
    """cos and sin of each position's angles, [seq, head_dim] (rotate-half layout)."""
    seq, head_dim = x.shape[-2], x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, device=x.device, dtype=x.dtype) / head_dim)
    if positions is None:
        positions = torch.arange(seq, device=x.device)
    angles = torch.outer(positions.to(x.dtype), inv_freq)
    angles = torch.cat([angles, angles], -1)
    return angles.cos(), angles.sin()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], -1)


class _Rope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, theta: float, positions):
        ctx.theta = theta
        ctx.save_for_backward(*(() if positions is None else (positions,)))
        cos, sin = _rotation(x, theta, positions)
        return x * cos + _rotate_half(x) * sin

    @staticmethod
    def backward(ctx, grad):
        positions = ctx.saved_tensors[0] if ctx.saved_tensors else None
        cos, sin = _rotation(grad, ctx.theta, positions)
        # The rotation's transpose: rotate_half's adjoint is minus itself.
        return grad * cos - _rotate_half(grad * sin), None, None


def rope(x: torch.Tensor, theta: float, positions: torch.Tensor | None = None) -> torch.Tensor:
    """Rotate [batch, heads, seq, head_dim] by position (rotate-half layout, as in HF LLaMA);
    `positions` of the tokens along seq (default 0, 1, ...). Keeps nothing of x."""
    return _Rope.apply(x, theta, positions)
