"""ZeRO-1: the optimizer state of the ranks holding the same weights sharded across them.

Each parameter is owned by one rank of the group of ranks holding it (assigned greedily by
size, the same on every member, as torch's `ZeroRedundancyOptimizer` balances its
partitions); only the owner keeps its optimizer state and updates it, then broadcasts the new
values to the group. Unlike `ZeroRedundancyOptimizer` it works on each rank's local tensors,
so tensor-parallel (DTensor) parameters shard their state too, and it takes several groups:
under expert parallelism the dense weights are shared by the D x C copies of a stage, a routed
expert only by the ranks holding that expert (`expert_dp_group`; none: the rank owns them).
`.optim` is the rank's own optimizer over the parameters it owns (what checkpoints save and
load, and `state_bytes` counts, as for `ZeroRedundancyOptimizer`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from octopipe.runtime.parallel.dtensors import local

Build = Callable[[list[nn.Parameter]], torch.optim.Optimizer]
Shares = Sequence[tuple[Sequence[nn.Parameter], dist.ProcessGroup | None]]


class ShardedOptimizer:
    """`step()` and `param_groups` as an optimizer has them; the state is the owners'."""

    def __init__(self, shares: Shares, build: Build) -> None:
        """`shares`: (parameters, the group of ranks holding them alike; None: only this
        rank). `build(params)`: the optimizer of the parameters this rank owns."""
        me = dist.get_rank()
        owned: list[nn.Parameter] = []
        self._broadcasts: list[tuple[dist.ProcessGroup, list[tuple[nn.Parameter, int]]]] = []
        for params, group in shares:
            if group is None or dist.get_world_size(group) == 1:
                owned += params
                continue
            ranks = dist.get_process_group_ranks(group)
            load = [0] * len(ranks)
            plan = []
            for p in sorted(params, key=lambda p: -local(p).numel()):  # stable: model order
                i = min(range(len(ranks)), key=lambda i: load[i])
                load[i] += local(p).numel()
                plan.append((p, ranks[i]))
                if ranks[i] == me:
                    owned.append(p)
            self._broadcasts.append((group, plan))
        self.optim = build(owned) if owned else None

    @property
    def param_groups(self) -> list[dict]:
        return self.optim.param_groups if self.optim is not None else []

    @property
    def state(self):
        return self.optim.state if self.optim is not None else {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self.optim is not None:
            self.optim.zero_grad(set_to_none)

    @torch.no_grad()
    def step(self) -> None:
        """Update the owned parameters, then every owner sends its new values to its group."""
        if self.optim is not None:
            self.optim.step()
        works = [
            dist.broadcast(local(p), src=owner, group=group, async_op=True)
            for group, plan in self._broadcasts
            for p, owner in plan
        ]
        for work in works:
            work.wait()
