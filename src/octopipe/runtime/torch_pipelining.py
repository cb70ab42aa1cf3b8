"""Run a model's pipeline stages under `torch.distributed.pipelining`, PyTorch's own executor.

This is the yardstick our executor is measured against, on the same processes and the same
layers: each stage a plan places on a rank becomes a `PipelineStage` over exactly those layers
of the bundled model, and one of PyTorch's schedules drives them:

- `Schedule1F1B`, `ScheduleInterleaved1F1B`, `ScheduleZBVZeroBubble`: PyTorch's own orders, over
  the stages of a plan whose placement is the one that class assumes (a `baselines` plan);
- `_PipelineScheduleRuntime` with `_load_csv` of our `schedule.csv`: our order, their runtime.

`launch_torch` spawns one process per rank (gloo on loopback, one thread each) and returns, per
job, every step's slowest-rank time, the losses, and optionally the gradients; our executor's
jobs can run in turn on the same processes (through its public per-rank entry point). Nothing
here reaches into our executor's internals: the two share only the model and the processes.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining import schedules as tps

from octopipe.limits import DEFAULT_TIMEOUT_S
from octopipe.placement import interleaved, v_shape
from octopipe.plan import Plan, save_schedule_csv
from octopipe.runtime.data.batches import SyntheticData, replica_batch
from octopipe.runtime.job.result import RunResult
from octopipe.runtime.job.run_config import Job
from octopipe.runtime.job.session import run_job_on_rank
from octopipe.runtime.launch.launcher import validate_jobs
from octopipe.runtime.launch.spawn import spawn_ranks
from octopipe.runtime.model.load import load_recipe
from octopipe.runtime.model.recipe import (
    DEFAULT_MICRO_BATCH_SIZE,
    DEFAULT_SEQ_LEN,
    Activation,
    ModelRecipe,
    StageModule,
)
from octopipe.runtime.parallel import groups
from octopipe.runtime.step.shapes import BoundarySpec, exchange_boundary_specs

CSV_RUNTIME = "csv"  # `_PipelineScheduleRuntime` loading the plan's schedule.csv

# PyTorch's schedule classes, and the stage placement each of them assumes on P ranks.
TORCH_SCHEDULES = {
    "Schedule1F1B": (tps.Schedule1F1B, lambda p, s: tuple(range(p))),
    "ScheduleInterleaved1F1B": (
        tps.ScheduleInterleaved1F1B,
        lambda p, s: interleaved(range(p), s // p),
    ),
    "ScheduleZBVZeroBubble": (tps.ScheduleZBVZeroBubble, lambda p, s: v_shape(range(p), 2)),
}


@dataclass(frozen=True)
class TorchJob:
    """One run: a plan's stages (and, for `CSV_RUNTIME`, its order) under one PyTorch runner."""

    plan: Plan
    runner: str  # a key of TORCH_SCHEDULES, or CSV_RUNTIME
    model: str  # a bundled model's name, or `module:factory` (as `octopipe run --model`)
    steps: int = 1
    seed: int = 0
    lr: float = 0.01  # plain SGD, as our executor's default
    collect_grads: bool = False
    csv: str | None = None  # CSV_RUNTIME: the schedule.csv to load (default: written from the plan)
    seq_len: int = DEFAULT_SEQ_LEN  # the synthetic data's sizes, as our executor's RunConfig
    micro_batch_size: int = DEFAULT_MICRO_BATCH_SIZE


@dataclass(frozen=True)
class TorchResult:
    losses: tuple[float, ...]  # per step, mean over microbatches
    step_times: tuple[float, ...]  # per step, the slowest rank's (barrier to optimizer step end)
    grads: dict[str, torch.Tensor]  # FQN -> gradient of the last step (collect_grads only)

    @property
    def iteration_time(self) -> float:
        """Median step time, leaving out the first step (warm-up) when there are more."""
        return statistics.median(self.step_times[1:] or self.step_times)


