"""What rank 0 assembles from every rank's report: one `RunResult` of a job (losses, step
times, records, memory, and with `collect_state` every weight and gradient, whole).

Pure data and its assembly; the ranks' work is `session`'s.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from octopipe.plan import JobShape, Plan
from octopipe.runtime.job.progress import StepReport
from octopipe.runtime.parallel.dtensors import local, whole
from octopipe.runtime.step.records import ActionRecord, StepRecord

if TYPE_CHECKING:  # the worker imports FSDP and DTensor: a launcher reads a result without them
    from octopipe.runtime.step.worker import Worker


@dataclass(frozen=True)
class RankReport:
    rank: int
    steps: tuple[StepRecord, ...]
    records: tuple[ActionRecord, ...]
    peak_memory_bytes: int
    peak_memory_source: str
    params: dict[str, torch.Tensor]
    grads: dict[str, torch.Tensor]
    parameter_bytes: int  # of the rank's stages: what it allocated of the model
    redone_steps: int = 0  # overlapped steps run again after a failed post-validation
    state_bytes: int = 0  # its weights, gradients and optimizer state at the end (its shards)
    held_peak_bytes: int = 0  # the most it held for backwards at once (`step.records.HeldTensors`)


@dataclass(frozen=True)
class RunResult:
    """One job's outcome, over all ranks."""

    losses: tuple[float, ...]  # per step, mean over microbatches
    step_times: tuple[float, ...]  # per step, the slowest rank's
    predicted_iteration_time: float | None
    peak_memory_bytes: tuple[int, ...]  # per rank
    peak_memory_source: str  # "cpu_max_rss" (whole process) or "cuda_max_memory_allocated"
    records: tuple[tuple[ActionRecord, ...], ...]  # per rank
    params: dict[str, torch.Tensor]  # FQN -> value after training (collect_state only)
    grads: dict[str, torch.Tensor]  # FQN -> gradient of the last step (collect_state only)
    parameter_bytes: tuple[int, ...] = ()  # per rank: the weights of its stages
    first_step: int = 0  # the step the run started at (a resumed run's checkpoint step)
    redone_steps: int = 0  # overlapped steps: how many were rolled back and run again
    state_bytes: tuple[int, ...] = ()  # per rank: weights, gradients, optimizer state held
    held_peak_bytes: tuple[int, ...] = ()  # per rank: the most held for backwards at once
    predicted_peak_bytes: tuple[float | None, ...] = ()  # per rank: its device's, by the plan
    reports: tuple[StepReport, ...] = ()  # per step, as rank 0 reported them
    shape: JobShape | None = None  # the job's shape as it ran: which rank ran what

    @property
    def iteration_time(self) -> float:
        """Median step time, leaving out the first step (warm-up) when there are more."""
        times = self.step_times[1:] or self.step_times
        return statistics.median(times)

    def summary(self) -> dict[str, Any]:
        return {
            "losses": list(self.losses),
            "first_step": self.first_step,
            "iteration_time": self.iteration_time,
            "predicted_iteration_time": self.predicted_iteration_time,
            "step_times": list(self.step_times),
            "peak_memory_bytes": list(self.peak_memory_bytes),
            "peak_memory_source": self.peak_memory_source,
            "parameter_bytes": list(self.parameter_bytes),
            "state_bytes": list(self.state_bytes),
            "held_peak_bytes": list(self.held_peak_bytes),
            "high_water_bytes": [s + h for s, h in zip(self.state_bytes, self.held_peak_bytes)],
            "predicted_peak_bytes": list(self.predicted_peak_bytes),
            "redone_steps": self.redone_steps,
            "learning_rates": [r.lr for r in self.reports],
            "grad_norms": [r.grad_norm for r in self.reports],
            "evaluations": [
                {"step": r.step, "val_loss": r.val_loss, "perplexity": r.perplexity}
                for r in self.reports
                if r.val_loss is not None
            ],
            "model_flops_per_step": self.reports[0].model_flops if self.reports else None,
            "mfu": self.mfu,
        }

    @property
    def mfu(self) -> float | None:
        """MFU at the median step time (`iteration_time`), or None where it is unknown."""
        if not self.reports or self.reports[0].mfu is None:
            return None
        first = self.reports[0]
        return first.mfu * first.step_time / self.iteration_time


def assemble(
    plan: Plan,
    reports: list[RankReport],
    shape: JobShape,
    first_step: int = 0,
    step_reports: tuple[StepReport, ...] = (),
) -> RunResult:
    reports = sorted(reports, key=lambda r: r.rank)
    device = plan.stages[-1].device  # every replica's and CP rank's loss (TP ranks share it)
    last = [shape.rank(r, device, 0, c) for r in range(shape.dp) for c in range(shape.cp)]
    num_steps = len(reports[last[0]].steps)
    losses = tuple(
        statistics.fmean(x for rank in last for x in reports[rank].steps[k].losses)
        for k in range(num_steps)
    )
    step_times = tuple(max(r.steps[k].duration for r in reports) for k in range(num_steps))
    predicted = (plan.predicted or {}).get("iteration_time")
    params = {k: v for r in reports for k, v in r.params.items()}
    grads = {k: v for r in reports for k, v in r.grads.items()}
    return RunResult(
        losses,
        step_times,
        predicted,
        tuple(r.peak_memory_bytes for r in reports),
        reports[0].peak_memory_source,
        tuple(r.records for r in reports),
        params,
        grads,
        tuple(r.parameter_bytes for r in reports),
        first_step,
        max(r.redone_steps for r in reports),
        tuple(r.state_bytes for r in reports),
        tuple(r.held_peak_bytes for r in reports),
        _predicted_peaks(plan, shape, len(reports)),
        step_reports,
        shape,
    )


def _predicted_peaks(plan: Plan, shape: JobShape, ranks: int) -> tuple[float | None, ...]:
    """Each rank's device's peak as the plan predicted it (None where the plan has none)."""
    peaks = (plan.predicted or {}).get("peak_memory_bytes")
    if not peaks:
        return (None,) * ranks
    places = [shape.place(r) for r in range(ranks)]
    return tuple(None if p is None else float(peaks[p.device]) for p in places)


def gathered_state(worker: Worker) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Every parameter of the rank's stages by its FQN in the whole model, and its gradient;
    whole (sharded ones gathered: a collective of the ranks holding the stage)."""
    params, grads = {}, {}
    for module in worker.modules.values():
        for name, p in module.named_weights().items():
            params[name] = whole(p.detach()).cpu().clone()
            if p.grad is not None:
                grads[name] = whole(p.grad.detach()).cpu().clone()
    return params, grads


def state_bytes(worker: Worker) -> int:
    """What the rank holds of its stages' training state: weights, gradients and optimizer
    state, its shards only (after the run: the last step's gradients are there)."""
    tensors = [t for p in worker.params for t in (p, p.grad) if t is not None]
    if worker.optimizer is not None:
        optimizer = getattr(worker.optimizer, "optim", worker.optimizer)  # ZeRO-1's local one
        tensors += [
            v
            for state in optimizer.state.values()
            for v in state.values()
            if isinstance(v, torch.Tensor) and v.dim() > 0  # not the step counters
        ]
    return sum(local(t).numel() * t.element_size() for t in tensors)
