"""What every rank does for one training job; rank 0 then assembles the result (`result`).

A job is a plan, a model and a few settings. Each rank builds its stages of the model from the
seed (the same weights the whole model has), learns the boundary shapes from the stages'
owners, trains `steps` steps on its replica's share of every global batch, and sends a report
to rank 0, which turns the reports into one `RunResult`. Process creation is the launcher's
business, not this module's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from octopipe.errors import InputError
from octopipe.plan import JobShape, Place, Plan
from octopipe.runtime.checkpoint.schedule import resumed_schedule, schedule_record
from octopipe.runtime.data.batches import Batch, DataSource, replica_batch, split_sequences
from octopipe.runtime.job.evaluate import Evaluation
from octopipe.runtime.job.flops import peak_flops, step_model_flops
from octopipe.runtime.job.progress import OnReport, StepProgress, StepRates, say, warn
from octopipe.runtime.job.result import RankReport, RunResult, assemble, gathered_state, state_bytes
from octopipe.runtime.job.run_config import Job, RunConfig
from octopipe.runtime.model.fp8 import convert_to_fp8
from octopipe.runtime.model.recipe import ModelRecipe, StageModule, explained
from octopipe.runtime.model.recompute import apply_recompute, stage_layers
from octopipe.runtime.model.split import parameter_bytes
from octopipe.runtime.model.ties import share_across_stages, spans_stages
from octopipe.runtime.parallel.experts import expert_parameters, tp_summed_parameters
from octopipe.runtime.parallel.fsdp import ShardedStages, fsdp_units
from octopipe.runtime.parallel.mesh import JobMesh, build_job_mesh
from octopipe.runtime.parallel.parallelize import parallelizer
from octopipe.runtime.step.experts import ExpertGrads
from octopipe.runtime.step.overlap import OverlappedSteps
from octopipe.runtime.step.records import StepRecord
from octopipe.runtime.step.shapes import exchange_boundary_specs
from octopipe.runtime.step.tied import tied_gradients
from octopipe.runtime.step.worker import RankPlace, StepSettings, Worker

# Recipes built before the ranks were forked (`build_recipes`), by the config they are of.
_BUILT: dict[int, tuple[RunConfig, ModelRecipe]] = {}


def build_recipes(configs: Iterable[RunConfig]) -> None:
    """Build the configs' recipes (the whole model on the meta device, its layers found) in the
    process the ranks are forked from: each rank then takes its job's instead of repeating it."""
    for cfg in configs:
        recipe = cfg.recipe()
        recipe.layers  # noqa: B018 - found and checked once, here
        _BUILT[id(cfg)] = (cfg, recipe)


