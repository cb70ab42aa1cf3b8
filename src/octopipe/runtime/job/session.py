"""What every rank does for one training job, and the result rank 0 assembles from all ranks.

A job is a plan, a model and a few settings. Each rank builds its stages of the model from the
seed (the same weights the whole model has), learns the boundary shapes from the stages'
owners, trains `steps` steps on its replica's share of every global batch, and sends a report
to rank 0, which turns the reports into one `RunResult`. Process creation is the launcher's
business, not this module's.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from octopipe.plan import Plan
from octopipe.runtime.data.batches import Batch, replica_batch
from octopipe.runtime.job.evaluate import Evaluation
from octopipe.runtime.job.flops import peak_flops, step_model_flops
from octopipe.runtime.job.progress import OnReport, StepProgress, StepRates, StepReport, say
from octopipe.runtime.job.run_config import Job, RunConfig
from octopipe.runtime.model.recipe import (
    ModelRecipe,
    explained,
)
from octopipe.runtime.model.recompute import apply_recompute, stage_layers
from octopipe.runtime.model.split import parameter_bytes
from octopipe.runtime.parallel.dtensors import local, whole
from octopipe.runtime.parallel.fsdp import ShardedStages, fsdp_units
from octopipe.runtime.parallel.layout import Place, RankLayout
from octopipe.runtime.parallel.mesh import build_job_mesh
from octopipe.runtime.parallel.parallelize import parallelizer
from octopipe.runtime.step.overlap import OverlappedSteps
from octopipe.runtime.step.shapes import exchange_boundary_specs
from octopipe.runtime.step.worker import ActionRecord, StepRecord, Worker


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
    reports: tuple[StepReport, ...] = ()  # per step, as rank 0 reported them

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


def run_job_on_rank(
    job: Job,
    rank: int,
    world_size: int,
    device: torch.device,
    nccl: bool,
    on_report: OnReport | None = None,
) -> RunResult | None:
    """Train the job on this rank; rank 0 returns the assembled result, the others None. After
    every step all ranks check the loss together (`progress`); `on_report` gets the step's
    report, and notes of what the run is doing (given on rank 0 only).

    Global rank `tp_rank + T * (d + P * replica)` runs TP rank `tp_rank` of device d of the plan
    (P devices) in that replica (`RankLayout`); ranks past the last replica (jobs of several
    sizes share one process group) only take part in the collectives."""
    plan, cfg = job.plan, job.config
    layout = cfg.layout(plan)
    sharding = cfg.tp > 1 or cfg.zero == 3
    groups = build_job_mesh(layout, rank, device.type, with_mesh=sharding)
    place = groups.place or Place(cfg.dp, -1, 0)  # past the job: no device
    replica, d, tp_rank = place.replica, place.device, place.tp_rank
    recipe = cfg.recipe()
    data = cfg.data_source(recipe)
    mine = plan.stages_on(d)
    say(on_report, f"{world_size} processes joined; building each rank's stages")
    shard = parallelizer(groups, recipe.tp_plan(cfg.tp) if cfg.tp > 1 else None, cfg.zero)
    modules = {
        s: recipe.stage(
            recipe.layers[plan.stages[s].start : plan.stages[s].end], device, cfg.seed, shard
        )
        for s in mine
    }
    for s, module in modules.items():  # what the plan has each stage recompute
        apply_recompute(module, *stage_layers(plan, recipe, s), plan.recompute_of(s))
    b = cfg.micro_batch_size
    first = data.global_batch(0, cfg.global_sequences(plan))
    sample = replica_batch(first, 0, 1, b).inputs[0]
    owners = [layout.rank(0, st.device) for st in plan.stages]  # replica 0's TP rank 0
    # FSDP2 gathers over the replicas inside the forward: then every replica runs its stages.
    runs = modules if replica == 0 or cfg.zero == 3 else {}
    say(on_report, "stages built; running one microbatch to learn the shapes between stages")
    specs = exchange_boundary_specs(owners, runs, sample, device, cfg.tp, tp_rank)
    sharded = None
    if cfg.zero == 3:
        sharded = ShardedStages(fsdp_units(modules), plan.schedule.get(d, ()))
        sharded.reshard_all()  # the stages were gathered by shape discovery
    worker = Worker(
        plan,
        modules,
        explained(cfg.loss or recipe.loss),
        d,
        device,
        {s: specs[s] for s in range(1, plan.num_stages)},
        cfg.optimizer,
        nccl or cfg.order_matched,
        cfg.lookahead,
        replica,
        cfg.dp,
        groups.dp_group,
        cfg.zero,
        cfg.reduce_at_end,
        cfg.autocast_dtype,
        tp=cfg.tp,
        tp_rank=tp_rank,
        sharded=sharded,
    )
    first_step = _resume(cfg, modules, worker)
    if first_step:
        say(on_report, f"resumed from {cfg.resume_checkpoint} ({first_step} steps done)")
    needs_data = 0 in mine or plan.num_stages - 1 in mine
    evaluation = _evaluation(cfg, worker, plan, replica, needs_data, recipe)

    def batch_of(k: int) -> Batch:
        if not needs_data:
            return Batch([], [])
        sequences = data.global_batch(k, cfg.global_sequences(plan))
        return replica_batch(sequences, replica, plan.num_microbatches, b)

    dist.barrier()
    origin = time.perf_counter()
    redone = 0
    progress = StepProgress(
        plan, cfg, rank, world_size, device, on_report, _rates(cfg, plan, device)
    )
    say(on_report, f"training steps {first_step + 1} to {cfg.steps}")
    if cfg.overlap_steps:
        overlapped = OverlappedSteps(worker)
        steps = overlapped.run(batch_of, first_step, cfg.steps, origin)
        redone = overlapped.redone
        # Reported once the run is done: a collective after every step would be a barrier.
        for k, record in enumerate(steps, first_step):
            progress.after_step(k, record, worker.peak_memory()[0])
    else:
        steps = []
        for k in range(first_step, cfg.steps):
            steps.append(worker.train_step(k, batch_of(k), origin))
            held_out = evaluation.after_step(k) if evaluation is not None else None
            # A non-finite loss stops every rank here.
            progress.after_step(k, steps[-1], worker.peak_memory()[0], held_out)
            if cfg.checkpoint_every and (k + 1) % cfg.checkpoint_every == 0:
                _save(cfg, recipe, k + 1, modules, worker, on_report)
    # Whole tensors of sharded parameters are gathered by every rank holding a share (all
    # replicas under FSDP2); the first replica's TP rank 0 reports them.
    gathers = replica == 0 or cfg.zero == 3
    state = _state(worker) if cfg.collect_state and gathers else ({}, {})
    reports_state = replica == 0 and tp_rank == 0
    report = RankReport(
        rank,
        tuple(steps),
        tuple(worker.records),
        *worker.peak_memory(),
        *(state if reports_state else ({}, {})),
        sum(parameter_bytes(m) for m in modules.values()),
        redone,
        state_bytes(worker),
    )
    reports: list[RankReport] | None = [None] * world_size if rank == 0 else None  # type: ignore[list-item]
    dist.gather_object(report, reports, dst=0)
    if reports is None:
        return None
    return assemble(plan, reports, cfg.dp, first_step, cfg.tp, tuple(progress.reports))


def _evaluation(
    cfg: RunConfig, worker: Worker, plan: Plan, replica: int, needs_data: bool, recipe
) -> Evaluation | None:
    val = cfg.val_source(recipe)
    if val is None:
        return None
    return Evaluation(
        worker,
        val,
        plan,
        every=cfg.eval_every,
        batches=cfg.eval_batches,
        last_step=cfg.steps,
        replica=replica,
        sequences=cfg.global_sequences(plan),
        micro_batch_size=cfg.micro_batch_size,
        needs_data=needs_data,
    )


def _rates(cfg: RunConfig, plan: Plan, device: torch.device) -> StepRates:
    """The model FLOPs of a step and a rank's peak, for MFU (`flops.py`)."""
    microbatches = cfg.dp * plan.num_microbatches
    flops = step_model_flops(cfg.model, cfg.seq_len, cfg.micro_batch_size, microbatches)
    return StepRates(flops, peak_flops(device, cfg.peak_flops))


