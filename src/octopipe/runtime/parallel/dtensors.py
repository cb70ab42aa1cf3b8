"""Small DTensor helpers for code that must not care whether a tensor is sharded.

Tensor parallelism and FSDP2 turn parameters (and their gradients) into DTensors; the executor's
own collectives (data-parallel all-reduces, the global gradient norm, boundary transfers) work
on each rank's local shard. A plain tensor is its own local shard.
"""

from __future__ import annotations

import math
import sys

import torch


def is_dtensor(tensor: torch.Tensor) -> bool:
    """Whether `tensor` is a DTensor, without importing DTensor's module (a second on a busy
    host) where none can exist: a process that never imported it holds none."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(tensor, module.DTensor)


def local(tensor: torch.Tensor) -> torch.Tensor:
    """The rank's part of a DTensor (its storage, no copy), or the tensor itself."""
    return tensor.to_local() if is_dtensor(tensor) else tensor


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """All of a tensor on this rank: a DTensor gathered (or its partial sums added; a
    collective of its mesh), a plain tensor as it is."""
    return tensor.full_tensor() if is_dtensor(tensor) else tensor


def shard_count(tensor: torch.Tensor) -> int:
    """Into how many distinct pieces a tensor is cut over the ranks holding its stage: the
    product of the mesh sizes it is sharded over (1 for plain or replicated tensors)."""
    if not is_dtensor(tensor):
        return 1
    mesh = tensor.device_mesh
    # Anything neither replicated nor partial cuts the tensor: Shard, and the strided shard
    # FSDP2 uses over a tensor-parallel shard of the same dimension.
    return math.prod(
        mesh.size(i)
        for i, p in enumerate(tensor.placements)
        if not (p.is_replicate() or p.is_partial())
    )


def set_local_grad(param: torch.Tensor, grad: torch.Tensor) -> None:
    """Give `param` the gradient whose local part is `grad` (laid out as the parameter)."""
    if is_dtensor(param):
        grad = type(param).from_local(
            grad, param.device_mesh, param.placements, shape=param.shape, stride=param.stride()
        )
    param.grad = grad
