"""`octopipe simulate`: predict a plan's time, bubbles and memory from a profile."""

from __future__ import annotations

import argparse
import math
import sys

from octopipe.commands._device_layers import device_layers
from octopipe.config.flags import number
from octopipe.errors import InputError
from octopipe.jsonfile import dumps
from octopipe.limits import MAX_SECONDS
from octopipe.outfiles import HTML, JSON, PICTURE, check_output_file
from octopipe.plan import check_layer_names, load_plan, warn_if_made_for_another
from octopipe.profile import load_profile
from octopipe.report import print_simulation
from octopipe.sim import Simulator

NAME = "simulate"
HELP = "Simulate a plan on a profile: iteration time, bubbles, peak memory, critical path."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", required=True, help="profile JSON (octopipe.profile/1)")
    p.add_argument("--plan", required=True, help="plan JSON (octopipe.plan/1)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.add_argument("--png", metavar="PATH", help="write a timeline picture (.png or .svg)")
    p.add_argument(
        "--html", metavar="PATH", help="write an interactive timeline (one offline HTML file)"
    )
    p.add_argument("--trace", metavar="PATH", help="write a Chrome/Perfetto trace JSON")
    p.add_argument("--memory-png", metavar="PATH", help="write each device's memory over time")
    p.add_argument(
        "--overlap-steps",
        action="store_true",
        help="steps back to back with no barrier: report the steady-state time per step "
        "(step_time) and the peak memory of the repeated run (docs/FORMATS.md)",
    )
    p.add_argument(
        "--action-overhead",
        type=number(0, MAX_SECONDS),
        default=0.0,
        metavar="SECONDS",
        help="beyond the default semantics: a fixed cost every action pays",
    )


def run(args: argparse.Namespace) -> int:
    for flag, path, kinds in (
        ("--png", args.png, PICTURE),
        ("--html", args.html, HTML),
        ("--trace", args.trace, JSON),
        ("--memory-png", args.memory_png, PICTURE),
    ):
        check_output_file(flag, path, kinds)
    profile = load_profile(args.profile)
    plan = load_plan(args.plan, num_layers=profile.num_layers)
    # load_plan checked the structure against the profile's layers; the names too, if it has them
    check_layer_names(plan.layer_names, profile.layer_names, args.plan)
    warn_if_made_for_another(plan, profile, args.plan, args.profile)
    if not (math.isfinite(args.action_overhead) and args.action_overhead >= 0):
        raise InputError(
            "--action-overhead", f"must be a finite number >= 0, got {args.action_overhead}"
        )
    if args.overlap_steps and (args.trace or args.png or args.html or args.memory_png):
        raise InputError("--overlap-steps", "draws no timeline or trace yet; drop those options")
    simulator = Simulator(profile, args.action_overhead)
    result = simulator.run(plan, check=False, where=args.plan, overlap_steps=args.overlap_steps)
    # Bounds of one synchronous step: steps overlapped pay the pipeline's fill once.
    bounds = None if args.overlap_steps else simulator.bounds(plan, args.plan)
    if args.trace:
        from octopipe.trace import write_trace

        write_trace(args.trace, result.events, "simulated")
        print(f"wrote {args.trace}", file=sys.stderr)
    if args.png or args.html or args.memory_png:
        _draw(args, result, plan, profile)
    title = f"{profile.name} / {args.plan}"
    if args.action_overhead:
        title += f", {args.action_overhead * 1e6:.0f} us per action"
    if args.json:
        summary = result.summary()
        if args.action_overhead:
            summary["action_overhead"] = args.action_overhead
        if bounds is not None:
            summary["bounds"] = bounds.to_json()
        print(dumps(summary))
    else:
        print_simulation(result, title=title)
        if bounds is not None:
            print(bounds.describe(result.iteration_time))
        print("which layers each device holds:")
        for line in device_layers(plan, profile.layer_names):
            print(f"  {line}")
    return 0


def _draw(args: argparse.Namespace, result, plan, profile) -> None:
    """The pictures asked for; the only place this command imports a plotting library."""

    from octopipe.viz.style import gpu_names

    title, names = f"{profile.name}: {args.plan}", gpu_names(profile)
    if args.png:
        from octopipe.viz.timeline import save_timeline

        save_timeline(result, args.png, title=title, device_names=names)
    if args.html:
        from octopipe.viz.html import save_html_timeline

        save_html_timeline(result, args.html, title=title, device_names=names)
    if args.memory_png:
        from octopipe.viz.memory import save_memory_plot

        save_memory_plot(result, plan, profile, args.memory_png)
    written = [x for x in (args.png, args.html, args.memory_png) if x]
    print(f"wrote {', '.join(written)}", file=sys.stderr)
