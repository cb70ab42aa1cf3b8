"""`octopipe estimate`: predict one given layout of a training job, with no search.

Prints the step time, tokens/s, TFLOP/s per GPU and MFU, peak memory per GPU against its
capacity, and where the step goes on the busiest device; `--json` puts all of it on the last
line. The model behind it is `octopipe.layouts.estimate` (the one `plan --gpus` searches with).
"""

from __future__ import annotations

import argparse

from octopipe.commands._stack_args import add_stack_arguments, stack_from_args
from octopipe.config.flags import count, number
from octopipe.costmodel.hardware import PRESETS
from octopipe.costmodel.settings import RECOMPUTE_KINDS
from octopipe.errors import InputError
from octopipe.jsonfile import dumps
from octopipe.layouts.layout import DEFAULT_HEADROOM
from octopipe.limits import (
    MAX_CHUNKS,
    MAX_GLOBAL_BATCH,
    MAX_MICRO_BATCH_SIZE,
    MAX_PARALLEL_DEGREE,
    MAX_SEQ_LEN,
)
from octopipe.schedules import SCHEDULES

NAME = "estimate"
HELP = "Predict one given TP x CP x PP x DP layout: step time, TFLOP/s, MFU, memory, breakdown."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="shipped model name or config.json")
    p.add_argument("--hardware", default="h100", help=f"GPU preset: {', '.join(PRESETS)}")
    p.add_argument(
        "--gpus",
        required=True,
        help="GPUs of the job: a count of --hardware GPUs, or counts of presets (4xh100,4xa100)",
    )
    p.add_argument(
        "--gpus-per-node",
        type=count(1, 1024),
        help="GPUs per NVLink domain (default: the preset's: 8, GB200 NVL72's 72)",
    )
    g = p.add_argument_group("the layout")
    for flag, what in (
        ("--tp", "tensor-parallel degree"),
        ("--cp", "context-parallel degree"),
        ("--pp", "pipeline-parallel degree (devices of one pipeline)"),
        ("--ep", "expert-parallel degree (MoE experts over that many of the TP x CP x DP ranks)"),
    ):
        g.add_argument(flag, type=count(1, MAX_PARALLEL_DEGREE), default=1, help=what)
    g.add_argument(
        "--etp",
        type=count(1, MAX_PARALLEL_DEGREE),
        help="expert TP of the MoE layers, folded with EP over TP x CP x DP (Megatron-Core's "
        "MoE parallel folding; default: TP without EP, 1 with it)",
    )
    g.add_argument(
        "--dp",
        type=count(1, MAX_PARALLEL_DEGREE),
        help="data-parallel degree (default: the GPUs left)",
    )
    g.add_argument(
        "--micro-batch-size",
        type=count(1, MAX_MICRO_BATCH_SIZE),
        default=1,
        help="samples per microbatch",
    )
    g.add_argument(
        "--global-batch",
        type=count(1, MAX_GLOBAL_BATCH),
        required=True,
        help="samples per step",
    )
    g.add_argument("--seq-len", type=count(1, MAX_SEQ_LEN), default=4096, help="tokens per sample")
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
    g.add_argument(
        "--recompute", choices=RECOMPUTE_KINDS, default="none", help="activation recomputation"
    )
    g.add_argument(
        "--zero",
        type=count(0, 3),
        default=0,
        help="ZeRO stage over DP x CP: 1 the optimizer state sharded (distributed optimizer), "
        "2 also the gradients, 3 also the weights (FSDP; held across microbatches under PP)",
    )
    g.add_argument(
        "--shard-group",
        type=count(1, MAX_PARALLEL_DEGREE),
        help="HSDP: ZeRO-2/3 shards over groups of this many DP x CP ranks, replicated across "
        "the groups (default: all of them)",
    )
    g.add_argument(
        "--memory-headroom",
        type=number(0, 1, below=True),
        default=DEFAULT_HEADROOM,
        help="fraction of each GPU's memory a plan leaves free (fragmentation, workspaces)",
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
    dp = args.dp
    if dp is None:
        group = args.tp * args.cp * args.pp
        if cluster.size % group:
            raise InputError(
                "--dp", f"TP x CP x PP = {group} does not divide the {cluster.size} GPUs"
            )
        dp = cluster.size // group
    layout = JobShape(
        tp=args.tp,
        pp=args.pp,
        dp=dp,
        microbatch_size=args.micro_batch_size,
        num_microbatches=1,  # set from the global batch
        zero=args.zero,
        shard_group=args.shard_group or 0,
        etp=args.etp or 0,
        cp=args.cp,
        recompute=args.recompute,
        ep=args.ep,
        rank_order=args.rank_order or DEFAULT_RANK_ORDER,
    )
    stack = stack_from_args(args)
    job = Job(
        args.model,
        cluster,
        args.global_batch,
        args.seq_len,
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
    capacity = min(result.sim.capacity_bytes)
    fits = "fits" if result.sim.fits else "[red]does not fit[/red]"
    memory = f"{fmt_bytes(result.peak_memory_bytes)} of {fmt_bytes(capacity)}: {fits}"
    summary.add_row("peak memory per GPU", memory)
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
