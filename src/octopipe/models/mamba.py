"""A Mamba-2 style selective state-space mixer in plain torch.

The scan is computed in its quadratic "state-space dual" form over the whole sequence (one
chunk): exact, vectorized, and cheap at the short sequences the bundled models use. A mask
keeps future positions out before the exponential, so nothing overflows.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def ssd_scan(
    x: torch.Tensor, dt: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor
) -> torch.Tensor:
    """y_i = sum_{j<=i} exp(sum_{j<k<=i} dt_k a) dt_j (c_i . b_j) x_j, for every head.

    x: [batch, seq, heads, head_dim]; dt: [batch, seq, heads] (positive); a: [heads] (negative);
    b, c: [batch, seq, heads, state]. Equivalent to the recurrence
    h_i = exp(dt_i a) h_{i-1} + dt_i x_i b_i^T, y_i = h_i c_i.
    """
    seq = x.shape[1]
    decay = torch.cumsum(dt * a, dim=1).transpose(1, 2)  # [batch, heads, seq]
    future = ~torch.ones(seq, seq, dtype=torch.bool, device=x.device).tril()
    log_l = (decay[..., :, None] - decay[..., None, :]).masked_fill(future, float("-inf"))
    scores = torch.einsum("bihn,bjhn->bhij", c, b) * log_l.exp()
    return torch.einsum("bhij,bjh,bjhp->bihp", scores, dt, x)


class Mamba2Mixer(nn.Module):
    """in_proj -> causal depthwise conv of (x, B, C) -> selective scan -> gated norm -> out_proj."""

    def __init__(
        self,
        dim: int,
        n_heads: int,
        head_dim: int,
        state_size: int,
        n_groups: int = 1,
        conv_kernel: int = 4,
        eps: float = 1e-5,
    ):
        super().__init__()
        self.n_heads, self.head_dim, self.state_size, self.n_groups = (
            n_heads,
            head_dim,
            state_size,
            n_groups,
        )
        self.inner = n_heads * head_dim
        conv_dim = self.inner + 2 * n_groups * state_size
        self.in_proj = nn.Linear(dim, self.inner + conv_dim + n_heads, bias=False)
        self.conv = nn.Conv1d(
            conv_dim, conv_dim, conv_kernel, groups=conv_dim, padding=conv_kernel - 1
        )
        self.a_log = nn.Parameter(torch.empty(n_heads))
        self.dt_bias = nn.Parameter(torch.empty(n_heads))
        self.d = nn.Parameter(torch.empty(n_heads))
        self.eps = eps
        self.norm_weight = nn.Parameter(torch.empty(self.inner))
        self.out_proj = nn.Linear(self.inner, dim, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Decay rates spread over [1, n_heads] and time steps over [1e-3, 1e-1], as Mamba does
        (this module's own tensors; the projections and the convolution reset themselves)."""
        n_heads = self.n_heads
        with torch.no_grad():
            self.a_log.copy_(torch.log(torch.arange(1, n_heads + 1, dtype=torch.float32)))
            low, high = math.log(1e-3), math.log(0.1)
            dt = torch.exp(torch.rand(n_heads) * (high - low) + low)
            self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus
        nn.init.ones_(self.d)
        nn.init.ones_(self.norm_weight)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = hidden.shape
        gate, xbc, dt = self.in_proj(hidden).split(
            [self.inner, self.inner + 2 * self.n_groups * self.state_size, self.n_heads], dim=-1
        )
        xbc = F.silu(self.conv(xbc.transpose(1, 2))[..., :seq].transpose(1, 2))
        x, b, c = xbc.split(
            [self.inner, self.n_groups * self.state_size, self.n_groups * self.state_size], -1
        )
        x = x.view(batch, seq, self.n_heads, self.head_dim)
        heads_per_group = self.n_heads // self.n_groups
        b = b.view(batch, seq, self.n_groups, self.state_size).repeat_interleave(heads_per_group, 2)
        c = c.view(batch, seq, self.n_groups, self.state_size).repeat_interleave(heads_per_group, 2)
        dt = F.softplus(dt + self.dt_bias)
        y = ssd_scan(x, dt, -torch.exp(self.a_log), b, c) + self.d[:, None] * x
        return self.out_proj(self._gated_norm(y.flatten(2), gate))

    def _gated_norm(self, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """RMS-normalize y * silu(gate) within each group of heads, as Mamba-2 does."""
        y = (y * F.silu(gate)).unflatten(-1, (self.n_groups, -1))
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return y.flatten(-2) * self.norm_weight
