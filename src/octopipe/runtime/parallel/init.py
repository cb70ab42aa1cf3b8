"""Initial weights of a sharded module: exactly those of single-process training.

A module whose tensors are DTensors (tensor parallelism, FSDP2) is initialized at full size on
the CPU, from the same seeded generator one process uses, and each rank keeps its shard
(`distribute_tensor` with no source rank slices locally: nothing is sent, every rank computes
the same full tensor). One module's full tensors exist at a time, never a stage's or a model's
(on a GPU mesh `distribute_tensor` moves that one module's tensor to the GPU to cut it).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from octopipe.runtime.parallel.dtensors import is_dtensor


def holds_shards(module: nn.Module) -> bool:
    """Whether the module's own tensors are DTensors (tensor parallelism, FSDP2)."""
    own = [*module.parameters(recurse=False), *module.buffers(recurse=False)]
    return any(is_dtensor(t) for t in own)


@torch.no_grad()
def init_sharded(module: nn.Module, init: Callable[[nn.Module], None]) -> None:
    """Run `init(module)` on full-size CPU stand-ins of the module's own tensors, then copy each
    rank's share into the real (sharded or plain) tensors."""
    real: dict[str, tuple[dict, torch.Tensor]] = {}
    for table in (module._parameters, module._buffers):
        for name, tensor in table.items():
            if tensor is None:
                continue
            full = torch.empty(tensor.shape, dtype=tensor.dtype)
            real[name] = (table, tensor)
            table[name] = (
                nn.Parameter(full, tensor.requires_grad) if table is module._parameters else full
            )
    try:
        init(module)
        for name, (table, tensor) in real.items():
            full = table[name].detach()
            if is_dtensor(tensor):
                from torch.distributed.tensor import distribute_tensor

                full = distribute_tensor(
                    full, tensor.device_mesh, tensor.placements, src_data_rank=None
                ).to_local()
                tensor.to_local().copy_(full)
            else:
                tensor.copy_(full)
    finally:
        for name, (table, tensor) in real.items():
            table[name] = tensor
