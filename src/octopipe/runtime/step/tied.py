"""The gradient sum that keeps tied copies equal (Megatron-LM's embedding group).

When a tied parameter's holders (an embedding and a head) sit on stages of different ranks,
each rank keeps a copy (`octopipe.runtime.model.ties`). After a step's backward (and the
data-parallel reduction) the copies' gradients are all-reduced, summed, over the ranks holding
one, in each pipeline (replica, TP rank) alike: every copy then holds the gradient one process
computes for the shared parameter, and the same update keeps them equal. Copies on stages of
one rank share one parameter and need nothing. The global gradient norm counts a tied
parameter once: the rank holding its first holder counts it, the others' copies do not.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn

from octopipe.plan import JobShape, Plan
from octopipe.runtime.model.ties import Tie
from octopipe.runtime.parallel.dtensors import local
from octopipe.runtime.parallel.groups import new_group


class TiedGradients:
    """This rank's tied copies and the groups their gradients are summed over."""

    def __init__(self, sums: list[tuple[dist.ProcessGroup, nn.Parameter]], copies: set[int]):
        self._sums = sums
        self.copies = copies  # ids of copies the norm leaves out (another rank counts them)

    def reduce(self) -> None:
        """Sum each copy's gradient over its group (the step's gradients are final)."""
        for group, p in self._sums:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(local(p.grad), group=group)

    def counted(self, params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """`params` but the copies another rank counts in the gradient norm."""
        return [p for p in params if id(p) not in self.copies]


def tied_gradients(
    plan: Plan,
    layers: Sequence[str],
    ties: Sequence[Tie],
    layout: JobShape,
    rank: int,
    stages: dict[int, nn.Module],
) -> TiedGradients | None:
    """The sums of `ties` whose holders sit on more than one device of the plan. Collective:
    every rank of the world makes every group, in one order. None where no tie spans ranks."""
    device_of_layer = {
        layer: st.device for st in plan.stages for layer in layers[st.start : st.end]
    }
    held = {name: p for stage in stages.values() for name, p in stage.part.named_parameters()}  # type: ignore[union-attr]
    sums, copies = [], set()
    for tie in ties:
        devices = sorted({device_of_layer[layer] for layer in tie.layers})
        if len(devices) < 2:
            continue
        mine = next((held[n] for n in tie.names if n in held), None)
        for ranks in layout.pipelines():
            group = new_group([ranks[d] for d in devices])
            if mine is not None and rank in (ranks[d] for d in devices):
                sums.append((group, mine))
        if mine is not None and tie.name not in held:
            copies.add(id(mine))
    return TiedGradients(sums, copies) if sums or copies else None
