"""Vision tower building blocks (Llama-3.2-Vision style): patch embedding of image tiles with a
class token and learned positions per tile, and the pre-norm ViT block."""

from __future__ import annotations

import torch
from torch import nn

from octopipe.models.attention import SelfAttention
from octopipe.models.feedforward import MLP


class PatchEmbed(nn.Module):
    """[batch, tiles, channels, H, W] pixels -> [batch, tiles * (1 + patches), dim] tokens."""

    def __init__(self, image_size: int, patch_size: int, channels: int, dim: int):
        super().__init__()
        patches = (image_size // patch_size) ** 2
        self.proj = nn.Conv2d(channels, dim, patch_size, stride=patch_size, bias=False)
        self.class_token = nn.Parameter(torch.randn(dim) * dim**-0.5)
        self.positions = nn.Parameter(torch.randn(patches + 1, dim) * dim**-0.5)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        batch = pixels.shape[0]
        patches = self.proj(pixels.flatten(0, 1)).flatten(2).transpose(1, 2)
        cls = self.class_token.expand(patches.shape[0], 1, -1)
        tiles = torch.cat([cls, patches], dim=1) + self.positions
        return tiles.reshape(batch, -1, tiles.shape[-1])


class ViTBlock(nn.Module):
    """x + attn(ln(x)), then x + mlp(ln(x)); attention is bidirectional and position-free."""

    def __init__(self, dim: int, n_heads: int, hidden: int, eps: float = 1e-5):
        super().__init__()
        self.attn_norm = nn.LayerNorm(dim, eps=eps)
        self.attn = SelfAttention(
            dim, n_heads, n_heads, dim // n_heads, causal=False, rope_theta=None
        )
        self.mlp_norm = nn.LayerNorm(dim, eps=eps)
        self.mlp = MLP(dim, hidden, "gelu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))