class TorchStage(nn.Module):
    """One of our stage modules as `PipelineStage` wants it: PyTorch treats a lone tensor and a
    1-tuple alike, so a single output is returned bare."""

    def __init__(self, stage: StageModule) -> None:
        super().__init__()
        self.stage = stage

    def forward(self, *x: torch.Tensor) -> torch.Tensor | Activation:
        out = self.stage(*x)
        return out[0] if len(out) == 1 else out


def check_placement(job: TorchJob) -> None:
    """The named schedule classes fix the placement; the plan must be the one they assume."""
    if job.runner == CSV_RUNTIME:
        return
    if job.runner not in TORCH_SCHEDULES:
        raise ValueError(
            f"unknown runner {job.runner!r}; "
            f"expected {CSV_RUNTIME!r} or one of {sorted(TORCH_SCHEDULES)}"
        )
    _, placement_of = TORCH_SCHEDULES[job.runner]
    expected = placement_of(job.plan.num_devices, job.plan.num_stages)
    if tuple(job.plan.placement) != tuple(expected):
        raise ValueError(f"{job.runner} places stages {expected}, the plan {job.plan.placement}")


def stage_boundaries(
    plan: Plan, stages: dict[int, StageModule], sample: Activation, device: torch.device
) -> list[BoundarySpec]:
    """What enters every stage, and what leaves the last: PipelineStage is given these shapes
    up front. Left to infer them, it runs the later stages' first forward on uninitialized
    buffers, which breaks integer streams (token ids index an embedding)."""
    return exchange_boundary_specs([st.device for st in plan.stages], stages, sample, device)


