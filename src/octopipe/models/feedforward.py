"""Feed-forward building blocks: the gated MLP (SwiGLU/GeGLU), the plain ViT MLP, and a
mixture of experts with a top-k router and shared experts.

The MoE loops over experts, which is slow on a GPU but simple and deterministic on a CPU: the
point of these models is to be real and readable, not fast.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from octopipe.models.lean import gated

ACTIVATIONS = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu2": lambda x: F.relu(x).square(),  # Nemotron-H's squared ReLU
}


def activation(name: str):
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ValueError(
            f"unknown activation {name!r}, expected one of {sorted(ACTIVATIONS)}"
        ) from None


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)): SwiGLU with silu, GeGLU with gelu."""

    def __init__(self, dim: int, hidden: int, act: str = "silu"):
        super().__init__()
        self.act = activation(act)
        self.w_gate = nn.Linear(dim, hidden, bias=False)
        self.w_up = nn.Linear(dim, hidden, bias=False)
        self.w_down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_down(gated(self.w_gate(x), self.w_up(x), self.act))


class MLP(nn.Module):
    """fc2(act(fc1(x))): the ungated MLP of ViT blocks and of Nemotron-H's '-' layers."""

    def __init__(self, dim: int, hidden: int, act: str = "gelu", bias: bool = True):
        super().__init__()
        self.act = activation(act)
        self.fc1 = nn.Linear(dim, hidden, bias=bias)
        self.fc2 = nn.Linear(hidden, dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class MoE(nn.Module):
    """Each token goes to its top-k routed experts (softmax router) plus every shared expert.

    `route_experts`, when set, computes the routed part in place of the loop over `experts`
    (the executor's expert parallelism: `(tokens, chosen, weights) -> output`, the same sum)."""

    route_experts: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None

    def __init__(
        self,
        dim: int,
        expert_hidden: int,
        n_experts: int,
        top_k: int,
        shared_hidden: int = 0,
        shared_gate: bool = False,
        act: str = "silu",
        normalize_top_k: bool = False,
    ):
        super().__init__()
        self.top_k, self.normalize_top_k = top_k, normalize_top_k
        self.router = nn.Linear(dim, n_experts, bias=False)
        self.experts = nn.ModuleList(GatedMLP(dim, expert_hidden, act) for _ in range(n_experts))
        self.shared = GatedMLP(dim, shared_hidden, act) if shared_hidden > 0 else None
        # Qwen-MoE scales the shared expert by a per-token sigmoid gate.
        self.shared_gate = nn.Linear(dim, 1, bias=False) if shared_gate and self.shared else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        weights, chosen = self.router(tokens).softmax(-1).topk(self.top_k, dim=-1)
        if self.normalize_top_k:
            weights = weights / weights.sum(-1, keepdim=True)
        out = torch.zeros_like(tokens)
        if self.shared is not None:
            out = self.shared(tokens)
            if self.shared_gate is not None:
                out = out * torch.sigmoid(self.shared_gate(tokens))
        routed = self.route_experts or self.experts_output
        return (out + routed(tokens, chosen, weights)).view_as(x)

    def experts_output(
        self, tokens: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        """The routed experts' weighted sum, expert by expert."""
        out = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            token_idx, slot = (chosen == e).nonzero(as_tuple=True)
            if token_idx.numel():
                contribution = expert(tokens[token_idx]) * weights[token_idx, slot, None]
                # under autocast the experts answer in BF16 to FP32 tokens: summed in the tokens'
                out = out.index_add(0, token_idx, contribution.to(out.dtype))
        return out
