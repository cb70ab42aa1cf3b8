"""Deterministic synthetic training data for the bundled models.

Each text row walks a fixed random successor table from a random first token, so the next
token is a function of the current one: a model learns it in a few dozen steps and its loss
visibly falls. Images are Gaussian noise. Everything is drawn from one generator seeded by
(seed, step), so every process builds the same batch.
"""

from __future__ import annotations

import torch

TABLE_SEED = 1234  # the successor table is part of the "language", the same for every seed


def batch_generator(seed: int, step: int) -> torch.Generator:
    # Python's hash of a tuple of ints is stable across processes (no string hashing).
    return torch.Generator().manual_seed(hash((seed, step)) & 0x7FFF_FFFF_FFFF_FFFF)


def successor_table(vocab: int) -> torch.Tensor:
    return torch.randperm(vocab, generator=torch.Generator().manual_seed(TABLE_SEED))


def chain_tokens(gen: torch.Generator, rows: int, length: int, vocab: int) -> torch.Tensor:
    """[rows, length] token ids: random first tokens, each next token the table's successor."""
    table = successor_table(vocab)
    tokens = [torch.randint(0, vocab, (rows,), generator=gen)]
    for _ in range(length - 1):
        tokens.append(table[tokens[-1]])
    return torch.stack(tokens, dim=1)


def pixels(gen: torch.Generator, rows: int, tiles: int, channels: int, size: int) -> torch.Tensor:
    """[rows, tiles, channels, size, size] noise images."""
    return torch.randn(rows, tiles, channels, size, size, generator=gen)