def _examples(specs: BoundarySpec, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Stand-ins for a boundary's tensors; float ones need grad, or PyTorch expects no gradient
    for them and hands the backward a None."""
    return tuple(spec.empty(device).requires_grad_(spec.carries_grad) for spec in specs)


def build_schedule(
    job: TorchJob,
    recipe: ModelRecipe,
    stages: dict[int, StageModule],
    rank: int,
    device: torch.device,
    sample: Activation,
    csv_dir: Path,
) -> tuple[tps._PipelineSchedule, list[PipelineStage]]:
    """This rank's PipelineStages (static shapes) and the schedule that drives them."""
    plan = job.plan
    boundary = stage_boundaries(plan, stages, sample, device)
    torch_stages = []
    for s in plan.stages_on(rank):
        inputs = tuple(t.to(device) for t in sample) if s == 0 else _examples(boundary[s], device)
        outputs = _examples(boundary[s + 1], device)
        torch_stages.append(
            PipelineStage(
                TorchStage(stages[s]),
                s,
                plan.num_stages,
                device,
                input_args=inputs,
                output_args=outputs,
            )
        )
    loss_fn = _loss_fn(recipe)
    M = plan.num_microbatches
    if job.runner == CSV_RUNTIME:
        path = Path(job.csv) if job.csv else csv_dir / f"schedule-rank{rank}.csv"
        if not job.csv:
            save_schedule_csv(plan, path)
        schedule = tps._PipelineScheduleRuntime(torch_stages, M, loss_fn=loss_fn)
        schedule._load_csv(str(path))
        return schedule, torch_stages
    cls, _ = TORCH_SCHEDULES[job.runner]
    if issubclass(cls, tps.PipelineScheduleSingle):
        return cls(torch_stages[0], M, loss_fn=loss_fn), torch_stages
    return cls(torch_stages, M, loss_fn=loss_fn), torch_stages


def _loss_fn(recipe: ModelRecipe):
    def loss(output: torch.Tensor | Activation, target: torch.Tensor) -> torch.Tensor:
        return recipe.loss(output if isinstance(output, tuple) else (output,), target)

    return loss


def run_torch_job_on_rank(
    job: TorchJob, rank: int, world: int, csv_dir: Path
) -> TorchResult | None:
    """Train `job.steps` steps on this rank; rank 0 returns the assembled result."""
    plan = job.plan
    device = torch.device("cpu")
    recipe = load_recipe(job.model)
    modules = {
        s: recipe.stage(recipe.layers[plan.stages[s].start : plan.stages[s].end], device, job.seed)
        for s in plan.stages_on(rank)
    }
    b = job.micro_batch_size
    data = SyntheticData(recipe.synthetic_sequence, job.seq_len, job.seed)
    sample = replica_batch(data.global_batch(0, b), 0, 1, b).inputs[0]
    schedule, stages = build_schedule(job, recipe, modules, rank, device, sample, csv_dir)
    params = [p for st in stages for p in st.submod.parameters()]
    optimizer = torch.optim.SGD(params, lr=job.lr) if params else None
    first = any(st.is_first for st in stages)
    last = any(st.is_last for st in stages)
    durations, losses = [], []
    grads: dict[str, torch.Tensor] = {}
    for step in range(job.steps):
        M = plan.num_microbatches
        batch = replica_batch(data.global_batch(step, M * b), 0, M, b)
        inputs = [torch.cat(parts) for parts in zip(*batch.inputs)] if first else []
        target = torch.cat(batch.targets) if last else None
        for p in params:
            p.grad = None
        mb_losses: list[torch.Tensor] = []
        dist.barrier()
        began = time.perf_counter()
        schedule.step(*inputs, target=target, losses=mb_losses if last else None)
        if job.collect_grads and step == job.steps - 1:
            grads = _grads(modules)  # before the update: what the step computed
        if optimizer is not None:
            optimizer.step()
        durations.append(time.perf_counter() - began)
        losses.append(statistics.fmean(float(x.detach()) for x in mb_losses) if last else None)
    report = (rank, tuple(durations), tuple(losses), grads)
    reports: list | None = [None] * world if rank == 0 else None
    dist.gather_object(report, reports, dst=0)
    if reports is None:
        return None
    step_times = tuple(max(r[1][k] for r in reports) for k in range(job.steps))
    step_losses = next(r[2] for r in reports if r[2][0] is not None)
    all_grads = {k: v for r in reports for k, v in r[3].items()}
    return TorchResult(step_losses, step_times, all_grads)


def _grads(modules: dict[int, StageModule]) -> dict[str, torch.Tensor]:
    return {
        n: p.grad.detach().clone()
        for module in modules.values()
        for n, p in module.part.named_parameters()
        if p.grad is not None
    }


# --- processes ------------------------------------------------------------------------------


def launch_torch(
    jobs: Sequence[TorchJob | Job], nproc: int, timeout_s: float = DEFAULT_TIMEOUT_S
) -> list[TorchResult | RunResult]:
    """Run the jobs one after another on `nproc` fresh processes; raise the first rank's error.

    Our executor's `Job`s may be mixed in: they then run on the very same processes, in turn
    with PyTorch's, so a comparison does not hinge on when each set of processes ran."""
    torch_jobs = [job for job in jobs if isinstance(job, TorchJob)]
    validate_jobs([job for job in jobs if isinstance(job, Job)], nproc)
    for job in torch_jobs:
        check_placement(job)
        if job.plan.num_devices != nproc:
            raise ValueError(f"the plan needs {job.plan.num_devices} ranks, {nproc} were asked for")
    return spawn_ranks(_run_jobs, (list(jobs), timeout_s), nproc, "octopipe-torchpp")


def _run_jobs(
    rank: int, world: int, store: str, jobs: list[TorchJob | Job], timeout_s: float
) -> list[TorchResult | RunResult]:
    """One rank: PyTorch's schedules and our executor's jobs in turn, in one gloo group."""
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout_s),
    )
    groups.use_timeout(timeout_s)
    cpu = torch.device("cpu")
    results = [
        run_torch_job_on_rank(job, rank, world, Path(store).parent)
        if isinstance(job, TorchJob)
        else run_job_on_rank(job, rank, world, cpu, nccl=False)
        for job in jobs
    ]
    dist.destroy_process_group()
    return results
