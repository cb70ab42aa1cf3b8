"""`octopipe estimate`: one given layout of a job, predicted, with no search.

    given = Given(layout, schedule="i1f1b", chunks=2)
    result = estimate(job, given)
    result.step_time, result.tflops_per_gpu, result.breakdown

The layout's plan is the named schedule over Megatron-LM's uniform partition (every stage the
same number of blocks; the embedding joins the first stage, the final norm and the head the
last), or `partition="titan"`: the embedding and the head each count as one block (torchtitan's
split, and Megatron-Core's `account_for_embedding_in_pipeline_split` and
`account_for_loss_in_pipeline_split`). Its step is what the layout search would predict for
that plan (`layouts/costs.py`): the pipeline simulated with its transfers and data-parallel
reductions, then the optimizer step. The breakdown splits the step on the busiest device
(docs/COSTMODEL.md, "The step").
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from octopipe.costmodel.build import TimeParts, model_flops
from octopipe.costmodel.error_band import ErrorBand, error_band, layout_kinds
from octopipe.errors import InputError
from octopipe.layouts.costs import LayoutCosts
from octopipe.layouts.layout import Job
from octopipe.plan import Plan
from octopipe.plan.shape import JobShape
from octopipe.profile import DataParallel
from octopipe.sim import SimResult, Simulator

PARTITION = "uniform"  # Megatron-LM's: blocks evenly, the embedding first, the head last


@dataclass(frozen=True)
class Given:
    """The layout to predict and the schedule it runs."""

    layout: JobShape
    schedule: str = "1f1b"
    chunks: int | None = None  # stages per device (interleaved and V schedules)
    partition: str = PARTITION  # or "titan": the embedding and the head count as a block each


@dataclass(frozen=True)
class Breakdown:
    """The step on the busiest device, in seconds: its compute, the forward it redoes, the
    tensor-, context- and expert-parallel communication it leaves exposed, ZeRO-2/3's
    per-microbatch gathers and scatters it leaves exposed, the time it waits in the pipeline
    (bubbles and transfers), the data-parallel reductions (and the weights' all-gather) not
    hidden behind compute, and the optimizer update. They add up to the step."""

    compute: float
    recompute: float
    tp_comm: float
    cp_comm: float
    ep_comm: float
    fsdp_comm: float
    bubble: float
    dp_exposed: float
    optimizer: float

    @property
    def total(self) -> float:
        return sum(vars(self).values())


@dataclass(frozen=True)
class Estimate:
    job: Job
    given: Given
    plan: Plan
    sim: SimResult
    step_time: float
    breakdown: Breakdown
    model_flops: float  # per step, over all GPUs (docs/COSTMODEL.md)
    hardware_flops: float  # the same with what recomputation redoes
    band: ErrorBand  # the model's held-out error on published runs like this one

    @property
    def tokens_per_second(self) -> float:
        return self.job.tokens / self.step_time

    def tflops_per_gpu(self, hardware: bool = False) -> float:
        flops = self.hardware_flops if hardware else self.model_flops
        return flops / self.step_time / self.job.cluster.size / 1e12

    @property
    def mfu(self) -> float:
        return self.tflops_per_gpu() * 1e12 / self.job.cluster.reference.peak_flops

    @property
    def hfu(self) -> float:
        return self.tflops_per_gpu(hardware=True) * 1e12 / self.job.cluster.reference.peak_flops

    @property
    def peak_memory_bytes(self) -> float:
        return max(self.sim.peak_memory_bytes)

    @property
    def static_memory_bytes(self) -> float:
        """The static bytes (weights, gradients, optimizer state) of the peak's device."""
        peaks = self.sim.peak_memory_bytes
        return self.sim.static_memory_bytes[max(range(len(peaks)), key=peaks.__getitem__)]

    def summary(self) -> dict[str, Any]:
        """Everything `--json` prints, as plain JSON values (seconds, bytes, FLOP/s)."""
        from octopipe.costmodel.memory_band import memory_band

        lay, memory = self.given.layout, memory_band()
        return {
            "model": self.job.config,
            "gpus": self.job.cluster.size,
            "layout": {
                **lay.degrees(),
                "schedule": self.given.schedule,
                "chunks": self.plan.num_stages // self.plan.num_devices,
            },
            "precision": self.job.stack.precision,
            "step_time": self.step_time,
            "tokens_per_second": self.tokens_per_second,
            "model_tflops_per_gpu": self.tflops_per_gpu(),
            "hardware_tflops_per_gpu": self.tflops_per_gpu(hardware=True),
            "mfu": self.mfu,
            "hfu": self.hfu,
            "peak_memory_bytes": self.peak_memory_bytes,
            "static_memory_bytes": self.static_memory_bytes,
            "capacity_bytes": min(self.sim.capacity_bytes),
            "fits": self.sim.fits,
            "breakdown": vars(self.breakdown),
            "error_band": {**self.band.summary(), "like": self.band.describe()},
            "memory_error": {**memory.summary(), "describe": memory.describe()},
        }


def check_given(job: Job, given: Given) -> None:
    """Refuse, in one line, degrees that do not make the job (before anything is built)."""
    lay, cluster = given.layout, job.cluster
    for flag, value in (("--tp", lay.tp), ("--cp", lay.cp), ("--pp", lay.pp), ("--dp", lay.dp)):
        if value < 1:
            raise InputError(flag, f"must be at least 1, got {value}")
    if lay.world_size != cluster.size:
        raise InputError(
            "--gpus",
            f"TP {lay.tp} x CP {lay.cp} x PP {lay.pp} x DP {lay.dp} = {lay.world_size} GPUs, "
            f"not the {cluster.size} given",
        )
    if min(cluster.gpus_per_node, cluster.size) % lay.tp:
        raise InputError("--tp", f"{lay.tp} does not divide a node of {cluster.gpus_per_node}")
    if job.seq_len % lay.cp:
        raise InputError("--cp", f"{lay.cp} does not divide the sequence length {job.seq_len}")
    ranks = lay.tp * lay.cp * lay.dp
    if lay.etp and min(cluster.gpus_per_node, cluster.size) % lay.etp:
        raise InputError("--etp", f"{lay.etp} does not divide a node of {cluster.gpus_per_node}")
    if ranks % (lay.ep * lay.expert_tp):
        raise InputError(
            "--ep",
            f"EP {lay.ep} x expert TP {lay.expert_tp} does not divide the TP x CP x DP = "
            f"{ranks} ranks of a stage (MoE parallel folding)",
        )
    ranks = lay.dp * lay.cp
    if lay.shard_group:
        if lay.zero < 2:
            raise InputError("--shard-group", "shards gradients and weights: needs --zero 2 or 3")
        if ranks % lay.shard_group or lay.shard_group % lay.cp:
            raise InputError(
                "--shard-group",
                f"{lay.shard_group} must divide the DP x CP = {ranks} ranks and be a multiple "
                f"of CP {lay.cp}",
            )
    per_step = lay.dp * lay.microbatch_size
    if job.global_batch % per_step:
        raise InputError(
            "--global-batch",
            f"{job.global_batch} samples do not split into DP {lay.dp} x microbatches of "
            f"{lay.microbatch_size}",
        )


def estimate(job: Job, given: Given, costs: LayoutCosts | None = None) -> Estimate:
    """The predicted step of `given` (its layout's microbatch count is set from the batch)."""
    from octopipe.baselines import make_baseline

    check_given(job, given)
    lay = given.layout
    lay = replace(lay, num_microbatches=job.global_batch // (lay.dp * lay.microbatch_size))
    given = replace(given, layout=lay)
    costs = costs or LayoutCosts(job)
    if lay.ep > 1 and not costs.arch.has_experts:
        raise InputError("--ep", f"{job.config} has no MoE experts to spread over {lay.ep} ranks")
    if lay.etp and not costs.arch.has_experts:
        raise InputError("--etp", f"{job.config} has no MoE experts to split")
    try:
        profile, replicas = costs.profile(lay)
    except InputError as exc:  # the model's heads (or experts) do not split TP ways
        flag = {"tensor_parallel": "--tp", "expert_parallel": "--ep"}.get(exc.place or "")
        if flag is not None:
            raise InputError(flag, exc.message) from None
        raise
    plan = make_baseline(
        profile, given.schedule, given.partition, lay.pp, lay.num_microbatches, given.chunks
    )
    # The slowest replica sets the step (a mixed cluster's replicas differ).
    runs = []
    for devices in replicas:
        on = profile.with_devices(devices)
        runs.append((Simulator(on).run(plan, detail=False), on))
    sim, profile = max(runs, key=lambda r: r[0].iteration_time)
    alone = profile.model_copy(update={"data_parallel": DataParallel()})
    pipeline = Simulator(alone).run(plan, detail=False).iteration_time
    tail = costs.tail(lay, plan, profile)
    parts = costs.busy_parts(lay, plan, profile)
    busiest: TimeParts = max(parts, key=lambda p: p.total)
    breakdown = Breakdown(
        compute=busiest.compute,
        recompute=busiest.recompute,
        tp_comm=busiest.tp_comm,
        cp_comm=busiest.cp_comm,
        ep_comm=busiest.ep_comm,
        fsdp_comm=busiest.dp_comm,
        bubble=pipeline - busiest.total,
        dp_exposed=sim.iteration_time - pipeline + tail.all_gather,
        optimizer=tail.optimizer,
    )
    flops, redone = step_flops(costs, lay, job)
    return Estimate(
        job=job,
        given=given,
        plan=plan.with_predicted(sim.predicted()),
        sim=sim,
        step_time=sim.iteration_time + tail.total,
        breakdown=breakdown,
        model_flops=flops,
        hardware_flops=flops + redone,
        band=band_of(job, lay, costs.arch.moe is not None),
    )


def band_of(job: Job, layout: JobShape, moe: bool) -> ErrorBand:
    """The held-out error of published runs like this layout's (`costmodel/error_band.py`):
    same GPU, precision and model kind (`moe`), most parallelism kinds in common."""
    kinds = layout_kinds(layout.tp, layout.cp, layout.pp, layout.ep, layout.zero)
    hardware = job.cluster.reference.name
    return error_band(hardware, job.stack.precision, kinds, moe)


def step_flops(costs: LayoutCosts, layout: JobShape, job: Job) -> tuple[float, float]:
    """Model FLOPs of one step over all GPUs, and the FLOPs recomputation adds to them: per
    sample, as the model is without any parallelism (the model-FLOPs convention)."""
    one = replace(layout, tp=1, cp=1, microbatch_size=1)
    settings = costs.settings(one)
    per_sample = model_flops(costs.arch, settings)
    redone = sum(e.recompute_flops for e in costs.layers(one))
    return job.global_batch * per_sample, job.global_batch * redone
