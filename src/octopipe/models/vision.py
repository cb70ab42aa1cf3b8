"""Vision tower building blocks (Llama-3.2-Vision style): the patch embedding of image tiles
with Mllama's class token, position and tile embeddings, and the pre-norm ViT block (gated in
the tower's global layers)."""

from __future__ import annotations

import math

import torch
from torch import nn

from octopipe.models.attention import SelfAttention
from octopipe.models.feedforward import MLP


def aspect_ratio_count(max_tiles: int) -> int:
    """Tile grids (w, h) with w * h <= max_tiles: the aspect ratios Mllama supports."""
    sides = range(1, max_tiles + 1)
    return sum(1 for w in sides for h in sides if w * h <= max_tiles)


class PatchEmbed(nn.Module):
    """[batch, tiles, channels, H, W] pixels -> [batch, tiles * (1 + patches), dim] tokens.

    Mllama picks tile embeddings by the image's aspect ratio (id 0 is padding); every image
    here is the full grid of tiles, the last ratio. Mllama adds the post-tile embedding after
    the local layers; here it stays with the other tile embeddings, in this layer.
    """

    def __init__(self, image_size: int, patch_size: int, channels: int, dim: int, tiles: int):
        super().__init__()
        positions = (image_size // patch_size) ** 2 + 1
        ratios = aspect_ratio_count(tiles) + 1
        self.aspect_ratio = ratios - 1
        self.proj = nn.Conv2d(channels, dim, patch_size, stride=patch_size, bias=False)
        self.class_token = nn.Parameter(torch.empty(dim))
        self.positions = nn.Parameter(torch.empty(positions, dim))
        self.tile_positions = nn.Parameter(torch.empty(ratios, tiles, positions, dim))
        self.pre_tile = nn.Parameter(torch.empty(ratios, tiles, dim))
        self.post_tile = nn.Parameter(torch.empty(ratios, tiles, dim))
        self.norm = nn.LayerNorm(dim)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        embeddings = (self.class_token, self.positions, self.tile_positions, self.pre_tile)
        for p in (*embeddings, self.post_tile):
            nn.init.normal_(p, std=p.shape[-1] ** -0.5)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        batch, tiles = pixels.shape[:2]
        patches = self.proj(pixels.flatten(0, 1)).flatten(2).transpose(1, 2)
        cls = self.class_token.expand(patches.shape[0], 1, -1)
        x = torch.cat([cls, patches], dim=1).unflatten(0, (batch, tiles))
        ratio = self.aspect_ratio
        x = x + self.positions + self.tile_positions[ratio] + self.pre_tile[ratio][:, None]
        x = self.norm(x) + self.post_tile[ratio][:, None]
        return x.flatten(1, 2)


class ViTBlock(nn.Module):
    """x + attn(ln(x)), then x + mlp(ln(x)); attention is bidirectional and position-free.
    A gated block (Mllama's global layers) scales both branches by tanh of a learned gate."""

    def __init__(self, dim: int, n_heads: int, hidden: int, eps: float = 1e-5, gated: bool = False):
        super().__init__()
        self.attn_norm = nn.LayerNorm(dim, eps=eps)
        self.attn = SelfAttention(
            dim, n_heads, n_heads, dim // n_heads, causal=False, rope_theta=None
        )
        self.mlp_norm = nn.LayerNorm(dim, eps=eps)
        self.mlp = MLP(dim, hidden, "gelu")
        self.gates = nn.Parameter(torch.empty(2)) if gated else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.gates is not None:
            nn.init.constant_(self.gates, math.pi / 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        attn_gate, mlp_gate = torch.tanh(self.gates) if self.gates is not None else (1.0, 1.0)
        x = x + attn_gate * self.attn(self.attn_norm(x))
        return x + mlp_gate * self.mlp(self.mlp_norm(x))
