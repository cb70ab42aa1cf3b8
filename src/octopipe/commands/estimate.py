"""`octopipe estimate`: predict one given layout of a training job, with no search.

Prints the step time, tokens/s, TFLOP/s per GPU and MFU, peak memory per GPU against its
capacity, and where the step goes on the busiest device; `--json` puts all of it on the last
line. The model behind it is `octopipe.layouts.estimate` (the one `plan --gpus` searches with).
"""

from __future__ import annotations

import argparse

from octopipe.commands._stack_args import add_stack_arguments, stack_from_args
from octopipe.config.flags import count
from octopipe.config.planning import add_job_flags, resolved
from octopipe.errors import InputError
from octopipe.jsonfile import dumps
from octopipe.limits import (
    MAX_CHUNKS,
)
from octopipe.schedules import SCHEDULES

NAME = "estimate"
HELP = "Predict one given TP x CP x PP x DP layout: step time, TFLOP/s, MFU, memory, breakdown."


# The job's settings this command takes, each its one definition (`octopipe.config`).
CLUSTER = ("model.name", "cluster.hardware", "cluster.gpus", "cluster.gpus_per_node")
LAYOUT = (
    "parallelism.tp",
    "parallelism.cp",
    "shape.pp",
    "parallelism.ep",
    "shape.etp",
    "parallelism.dp",
    "data.micro_batch_size",
    "data.global_batch",
    "data.seq_len",
    "shape.recompute",
    "parallelism.zero",
    "shape.shard_group",
    "cluster.memory_headroom",
    "shape.rank_order",
    "precision.precision",
    "precision.fp8_scaling",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_job_flags(p, CLUSTER, required=("model.name", "cluster.gpus"))
    g = p.add_argument_group("the layout")
    add_job_flags(g, LAYOUT)
    g.add_argument("--schedule", choices=SCHEDULES, default="1f1b", help="pipeline schedule")
    g.add_argument(
        "--chunks",
        type=count(1, MAX_CHUNKS),
        help="stages per device (interleaved, V schedules)",
    )
    g.add_argument(
        "--partition",
        choices=("uniform", "titan"),
        default="uniform",
        help="blocks per stage: uniform (Megatron-LM's), or titan: the embedding and the head "
        "count as a block each (torchtitan; Megatron-Core's account_for_embedding/loss_in_"
        "pipeline_split)",
    )
    add_stack_arguments(p)
    p.add_argument("--json", action="store_true", help="everything as JSON on the last line")


def run(args: argparse.Namespace) -> int:
    from octopipe.layouts.cluster import Cluster, parse_gpus
    from octopipe.layouts.estimate import Given, estimate
    from octopipe.layouts.layout import Job
    from octopipe.plan.shape import DEFAULT_RANK_ORDER, JobShape

    groups = parse_gpus(args.gpus, args.hardware)
    per_node = args.gpus_per_node or min(g.hardware.nvlink_domain for g in groups)
    cluster = Cluster(groups, per_node)
    tp, cp, pp = (resolved(args, k) for k in ("parallelism.tp", "parallelism.cp", "shape.pp"))
    dp = args.dp
    if dp is None:  # the GPUs left
        if cluster.size % (tp * cp * pp):
            raise InputError(
                "--dp", f"TP x CP x PP = {tp * cp * pp} does not divide the {cluster.size} GPUs"
            )
        dp = cluster.size // (tp * cp * pp)
    layout = JobShape(
        tp=tp,
        pp=pp,
        dp=dp,
        microbatch_size=resolved(args, "data.micro_batch_size"),
        num_microbatches=1,  # set from the global batch
        zero=resolved(args, "parallelism.zero"),
        shard_group=args.shard_group or 0,
        etp=args.etp or 0,
        cp=cp,
        recompute=args.recompute,
        ep=resolved(args, "parallelism.ep"),
        rank_order=args.rank_order or DEFAULT_RANK_ORDER,
    )
    stack = stack_from_args(args)
    job = Job(
        args.model,
        cluster,
        resolved(args, "data.global_batch"),
        resolved(args, "data.seq_len"),
        stack,
        args.memory_headroom,
        layout.rank_order,
    )
    result = estimate(job, Given(layout, args.schedule, args.chunks, args.partition))
    _print(result)
    if args.json:
        print(dumps(result.summary()))
    return 0


def _print(result) -> None:
    from rich.console import Console
    from rich.table import Table

    from octopipe.costmodel.memory_band import memory_band
    from octopipe.units import fmt_bytes, fmt_time

    lay, job = result.given.layout, result.job
    chunks = result.plan.num_stages // result.plan.num_devices
    hsdp = f" (HSDP, shards of {lay.shard_group})" if lay.shard_group else ""
    title = (
        f"{job.config} on {job.cluster.describe()}: TP {lay.tp} x CP {lay.cp} x PP {lay.pp} x "
        f"DP {lay.dp}, b {lay.microbatch_size} x M {lay.num_microbatches}, "
        f"{result.given.schedule} ({chunks} per device), recompute {lay.recompute}"
        f"{f', ZeRO-{lay.zero}' if lay.zero else ''}"
        f"{hsdp}, {job.stack.precision}"
    )
    summary = Table(title=title, show_header=False)
    summary.add_column(justify="left")
    summary.add_column(justify="right")
    summary.add_row("step", fmt_time(result.step_time))
    summary.add_row("tokens/s", f"{result.tokens_per_second:,.0f}")
    summary.add_row(
        "TFLOP/s per GPU (model / hardware)",
        f"{result.tflops_per_gpu():.1f} / {result.tflops_per_gpu(hardware=True):.1f}",
    )
    summary.add_row("MFU / HFU", f"{result.mfu:.1%} / {result.hfu:.1%}")
    usable = min(result.sim.capacity_bytes)  # the GPU's memory less the headroom kept free
    gpu = min(g.hardware.memory_bytes for g in job.cluster.groups)
    fits = "fits" if result.sim.fits else "[red]does not fit[/red]"
    memory = (
        f"{fmt_bytes(result.peak_memory_bytes)} of {fmt_bytes(gpu)} ({fmt_bytes(usable)} "
        f"usable, {job.memory_headroom:.0%} kept free): {fits}"
    )
    summary.add_row("peak memory per GPU", memory)
    static = result.static_memory_bytes
    summary.add_row("  weights, gradients, optimizer state", fmt_bytes(static))
    summary.add_row("  activations held at the peak", fmt_bytes(result.peak_memory_bytes - static))
    parts = Table(title="where the step goes (the busiest device)")
    parts.add_column("part")
    parts.add_column("time", justify="right")
    parts.add_column("share", justify="right")
    names = {
        "compute": "compute",
        "recompute": "recomputation",
        "tp_comm": "exposed TP communication",
        "cp_comm": "exposed CP communication",
        "ep_comm": "exposed EP all-to-alls",
        "fsdp_comm": "exposed ZeRO-2/3 gathers and scatters",
        "bubble": "pipeline bubble and transfers",
        "dp_exposed": "exposed DP reduction",
        "optimizer": "optimizer step",
    }
    for key, label in names.items():
        seconds = getattr(result.breakdown, key)
        parts.add_row(label, fmt_time(seconds), f"{seconds / result.step_time:.1%}")
    console = Console()
    console.print(summary)
    console.print(parts)
    console.print(f"the model's error: {result.band.describe()}")
    console.print(f"the memory model's error: {memory_band().describe()}")
