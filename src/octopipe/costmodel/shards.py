"""Tensor-parallel shares: this rank's part of a dimension Megatron splits over TP ranks."""

from __future__ import annotations

import math

from octopipe.errors import InputError


def split(n: int, tp: int) -> int:
    """This rank's share of a dimension Megatron splits (padded up, as Megatron pads vocab)."""
    return math.ceil(n / tp)


def split_heads(heads: int, tp: int, what: str, replicable: bool = False) -> int:
    """This rank's heads: TP must divide them, or, for `replicable` ones (key-value heads,
    Mamba groups), may be a multiple of them (each rank then keeps a replica)."""
    if heads % tp and not (replicable and tp % heads == 0):
        raise InputError(
            "settings",
            f"tensor-parallel degree {tp} does not fit {heads} {what}",
            "tensor_parallel",
        )
    return max(1, heads // tp)  # fewer KV heads than ranks: each rank keeps a replica
