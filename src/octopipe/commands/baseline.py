"""`octopipe baseline`: write the plan of a named schedule and partitioner, simulator-predicted."""

from __future__ import annotations

import argparse

from octopipe.config.flags import count
from octopipe.limits import MAX_CHUNKS, MAX_DEVICES, MAX_MICROBATCHES
from octopipe.partition import METHODS
from octopipe.schedules import DEFAULT_CHUNKS, SCHEDULES

NAME = "baseline"
HELP = "Build a baseline plan (GPipe, 1F1B, interleaved, ZB-H1/H2, ZB-V, DualPipeV) for a profile."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", required=True, help="profile JSON (octopipe.profile/1)")
    p.add_argument("--schedule", required=True, choices=SCHEDULES)
    p.add_argument(
        "--partition",
        required=True,
        choices=METHODS,
        help="uniform (Megatron-LM), titan (torchtitan), balanced (min-max stage time)",
    )
    p.add_argument(
        "--devices",
        type=count(1, MAX_DEVICES),
        help="device count (default: the profile's devices)",
    )
    p.add_argument("--microbatches", type=count(1, MAX_MICROBATCHES), required=True)
    defaults = ", ".join(f"{name} {chunks}" for name, chunks in DEFAULT_CHUNKS.items())
    p.add_argument(
        "--chunks", type=count(1, MAX_CHUNKS), help=f"stages per device (default: {defaults})"
    )
    p.add_argument("-o", "--output", required=True, help="plan JSON to write (octopipe.plan/1)")


def run(args: argparse.Namespace) -> int:
    from octopipe.api import baseline
    from octopipe.outfiles import check_output_file
    from octopipe.plan import save_plan
    from octopipe.profile import load_profile
    from octopipe.units import fmt_time

    check_output_file("--output", args.output)
    profile = load_profile(args.profile)
    num_devices = len(profile.device_list(args.devices))
    plan = baseline(
        profile, args.schedule, args.partition, args.microbatches, num_devices, args.chunks
    )
    save_plan(plan, args.output)
    pred = plan.predicted
    print(
        f"{args.schedule}/{args.partition}: {plan.num_stages} stages on {num_devices} devices, "
        f"iteration {fmt_time(pred['iteration_time'])}, bubble {pred['bubble_ratio']:.1%}, "
        f"{'fits' if pred['fits'] else 'exceeds memory'} -> {args.output}"
    )
    return 0
