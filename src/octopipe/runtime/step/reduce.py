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
    """The rank's stages' parameters, and the collectives that average their gradients.

    Under expert parallelism a routed expert's gradient already holds the tokens every rank
    of its EP group sent it: it is summed only over the ranks holding the same expert
    (`expert_group`, None where this rank is the only one) and divided, as every gradient, by
    the replicas (the loss is the mean over all of them)."""

    def __init__(
        self,
        stage_params: dict[int, list[nn.Parameter]],
        group: dist.ProcessGroup | None,
        degree: int,
        experts: frozenset[int] = frozenset(),
        expert_group: dist.ProcessGroup | None = None,
    ) -> None:
        """`experts`: ids of the routed experts' parameters."""
        self.stage_params, self.degree = {}, degree
        for stage, params in stage_params.items():  # the stage's dense and expert buckets
            dense = [p for p in params if id(p) not in experts]
            routed = [p for p in params if id(p) in experts]
            self.stage_params[stage] = [(dense, group), (routed, expert_group)]
        self._pending: list[tuple[list[nn.Parameter], dist.Work | None, torch.Tensor]] = []
        self._stages_pending: list[tuple[int, int]] = []  # (stage, its buckets), in launch order

    def launch(self, stage: int) -> None:
        before = len(self._pending)
        for params, group in self.stage_params[stage]:
            if not params:
                continue
            # A parameter no microbatch reached (an expert never routed to) has no gradient
            # here but may have one on another replica: it takes part as zeros, as in one
            # process. Sharded gradients are reduced shard by shard: each rank its local part.
            flat = torch.cat(
                [
                    (local(p.grad) if p.grad is not None else torch.zeros_like(local(p))).reshape(
                        -1
                    )
                    for p in params
                ]
            )
            work = None if group is None else dist.all_reduce(flat, group=group, async_op=True)
            self._pending.append((params, work, flat))
        self._stages_pending.append((stage, len(self._pending) - before))

    def finish(self) -> None:
        """Wait for every launched reduction and write the averages back into `.grad`."""
        self.finish_ready(block=True)

    def finish_ready(self, block: bool) -> list[int]:
        """Write back the reductions that are done (with `block`, all of them, waiting): the
        stages whose gradients are now averaged (in launch order)."""
        done: list[int] = []
        while self._stages_pending:
            stage, upto = self._stages_pending[0]
            buckets = self._pending[:upto]
            ready = all(w is None or w.is_completed() for _, w, _ in buckets)
            if not (block or ready):
                break
            for params, work, flat in buckets:
                if work is not None:
                    work.wait()
                flat.div_(self.degree)
                offset = 0
                for p in params:
                    shard = local(p)
                    n = shard.numel()
                    set_local_grad(p, flat[offset : offset + n].view_as(shard))
                    offset += n
            self._pending = self._pending[upto:]
            self._stages_pending = self._stages_pending[1:]
            done.append(stage)
        return done
