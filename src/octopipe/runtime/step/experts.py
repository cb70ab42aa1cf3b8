"""What expert parallelism changes in a step's gradients (`parallel.experts` divides the
experts; this settles what they leave).

- Routers (and Qwen's shared-expert gates) are replicated over the TP group, but under EP
  each TP rank routes its own share of the sequence: after the stage's last backward their
  gradients are summed over the TP group (one all-reduce per stage), as a sequence-parallel
  norm's partial sums are.
- A routed expert's gradient is summed over the ranks holding the same expert and divided by
  the replicas (`reduce.GradientReducer`, with `expert_dp_group`).
- The global gradient norm divides the world's sum of squares by the ranks holding each stage
  (TP x DP); an expert held by 1/E of them counts E times: a DTensor cut by expert index does
  so by itself (`optim.squared_norm`), our bundled experts, divided by removing the others'
  modules, add E - 1 more times their squares here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from octopipe.runtime.parallel.dtensors import local
from octopipe.runtime.step.optim import squared_norm


@dataclass
class ExpertGrads:
    ep: int
    expert_params: Sequence[nn.Parameter]  # every routed expert's parameter on this rank
    expert_dp_group: dist.ProcessGroup | None
    tp_summed: dict[int, list[nn.Parameter]]  # stage -> its routers (under TP)
    tp_group: dist.ProcessGroup | None

    @property
    def ids(self) -> frozenset[int]:
        return frozenset(id(p) for p in self.expert_params)

    def sum_over_tp(self, stage: int) -> None:
        params = self.tp_summed.get(stage, [])
        if self.tp_group is None or not params:
            return
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([local(p.grad).reshape(-1) for p in params])
        dist.all_reduce(flat, group=self.tp_group)
        offset = 0
        for p in params:
            g = local(p.grad)
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

    def extra_squares(self, device: torch.device) -> torch.Tensor:
        whole = [p for p in self.expert_params if not hasattr(p, "device_mesh")]
        return squared_norm(whole, device) * (self.ep - 1)
