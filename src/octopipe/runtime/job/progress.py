"""What every rank learns after each training step, and what the run says while it runs.

The loss lives on the ranks holding the last stage of each replica, the step time, the share of
the gradient norm and the memory on every rank. After each step one small all-gather hands
every rank all of it (with the held-out losses, after a step that evaluated), so that rank 0
can report the step while the run goes on, and so that a loss that turned non-finite stops
every rank at the same step with the same message (no rank is left waiting on a peer that gave
up). Besides steps, rank 0 and the launcher say what the run is doing (`RunNote`): start-up
stages, checkpoints saved and resumed, and warnings (a resume that reshapes the learning-rate
schedule).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from octopipe.plan import Plan
from octopipe.runtime.failures import RankFailure

if TYPE_CHECKING:
    from octopipe.runtime.job.run_config import RunConfig
    from octopipe.runtime.step.records import StepRecord


@dataclass(frozen=True)
class StepReport:
    """One finished step, over all ranks."""

    step: int  # from 1: the steps done after it (the K of a checkpoint saved after it)
    loss: float  # mean over every replica's microbatches, as RunResult.losses
    step_time: float  # seconds, the slowest rank's, as RunResult.step_times
    tokens: int  # trained in the step, over all replicas: dp x microbatches x b x seq_len
    job: int = 0  # which of the launched jobs (the CLI and octopipe.run launch one)
    lr: float | None = None  # the step's learning rate
    grad_norm: float | None = None  # the global gradient norm before clipping
    peak_memory_bytes: int | None = None  # the largest rank's peak so far (RunResult's source)
    model_flops: float | None = None  # the step's, all ranks (docs/COSTMODEL.md); None: unknown
    ranks: int = 1  # processes of the job
    peak_flops: float | None = None  # one rank's dense peak FLOP/s; None: unknown
    val_loss: float | None = None  # held-out loss after this step, when it evaluated

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.step_time if self.step_time > 0 else math.inf

    @property
    def tflops_per_rank(self) -> float | None:
        """Model TFLOP/s per rank."""
        if self.model_flops is None or self.step_time <= 0:
            return None
        return self.model_flops / self.step_time / self.ranks / 1e12

    @property
    def mfu(self) -> float | None:
        """Model FLOPs utilization: model FLOP/s per rank over its dense peak."""
        rate = self.tflops_per_rank
        return None if rate is None or self.peak_flops is None else rate * 1e12 / self.peak_flops

    @property
    def perplexity(self) -> float | None:
        return None if self.val_loss is None else _exp(self.val_loss)

    def as_json(self) -> dict[str, Any]:
        line = {
            "step": self.step,
            "loss": self.loss,
            "step_time": self.step_time,
            "tokens_per_second": self.tokens_per_second,
            "lr": self.lr,
            "grad_norm": self.grad_norm,
            "peak_memory_bytes": self.peak_memory_bytes,
            "model_tflops_per_rank": self.tflops_per_rank,
            "mfu": self.mfu,
        }
        if self.val_loss is not None:
            line.update(val_loss=self.val_loss, perplexity=self.perplexity)
        return line


@dataclass(frozen=True)
class RunNote:
    """What the run is doing besides steps (start-up stages, checkpoints), for the console.
    A `passing` note only says what is under way (shown until the next, never logged), so that
    a run refused meanwhile leaves its one error line alone."""

    text: str
    job: int = 0
    passing: bool = False
    warning: bool = False  # something valid but likely not what the user meant


Report = StepReport | RunNote
OnReport = Callable[[Report], None]


def say(on_report: OnReport | None, text: str, passing: bool = False) -> None:
    """Hand a note to whoever reports the run (nobody, on ranks but 0)."""
    if on_report is not None:
        on_report(RunNote(text, passing=passing))


def warn(on_report: OnReport | None, text: str | None) -> None:
    """Hand a warning (`text`, when there is one) to whoever reports the run."""
    if on_report is not None and text is not None:
        on_report(RunNote(text, warning=True))


class NonFiniteLoss(RankFailure):
    """Every rank raises it at the step whose loss became nan or inf."""

    def __init__(self, step: int, loss: float) -> None:
        self.step, self.loss = step, loss  # step from 1, as the console's
        super().__init__(f"the loss became {loss} at step {step}; training stopped")


@dataclass(frozen=True)
class StepRates:
    """What a step's report divides by, fixed for the run."""

    model_flops: float | None = None  # per step, all ranks
    peak_flops: float | None = None  # per rank


