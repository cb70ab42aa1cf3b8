"""The training stack's flags (`layouts.stack.Stack`), shared by `estimate` and `plan --gpus`:
how the framework runs every layout (attention kernel, communication, gradient dtype). The
precision is a job setting (`config/planning.py`); `stack_from_args` reads it too."""

from __future__ import annotations

import argparse

from octopipe.config.flags import number
from octopipe.costmodel.settings import ATTENTION_KERNELS
from octopipe.layouts.stack import GRAD_DTYPE_BYTES, P2P_KINDS, Stack
from octopipe.limits import MAX_BYTES

MB = 2**20
_DEFAULT = Stack()


def add_stack_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group(
        "training stack (how the framework runs it; docs/COSTMODEL.md gives each one's source)"
    )
    g.add_argument(
        "--attention",
        choices=ATTENTION_KERNELS,
        default=_DEFAULT.attention,
        help="attention kernel: fused flash, or unfused with the score matrix in memory "
        "(Megatron-LM 2021, eager PyTorch)",
    )
    g.add_argument(
        "--sequence-parallel",
        action=argparse.BooleanOptionalAction,
        default=_DEFAULT.sequence_parallel,
        help="Megatron sequence parallelism with TP > 1",
    )
    g.add_argument(
        "--tp-comm-overlap",
        action="store_true",
        help="TP collectives overlapped with the neighbouring GEMMs (Megatron-Core's flag)",
    )
    g.add_argument(
        "--grad-dtype",
        choices=tuple(GRAD_DTYPE_BYTES),
        default=_DEFAULT.grad_dtype,
        help="dtype gradients accumulate and reduce in (fp32: main gradients)",
    )
    g.add_argument(
        "--dropout",
        type=number(0, 1, below=True),
        default=_DEFAULT.dropout,
        help="dropout probability of attention and residual branches (GPT-2: 0.1)",
    )
    g.add_argument(
        "--grad-bucket-mb",
        type=number(0, MAX_BYTES / MB, above=True),
        help="reduce gradients in buckets of this many MiB as the backward fills them "
        "(DDP: 25); without it each stage reduces after its last backward",
    )
    g.add_argument(
        "--reduce-at-end",
        action="store_true",
        help="every gradient reduction waits for the device's last action (Megatron-LM's "
        "local DDP)",
    )
    g.add_argument(
        "--scatter-gather",
        action=argparse.BooleanOptionalAction,
        default=_DEFAULT.scatter_gather,
        help="each TP rank sends its 1/t of a stage's output to the next stage (Megatron-LM)",
    )
    g.add_argument(
        "--moe-capacity-factor",
        type=number(0, 1024),
        default=_DEFAULT.moe_capacity_factor,
        help="MoE routing: 0 dropless (default); else every expert's input padded to this "
        "factor of its balanced share",
    )
    g.add_argument(
        "--moe-host-sync",
        action="store_true",
        help="each MoE layer syncs the host for its token counts, as Megatron-Core's token "
        "dispatchers do (the preset's fitted host stall per layer's F and I)",
    )
    g.add_argument(
        "--moe-a2a-overlap",
        action="store_true",
        help="MoE all-to-alls hidden behind another microbatch's compute, as Megatron-Core's "
        "--overlap-moe-expert-parallel-comm runs them (only what a phase's compute cannot "
        "cover is exposed)",
    )
    g.add_argument(
        "--p2p",
        choices=P2P_KINDS,
        default=_DEFAULT.p2p,
        help="pipeline transfers overlapped with compute, or blocking the sender "
        "(Megatron-LM 2021, DeepSpeed)",
    )


def stack_from_args(args: argparse.Namespace) -> Stack:
    bucket = None if args.grad_bucket_mb is None else max(1, round(args.grad_bucket_mb * MB))
    if args.grad_bucket_mb is not None and not args.grad_bucket_mb > 0:
        bucket = 0  # refused by Stack in one line
    return Stack(
        attention=args.attention,
        sequence_parallel=args.sequence_parallel,
        tp_comm_overlap=args.tp_comm_overlap,
        dropout=args.dropout,
        grad_dtype=args.grad_dtype,
        grad_bucket_bytes=bucket,
        reduce_at_end=args.reduce_at_end,
        p2p=args.p2p,
        scatter_gather=args.scatter_gather,
        precision=args.precision,
        fp8_scaling=args.fp8_scaling,
        moe_capacity_factor=args.moe_capacity_factor,
        moe_host_sync=args.moe_host_sync,
        moe_a2a_overlap=args.moe_a2a_overlap,
    )
