"""What every rank does for one training job, and the result rank 0 assembles from all ranks.

A job is a plan, a model and a few settings. Each rank builds its layers of the model from the
seed (the same weights the whole model has), learns the boundary shapes, trains `steps` steps,
and sends a report to rank 0, which turns the reports into one
`RunResult`. Process creation is the launcher's business, not this module's.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from octopipe.models.base import PipelineModel
from octopipe.plan import Plan
from octopipe.runtime.model_source import build_pipeline_model
from octopipe.runtime.shapes import discover_boundary_specs
from octopipe.runtime.worker import ActionRecord, OptimizerConfig, StepRecord, Worker


@dataclass(frozen=True)
class RunConfig:
    """How to train a plan; identical on every rank."""

    model: str  # a bundled model's name, or `module:factory`
    seed: int = 0  # weights and data
    steps: int = 1
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    lookahead: int = 8  # how many actions ahead receives are posted
    collect_state: bool = False  # return every parameter and its last gradient (tests, fuzzing)
    order_matched: bool = (
        False  # gloo: match transfers by order on a group per channel, as NCCL must
    )
    seq_len: int | None = None  # a bundled model's sizes (None: its default), as profiled
    micro_batch_size: int | None = None

    def build_model(self, layers: list[int] | None = None) -> PipelineModel:
        """The model this job trains (only `layers`, when given), at the configured sizes."""
        return build_pipeline_model(
            self.model,
            self.seed,
            layers,
            seq_len=self.seq_len,
            micro_batch_size=self.micro_batch_size,
        )


@dataclass(frozen=True)
class Job:
    plan: Plan
    config: RunConfig
    source: str = "<plan>"  # where the plan came from, for error messages


@dataclass(frozen=True)
class RankReport:
    rank: int
    steps: tuple[StepRecord, ...]
    records: tuple[ActionRecord, ...]
    peak_memory_bytes: int
    peak_memory_source: str
    params: dict[str, torch.Tensor]
    grads: dict[str, torch.Tensor]


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

    @property
    def iteration_time(self) -> float:
        """Median step time, leaving out the first step (warm-up) when there are more."""
        times = self.step_times[1:] or self.step_times
        return statistics.median(times)

    def summary(self) -> dict[str, Any]:
        return {
            "losses": list(self.losses),
            "iteration_time": self.iteration_time,
            "predicted_iteration_time": self.predicted_iteration_time,
            "step_times": list(self.step_times),
            "peak_memory_bytes": list(self.peak_memory_bytes),
            "peak_memory_source": self.peak_memory_source,
        }


def run_job_on_rank(
    job: Job, rank: int, world_size: int, device: torch.device, nccl: bool
) -> RunResult | None:
    """Train the job on this rank; rank 0 returns the assembled result, the others None."""
    plan, cfg = job.plan, job.config
    per_channel_groups = nccl or cfg.order_matched
    mine = [i for st in plan.stages if st.device == rank for i in range(st.start, st.end)]
    model = cfg.build_model(mine)
    batches = [model.make_batch(plan.num_microbatches, cfg.seed, k) for k in range(cfg.steps)]
    specs = discover_boundary_specs(
        cfg.build_model,
        batches[0].inputs[0],
        [st.start for st in plan.stages[1:]],
    )
    worker = Worker(
        plan, model, rank, device, specs, cfg.optimizer, per_channel_groups, cfg.lookahead
    )
    dist.barrier()
    origin = time.perf_counter()
    steps = tuple(worker.train_step(k, batch, origin) for k, batch in enumerate(batches))
    report = RankReport(
        rank,
        steps,
        tuple(worker.records),
        *worker.peak_memory(),
        *_state(worker, model) if cfg.collect_state else ({}, {}),
    )
    reports: list[RankReport] | None = [None] * world_size if rank == 0 else None  # type: ignore[list-item]
    dist.gather_object(report, reports, dst=0)
    return assemble(plan, reports) if reports is not None else None


def assemble(plan: Plan, reports: list[RankReport]) -> RunResult:
    reports = sorted(reports, key=lambda r: r.rank)
    last = plan.stages[-1].device
    num_steps = len(reports[last].steps)
    losses = tuple(statistics.fmean(reports[last].steps[k].losses) for k in range(num_steps))
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
    )


def _state(
    worker: Worker, model: torch.nn.Module
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    mine = {id(p) for p in worker.params}
    params, grads = {}, {}
    for name, p in model.named_parameters():
        if id(p) in mine:
            params[name] = p.detach().cpu().clone()
            if p.grad is not None:
                grads[name] = p.grad.detach().cpu().clone()
    return params, grads
