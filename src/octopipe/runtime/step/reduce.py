"""Data parallelism: each stage's gradients averaged across the replicas that hold the stage.

A stage's all-reduce is launched (async, one flat bucket per stage) as soon as the rank has run
the stage's last backward action of the step (B, or the last I/W), so it overlaps the rank's
remaining actions; the optimizer waits for all of them. This is the simulator's rule
(docs/FORMATS.md, data parallelism). Plain `torch.distributed` collectives rather than DDP or
FSDP2: DDP's hooks fire inside autograd's backward, and a split backward's W runs outside it,
so DDP would reduce a stage before its W has produced the weight gradients.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from octopipe.runtime.parallel.dtensors import local, set_local_grad


class GradientReducer:
    """The rank's stages' parameters, and the collectives that average their gradients."""

    def __init__(
        self, stage_params: dict[int, list[nn.Parameter]], group: dist.ProcessGroup, degree: int
    ) -> None:
        self.stage_params, self.group, self.degree = stage_params, group, degree
        self._pending: list[tuple[int, dist.Work, torch.Tensor]] = []

    def launch(self, stage: int) -> None:
        params = self.stage_params[stage]
        if not params:
            return
        # A parameter no microbatch reached (an expert never routed to) has no gradient here
        # but may have one on another replica: it takes part as zeros, as in one process.
        # Tensor-parallel gradients are reduced shard by shard: each rank its local part.
        flat = torch.cat(
            [
                (local(p.grad) if p.grad is not None else torch.zeros_like(local(p))).reshape(-1)
                for p in params
            ]
        )
        work = dist.all_reduce(flat, group=self.group, async_op=True)
        self._pending.append((stage, work, flat))

    def finish(self) -> None:
        """Wait for every launched reduction and write the averages back into `.grad`."""
        self.finish_ready(block=True)

    def finish_ready(self, block: bool) -> list[int]:
        """Write back the reductions that are done (with `block`, all of them, waiting): the
        stages whose gradients are now averaged."""
        done, left = [], []
        for stage, work, flat in self._pending:
            if not (block or work.is_completed()):
                left.append((stage, work, flat))
                continue
            work.wait()
            flat.div_(self.degree)
            offset = 0
            for p in self.stage_params[stage]:
                shard = local(p)
                n = shard.numel()
                set_local_grad(p, flat[offset : offset + n].view_as(shard))
                offset += n
            done.append(stage)
        self._pending = left
        return done
