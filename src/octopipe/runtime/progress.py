"""What every rank learns after each training step: the step's loss and time.

The loss lives on the ranks holding the last stage of each replica, the step time on every
rank. After each step one small all-gather hands every rank all of it, so that rank 0 can report
the step while the run goes on, and so that a loss that turned non-finite stops every rank at
the same step with the same message (no rank is left waiting on a peer that gave up).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from octopipe.plan import Plan
from octopipe.runtime.spawn import RankFailure

if TYPE_CHECKING:
    from octopipe.runtime.session import RunConfig
    from octopipe.runtime.worker import StepRecord


@dataclass(frozen=True)
class StepReport:
    """One finished step, over all ranks."""

    step: int
    loss: float  # mean over every replica's microbatches, as RunResult.losses
    step_time: float  # seconds, the slowest rank's, as RunResult.step_times
    tokens: int  # trained in the step, over all replicas: dp x microbatches x b x seq_len
    job: int = 0  # which of the launched jobs (the CLI and octopipe.run launch one)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.step_time if self.step_time > 0 else math.inf

    def as_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "loss": self.loss,
            "step_time": self.step_time,
            "tokens_per_second": self.tokens_per_second,
        }


class NonFiniteLoss(RankFailure):
    """Every rank raises it at the step whose loss became nan or inf."""

    def __init__(self, step: int, loss: float) -> None:
        self.step, self.loss = step, loss
        super().__init__(f"the loss became {loss} at step {step}; training stopped")


class StepProgress:
    """Run on every rank after each of its steps (a collective: all ranks, every step)."""

    def __init__(
        self,
        plan: Plan,
        cfg: RunConfig,
        rank: int,
        world_size: int,
        device: torch.device,
        on_step: Callable[[StepReport], None] | None,
    ) -> None:
        last, layout = plan.stages[-1].device, cfg.layout(plan)
        # Replica order; of a tensor-parallel group, TP rank 0 (all hold the same loss).
        self._loss_ranks = [layout.rank(r, last) for r in range(cfg.dp)]
        self._num_mb = plan.num_microbatches
        self._world, self._device = world_size, device
        self._tokens = cfg.global_sequences(plan) * cfg.seq_len
        self._on_step = on_step if rank == 0 else None

    def after_step(self, step: int, record: StepRecord) -> StepReport:
        """The step's report; raises NonFiniteLoss on every rank if its loss is not finite."""
        # Row: this rank's step time, then its microbatch losses (none off the last stage).
        row = torch.zeros(1 + self._num_mb, dtype=torch.float64)
        row[0] = record.duration
        row[1 : 1 + len(record.losses)] = torch.tensor(record.losses, dtype=torch.float64)
        rows = [torch.empty_like(row, device=self._device) for _ in range(self._world)]
        dist.all_gather(rows, row.to(self._device))
        table = torch.stack(rows).cpu()
        # As RunResult's figures are made, so the report and the summary agree to the bit.
        loss = statistics.fmean(x for r in self._loss_ranks for x in table[r, 1:].tolist())
        report = StepReport(step, loss, float(table[:, 0].max()), self._tokens)
        if not math.isfinite(loss):
            raise NonFiniteLoss(step, loss)
        if self._on_step is not None:
            self._on_step(report)
        return report
