"""`octopipe calibrate`: how a run's op times (its trace) relate to its profile; writes the
profile rescaled to the run, and the per-action overhead to plan with."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from octopipe.errors import InputError

NAME = "calibrate"
HELP = (
    "Fit a run's op times (from `run --trace`) to its profile: write the profile rescaled to "
    "the run; print the per-action overhead for `plan --action-overhead`."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", required=True, help="the profile the plan was made from")
    p.add_argument("--plan", required=True, help="the plan that ran")
    p.add_argument("--trace", required=True, help="its trace, as `octopipe run --trace` wrote it")
    p.add_argument(
        "-o", "--output", required=True, help="the profile rescaled to the run (JSON) to write"
    )


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from octopipe.calibrate import (
        check_trace_of_plan,
        collect_durations,
        fit_run,
        scaled,
        stage_ratios,
    )
    from octopipe.costs import CostTable
    from octopipe.outfiles import check_output_file
    from octopipe.plan import check_layer_names, load_plan
    from octopipe.profile import load_profile, save_profile
    from octopipe.sim.graph import check_recompute
    from octopipe.trace import events_by_step, read_trace

    check_output_file("--output", args.output)
    profile = load_profile(args.profile)
    plan = load_plan(args.plan, num_layers=profile.num_layers)
    check_layer_names(plan.layer_names, profile.layer_names, args.plan)
    check_recompute(CostTable(profile), plan, args.plan)
    traced = read_trace(args.trace)
    check_trace_of_plan(traced, plan, args.trace)
    per_step = events_by_step(traced)
    steps = [s for s in per_step if s is not None]
    if not steps:
        raise InputError(args.trace, "no executor actions with a step in this trace")
    kept = steps[1:] or steps  # the first step warms up
    events = [e for s in kept for e in per_step[s]]
    durations = collect_durations((e.action, e.end - e.start) for e in events)
    fit = fit_run(profile, plan, durations, where=args.trace)
    save_profile(scaled(profile, fit.scale), args.output)
    table = Table(title=f"in run / profile, per stage (steps {kept[0]}-{kept[-1]})")
    for column in ("stage", "layers", "device", "F", "I (or B)", "W (or B)"):
        table.add_column(column, justify="right")
    for s, (stage, r) in enumerate(zip(plan.stages, stage_ratios(profile, plan, durations))):
        table.add_row(
            str(s),
            f"{stage.start}-{stage.end}",
            str(stage.device),
            f"{r.f:.3f}",
            f"{r.b:.3f}",
            f"{r.w:.3f}",
        )
    Console().print(table)
    print(
        f"over {fit.points} stage/kind pairs: in run = {fit.scale:.3f} x profile + "
        f"{fit.overhead * 1e6:.0f} us per action"
    )
    print(
        f"wrote {args.output} (the profile x {fit.scale:.3f}); plan again with "
        f"`{next_plan_command(args.output, plan, fit.overhead)}`"
    )
    return 0


def next_plan_command(profile_path: str, plan, overhead: float) -> str:
    """The `octopipe plan` command to paste: the calibrated profile, the plan's device and
    microbatch counts (a measured profile may list no devices, and the default microbatch
    count is 4 per device, not the run's), the fitted overhead, and a folder beside the
    profile for its outputs."""
    out = Path(profile_path)
    folder = out.with_name(f"{out.stem}-plan")
    words = [
        "octopipe",
        "plan",
        "--profile",
        str(out),
        "--devices",
        str(plan.num_devices),
        "--microbatches",
        str(plan.num_microbatches),
        "--action-overhead",
        f"{overhead:.6f}",
        "-o",
        str(folder),
    ]
    return shlex.join(words)
