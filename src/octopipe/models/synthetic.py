"""Deterministic synthetic training data for the bundled models.

Each text row repeats a short random motif, so a model can learn to copy the token one period
back and its loss visibly falls; images are Gaussian noise. Everything comes from one
generator seeded by (seed, step), so every process draws the same batch.
"""

from __future__ import annotations

import torch

MAX_MOTIF = 8


def batch_generator(seed: int, step: int) -> torch.Generator:
    # Distinct (seed, step) pairs give distinct streams; Python's hash of ints is stable.
    return torch.Generator().manual_seed(hash((seed, step)) & 0x7FFF_FFFF_FFFF_FFFF)


def motif_tokens(gen: torch.Generator, rows: int, length: int, vocab: int) -> torch.Tensor:
    """[rows, length] token ids; row r repeats a random motif of 2..MAX_MOTIF tokens."""
    period = torch.randint(2, MAX_MOTIF + 1, (rows, 1), generator=gen)
    motif = torch.randint(0, vocab, (rows, MAX_MOTIF), generator=gen)
    return motif.gather(1, torch.arange(length).expand(rows, -1) % period)


def pixels(gen: torch.Generator, rows: int, tiles: int, channels: int, size: int) -> torch.Tensor:
    """[rows, tiles, channels, size, size] noise images."""
    return torch.randn(rows, tiles, channels, size, size, generator=gen)