def _recipe(cfg: RunConfig) -> ModelRecipe:
    """The config's recipe: built before this rank was forked, else now."""
    built = _BUILT.pop(id(cfg), None)
    return built[1] if built is not None and built[0] is cfg else cfg.recipe()


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

    The job's shape numbers the ranks (`JobShape.rank`: TP rank, CP rank, device and replica);
    ranks past the last replica (jobs of several sizes share one process group) only take part
    in the collectives."""
    say(on_report, f"{world_size} processes joined; building each rank's stages")
    built = _build(job, rank, device, nccl, on_report)
    first_step = _resume(job.config, built.modules, built.worker)
    if first_step:
        say(on_report, f"resumed from {job.config.checkpoint.chosen} ({first_step} steps done)")
        warn(
            on_report, resumed_schedule(job.config.checkpoint.dir, job.config.optimizer, first_step)
        )
    progress = StepProgress(
        job.plan,
        job.config,
        rank,
        world_size,
        device,
        on_report,
        _rates(job.config, job.plan, device),
    )
    say(on_report, f"training steps {first_step + 1} to {job.config.steps}")
    steps, redone = _train(built, first_step, progress, on_report)
    report = _rank_report(built, rank, steps, redone)
    reports: list[RankReport] | None = [None] * world_size if rank == 0 else None  # type: ignore[list-item]
    dist.gather_object(report, reports, dst=0)
    if reports is None:
        return None
    return assemble(job.plan, reports, built.layout, first_step, tuple(progress.reports))


@dataclass(frozen=True)
class _Built:
    """One rank's part of the job, built: where it sits, its stages and the worker that runs
    them, and how its share of a batch is cut."""

    job: Job
    layout: JobShape
    place: Place
    recipe: ModelRecipe
    data: DataSource
    part: Callable[[Batch], Batch]  # this CP rank's share of a replica's batch
    modules: dict[int, StageModule]
    worker: Worker


def _build(
    job: Job, rank: int, device: torch.device, nccl: bool, on_report: OnReport | None
) -> _Built:
    """The rank's groups, stages (tied, recomputing as planned, shapes between them learned
    from one microbatch) and worker."""
    plan, cfg = job.plan, job.config
    layout = cfg.shape
    groups = build_job_mesh(
        layout, rank, device.type, with_mesh=cfg.shape.tp > 1 or cfg.shape.zero == 3
    )
    place = groups.place or Place(cfg.shape.dp, -1, 0)  # past the job: no device
    part = _context_part(groups)
    recipe = _recipe(cfg)
    data = cfg.data_source(recipe)
    shard = parallelizer(groups, _tp_plan(recipe, cfg), cfg.shape.zero)
    modules = {
        s: recipe.stage(
            recipe.layers[plan.stages[s].start : plan.stages[s].end], device, cfg.seed, shard
        )
        for s in plan.stages_on(place.device)
    }
    if cfg.stepping.fp8:  # before recomputation wraps the blocks
        for module in modules.values():
            convert_to_fp8(module)
    _check_ties(recipe, plan, modules, cfg)
    share_across_stages(modules, recipe.ties)  # a tied weight is one parameter on one rank
    tied = tied_gradients(plan, recipe.layers, recipe.ties, layout, rank, modules)
    for s, module in modules.items():  # what the plan has each stage recompute
        apply_recompute(module, *stage_layers(plan, recipe, s), plan.recompute_of(s))
    first = data.global_batch(0, cfg.global_sequences(plan))
    sample = part(replica_batch(first, 0, 1, cfg.shape.microbatch_size)).inputs[0]
    owners = [layout.rank(0, st.device) for st in plan.stages]  # replica 0's TP rank 0
    # FSDP2 gathers over the replicas inside the forward, EP sends tokens between them: then
    # every replica runs its stages.
    runs = modules if place.replica == 0 or cfg.shape.zero == 3 or cfg.shape.ep > 1 else {}
    say(on_report, "stages built; running one microbatch to learn the shapes between stages")
    specs = exchange_boundary_specs(
        owners, runs, sample, device, cfg.shape.tp, place.tp_rank, cfg.stepping.autocast_dtype
    )
    sharded = None
    if cfg.shape.zero == 3:
        sharded = ShardedStages(fsdp_units(modules), plan.schedule.get(place.device, ()))
        sharded.reshard_all()  # the stages were gathered by shape discovery
    where = RankPlace(
        layout, place, device, groups.dp_group, sharded, tied, _expert_grads(groups, modules, cfg)
    )
    settings = StepSettings(
        cfg.optimizer,
        nccl or cfg.order_matched,
        cfg.stepping.lookahead,
        cfg.stepping.reduce_at_end,
        cfg.stepping.autocast_dtype,
        cfg.stepping.accumulation,
    )
    loss = explained(cfg.loss or recipe.loss)
    boundaries = {s: specs[s] for s in range(1, plan.num_stages)}
    worker = Worker(plan, modules, loss, boundaries, where, settings)
    return _Built(job, layout, place, recipe, data, part, modules, worker)


def _train(
    built: _Built, first_step: int, progress: StepProgress, on_report: OnReport | None
) -> tuple[list[StepRecord], int]:
    """The steps from `first_step` on, each checked by every rank together (a non-finite loss
    stops them all), evaluated and checkpointed where asked; the steps' records and how many
    overlapped steps were run again."""
    plan, cfg, worker = built.job.plan, built.job.config, built.worker
    mine = plan.stages_on(built.place.device)
    needs_data = 0 in mine or plan.num_stages - 1 in mine
    evaluation = _evaluation(
        cfg, worker, plan, built.place.replica, needs_data, built.recipe, built.part
    )

    def passes_of(k: int) -> list[Batch]:
        """Step k's global batch as the plan's passes (gradients accumulated over them): pass
        a takes sequences [a D M b, (a+1) D M b), then this replica's (and CP rank's) share."""
        if not needs_data:
            return [Batch([], [])] * cfg.stepping.accumulation
        sequences = built.data.global_batch(k, cfg.global_sequences(plan))
        b, replica = cfg.shape.microbatch_size, built.place.replica
        return [
            built.part(replica_batch(piece, replica, plan.num_microbatches, b))
            for piece in split_sequences(sequences, cfg.pass_sequences(plan))
        ]

    dist.barrier()
    origin = time.perf_counter()
    if cfg.stepping.overlap_steps:  # one pass a step: overlapped steps accumulate none
        overlapped = OverlappedSteps(worker)
        steps = overlapped.run(lambda k: passes_of(k)[0], first_step, cfg.steps, origin)
        # Reported once the run is done: a collective after every step would be a barrier.
        for k, record in enumerate(steps, first_step):
            progress.after_step(k, record, worker.peak_memory()[0])
        return steps, overlapped.redone
    steps = []
    for k in range(first_step, cfg.steps):
        steps.append(worker.train_step(k, passes_of(k), origin))
        held_out = evaluation.after_step(k) if evaluation is not None else None
        # A non-finite loss stops every rank here.
        progress.after_step(k, steps[-1], worker.peak_memory()[0], held_out)
        if cfg.checkpoint.every and (k + 1) % cfg.checkpoint.every == 0:
            _save(cfg, built.recipe, k + 1, built.modules, worker, on_report)
    return steps, 0


def _rank_report(built: _Built, rank: int, steps: list[StepRecord], redone: int) -> RankReport:
    """What this rank sends rank 0. Whole tensors of sharded parameters are gathered by every
    rank holding a share (all replicas under FSDP2); the first replica's TP rank 0 reports
    them. Under EP the experts are divided over replicas (and TP ranks): every rank reports
    its own."""
    cfg, worker, place = built.job.config, built.worker, built.place
    gathers = place.replica == 0 or cfg.shape.zero == 3 or cfg.shape.ep > 1
    state = gathered_state(worker) if cfg.collect_state and gathers else ({}, {})
    reports_state = (place.replica == 0 and place.tp_rank == 0) or cfg.shape.ep > 1
    return RankReport(
        rank,
        tuple(steps),
        tuple(worker.records),
        *worker.peak_memory(),
        *(state if reports_state else ({}, {})),
        sum(parameter_bytes(m) for m in built.modules.values()),
        redone,
        state_bytes(worker),
        worker.held.peak,
    )


def _tp_plan(recipe: ModelRecipe, cfg: RunConfig):
    """The TP plan the stages apply (under EP: MoE blocks on each rank's own tokens)."""
    if cfg.shape.ep > 1 and recipe.expert_tp_plan is None:
        raise InputError("--ep", f"{recipe.name} has no experts OctoPipe can divide")
    if cfg.shape.tp == 1:
        return None
    return recipe.expert_tp_plan(cfg.shape.tp) if cfg.shape.ep > 1 else recipe.tp_plan(cfg.shape.tp)


def _expert_grads(groups: JobMesh, modules: dict, cfg: RunConfig) -> ExpertGrads | None:
    """What EP leaves the step to settle: expert gradients and TP-replicated routers."""
    if groups.experts is None:
        return None
    tp_group = (
        groups.tp_mesh.get_group() if cfg.shape.tp > 1 and groups.tp_mesh is not None else None
    )
    return ExpertGrads(
        cfg.shape.ep,
        [p for m in modules.values() for p in expert_parameters(m)],
        groups.expert_dp_group,
        {s: tp_summed_parameters(m) for s, m in modules.items()},
        tp_group,
    )


def _check_ties(recipe: ModelRecipe, plan: Plan, modules: dict, cfg: RunConfig) -> None:
    """What tied weights on several stages do not run with, refused in one line."""
    if not recipe.ties:
        return
    stage_of = {
        layer: i for i, st in enumerate(plan.stages) for layer in recipe.layers[st.start : st.end]
    }
    one_stage = all(len({stage_of[layer] for layer in tie.layers}) == 1 for tie in recipe.ties)
    if cfg.stepping.overlap_steps and not one_stage:
        raise InputError(
            "--overlap-steps",
            "the model's tied weights sit on several stages, whose gradients are summed before "
            "one update; run without --overlap-steps (or keep them on one stage)",
        )
    if cfg.shape.zero == 3 and spans_stages(modules, recipe.ties):
        raise InputError(
            "--zero",
            "--zero 3 with tied weights on two stages of one device (each stage is its own "
            "FSDP2 unit) is not built; place them on other devices or on one stage",
        )


def _context_part(groups: JobMesh):
    """The rank's part of a replica's batch: under CP its share of every sequence (inputs and
    targets, `parallel.context`), else the batch."""
    context = groups.context
    if context is None:
        return lambda batch: batch
    return lambda batch: Batch(
        [tuple(context.shard(t) for t in inputs) for inputs in batch.inputs],
        [context.shard(t) for t in batch.targets],
    )


def _evaluation(
    cfg: RunConfig, worker: Worker, plan: Plan, replica: int, needs_data: bool, recipe, part
) -> Evaluation | None:
    val = cfg.val_source(recipe)
    if val is None:
        return None
    return Evaluation(
        worker,
        val,
        plan,
        every=cfg.evaluation.every,
        batches=cfg.evaluation.batches,
        last_step=cfg.steps,
        replica=replica,
        sequences=cfg.pass_sequences(plan),
        micro_batch_size=cfg.shape.microbatch_size,
        needs_data=needs_data,
        part=part,
    )


def _rates(cfg: RunConfig, plan: Plan, device: torch.device) -> StepRates:
    """The model FLOPs of a step and a rank's peak, for MFU (`flops.py`)."""
    microbatches = cfg.shape.dp * plan.num_microbatches * cfg.stepping.accumulation
    flops = step_model_flops(cfg.model, cfg.seq_len, cfg.shape.microbatch_size, microbatches)
    return StepRates(flops, peak_flops(device, cfg.peak_flops))


def _resume(cfg: RunConfig, modules: dict, worker: Worker) -> int:
    """Load the checkpoint chosen before the ranks started, if any; the step to start at. Rank
    0's choice is everyone's (under torchrun each rank chose on its own). A job resuming what an
    earlier job of the same launch writes chooses when it starts (the launcher checked the
    folder's model and settings before any rank started)."""
    chosen = [cfg.checkpoint.chosen if dist.get_rank() == 0 else None]
    if cfg.checkpoint.at_start and dist.get_rank() == 0:
        from octopipe.runtime.checkpoint.folder import choose

        found = choose(cfg.checkpoint.dir)
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
        "schedule": schedule_record(cfg.optimizer),
    }
    nbytes = checkpoint_bytes(recipe.meta_model, cfg.optimizer.name, cfg.optimizer.momentum)
    path = save(cfg.checkpoint.dir, step, modules, worker.optimizer, about, nbytes)
    say(on_report, f"saved {path} ({step} steps done)")
    if cfg.checkpoint.keep_last and dist.get_rank() == 0:  # the folder is rank 0's, as in `save`
        for old in keep_newest(cfg.checkpoint.dir, cfg.checkpoint.keep_last, step):
            say(on_report, f"removed {old} (--keep-last {cfg.checkpoint.keep_last})")