def _resume(cfg: RunConfig, modules: dict, worker: Worker) -> int:
    """Load the checkpoint chosen before the ranks started, if any; the step to start at. Rank
    0's choice is everyone's (under torchrun each rank chose on its own). A job resuming what an
    earlier job of the same launch writes chooses when it starts (the launcher checked the
    folder's model and settings before any rank started)."""
    chosen = [cfg.resume_checkpoint if dist.get_rank() == 0 else None]
    if cfg.resume_at_start and dist.get_rank() == 0:
        from octopipe.runtime.checkpoint.folder import choose

        found = choose(cfg.checkpoint_dir)
        chosen = [None if found is None else str(found.path)]
    dist.broadcast_object_list(chosen, src=0)
    if chosen[0] is None:
        return 0
    from octopipe.runtime.checkpoint.store import load

    step = load(Path(chosen[0]), modules, worker.optimizer)
    dist.barrier()
    return step


def _save(
    cfg: RunConfig,
    recipe: ModelRecipe,
    step: int,
    modules: dict,
    worker: Worker,
    on_report: OnReport | None,
) -> None:
    from octopipe.runtime.checkpoint.folder import checkpoint_bytes, keep_newest, model_identity
    from octopipe.runtime.checkpoint.store import save

    about = {
        "model": str(cfg.model) if isinstance(cfg.model, str) else model_identity(cfg.model),
        "model_id": model_identity(cfg.model),
        "layers": list(recipe.layers),
        "seed": cfg.seed,
        "optimizer": cfg.optimizer.name,
    }
    nbytes = checkpoint_bytes(recipe.meta_model, cfg.optimizer.name, cfg.optimizer.momentum)
    path = save(cfg.checkpoint_dir, step, modules, worker.optimizer, about, nbytes)
    say(on_report, f"saved {path} ({step} steps done)")
    if cfg.keep_last and dist.get_rank() == 0:  # the folder is rank 0's, as in `save`
        for old in keep_newest(cfg.checkpoint_dir, cfg.keep_last, step):
            say(on_report, f"removed {old} (--keep-last {cfg.keep_last})")


def assemble(
    plan: Plan,
    reports: list[RankReport],
    replicas: int = 1,
    first_step: int = 0,
    tp: int = 1,
    step_reports: tuple[StepReport, ...] = (),
) -> RunResult:
    reports = sorted(reports, key=lambda r: r.rank)
    layout = RankLayout(tp, plan.num_devices, replicas)
    last = [layout.rank(r, plan.stages[-1].device) for r in range(replicas)]
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
        step_reports,
    )


def _state(worker: Worker) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Every parameter of the rank's stages by its FQN in the whole model, and its gradient;
    whole (sharded ones gathered: a collective of the ranks holding the stage)."""
    params, grads = {}, {}
    for module in worker.modules.values():
        for name, p in module.part.named_parameters():
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