class StepProgress:
    """Run on every rank after each of its steps (a collective: all ranks, every step)."""

    def __init__(
        self,
        plan: Plan,
        cfg: RunConfig,
        rank: int,
        world_size: int,
        device: torch.device,
        on_report: OnReport | None,
        rates: StepRates = StepRates(),
    ) -> None:
        last, layout = plan.stages[-1].device, cfg.shape
        # Replica order; of a tensor-parallel group, TP rank 0 (all hold the same loss).
        self._loss_ranks = [
            layout.rank(r, last, 0, c) for r in range(layout.dp) for c in range(layout.cp)
        ]
        self._num_mb = plan.num_microbatches * cfg.stepping.accumulation  # losses of a step
        self._held_out_mb = plan.num_microbatches * cfg.evaluation.batches  # of an evaluation
        self._world, self._device = world_size, device
        self._tokens = cfg.global_sequences(plan) * cfg.seq_len
        self._cfg, self._stage_ranks, self._ranks = cfg, layout.stage_ranks, layout.world_size
        self._rates = rates
        self._on_report = on_report if rank == 0 else None
        self.reports: list[StepReport] = []  # every step's, on every rank

    def after_step(
        self,
        step: int,
        record: StepRecord,
        peak_memory: int = 0,
        held_out: Sequence[float] | None = None,
    ) -> StepReport:
        """The report of the step of index `step` (from 0: the report numbers it `step + 1`);
        raises NonFiniteLoss on every rank if its loss is not finite. `held_out`: the rank's
        held-out losses when the step evaluated (on every rank, then: empty off the last
        stage), else None."""
        # Row: step time, gradient-norm share, peak memory, the microbatch losses (none off the
        # last stage), then the held-out ones.
        M = self._num_mb
        width = 3 + M + (0 if held_out is None else self._held_out_mb)
        row = torch.zeros(width, dtype=torch.float64)
        row[0], row[2] = record.duration, peak_memory
        row[1] = math.nan if record.grad_squares is None else record.grad_squares
        row[3 : 3 + len(record.losses)] = torch.tensor(record.losses, dtype=torch.float64)
        if held_out:
            row[3 + M : 3 + M + len(held_out)] = torch.tensor(held_out, dtype=torch.float64)
        rows = [torch.empty_like(row, device=self._device) for _ in range(self._world)]
        dist.all_gather(rows, row.to(self._device))
        table = torch.stack(rows).cpu()
        # As RunResult's figures are made, so the report and the summary agree to the bit.
        loss = statistics.fmean(x for r in self._loss_ranks for x in table[r, 3 : 3 + M].tolist())
        squares = float(table[:, 1].sum())
        report = StepReport(
            step + 1,
            loss,
            float(table[:, 0].max()),
            self._tokens,
            lr=self._cfg.optimizer.lr_at(step),
            grad_norm=None if math.isnan(squares) else math.sqrt(squares / self._stage_ranks),
            peak_memory_bytes=int(table[:, 2].max()),
            model_flops=self._rates.model_flops,
            ranks=self._ranks,
            peak_flops=self._rates.peak_flops,
            val_loss=None
            if held_out is None
            else statistics.fmean(x for r in self._loss_ranks for x in table[r, 3 + M :].tolist()),
        )
        if not math.isfinite(loss):
            raise NonFiniteLoss(step + 1, loss)
        self.reports.append(report)
        if self._on_report is not None:
            self._on_report(report)
        return report


def _exp(x: float) -> float | None:
    return math.exp(x) if x < 700 else None  # beyond a float: no figure
