"""`octopipe plan`: tune a plan for a profile (or a model config) and write it out.

Writes OUTDIR/plan.json (with `predicted`), schedule.csv, torchtitan.toml (torchtitan up to
0.2), octopipe_torchtitan.py (torchtitan 0.3, when a torchtitan base config is known, with
octopipe_torchtitan_stages.py for a placement torchtitan cannot build), megatron_args.sh
(Megatron-LM's arguments, with --megatron),
timeline.png and timeline.html (the interactive timeline; `--no-png` skips both pictures), and
prints the tuned plan beside every baseline, and the torchtitan launch command. The search
itself lives in `octopipe.tuner`; this module only gathers inputs, reports and writes files.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from octopipe.api import profile_from_config, tune
from octopipe.commands import _plan_cluster as plan_cluster
from octopipe.commands._device_layers import device_layers, print_wide
from octopipe.commands._plan_exact import check_exact, exact_order
from octopipe.config.flags import count, number
from octopipe.config.planning import add_job_flags, resolved
from octopipe.engines import Answer, get_engine
from octopipe.engines.files import OUTPUT_FILES, picture_seconds, write_answer
from octopipe.engines.torchtitan import base_config, torchtitan_names
from octopipe.engines.torchtitan.plan import recompute_summary
from octopipe.errors import InputError, MemoryExceededError
from octopipe.limits import (
    MAX_CHUNKS,
    MAX_DEVICES,
    MAX_MICROBATCHES,
    MAX_SECONDS,
    MAX_SEED,
)
from octopipe.outfiles import check_output_folder
from octopipe.profile import Profile, load_profile
from octopipe.tuner import Evaluated, TuneResult
from octopipe.units import GIB, byte_unit, fmt_column, fmt_time, parse_size, time_unit

NAME = "plan"
HELP = (
    "Tune partition, placement and schedule together; write plan.json, schedule.csv, "
    "torchtitan.toml, octopipe_torchtitan.py (torchtitan 0.3; with "
    "octopipe_torchtitan_stages.py for a placement torchtitan cannot build), megatron_args.sh "
    "(--megatron), timeline.png and timeline.html."
)

DEFAULT_MODEL = "gemma2-9b"  # large vocabulary: what an uneven pipeline costs, at a glance
DEFAULT_DEVICES = 4
DEFAULT_TIME_BUDGET = 30.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    _add_source_arguments(p)
    _add_search_arguments(p)
    _add_export_arguments(p)
    _add_output_arguments(p)
    plan_cluster.add_arguments(p)


def _add_source_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_argument_group("what to plan (a profile, or a model for the analytic cost model)")
    src.add_argument("--profile", help="profile JSON (octopipe.profile/1)")
    # The job's settings, each its one definition (`octopipe.config`).
    add_job_flags(
        src,
        (
            "model.name",
            "cluster.hardware",
            "parallelism.tp",
            "data.seq_len",
            "data.micro_batch_size",
        ),
    )


def _add_search_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--devices",
        type=count(1, MAX_DEVICES),
        help=f"device count (default: the profile's; {DEFAULT_DEVICES} for --model)",
    )
    p.add_argument(
        "--microbatches",
        type=count(1, MAX_MICROBATCHES),
        help="microbatches per iteration (default 4 x devices)",
    )
    p.add_argument(
        "--memory-limit",
        help="capacity of every device, e.g. 40GiB or 80e9 (default: the profile's or preset's)",
    )
    p.add_argument(
        "--max-chunks",
        type=_chunks,
        default=None,
        help="most stages per device to try (default `auto`: up to 4 first, then up to 8 "
        "where the layers allow and memory does not bind, uneven counts included; a count caps "
        "it, 4 being the first search alone)",
    )
    p.add_argument(
        "--time-budget",
        type=number(0, MAX_SECONDS, above=True),
        help="seconds for the whole command: baselines, search and pictures (default 30). With "
        "--gpus: a safety cap on the whole command (default 600); the search's work is counted "
        "in layouts and evaluations, so the answer is the same on any machine unless the cap "
        "cuts it (the output then says so)",
    )
    p.add_argument(
        "--seed", type=count(0, MAX_SEED), default=0, help="seed of the search's random moves"
    )
    p.add_argument(
        "--action-overhead",
        type=number(0, MAX_SECONDS),
        default=0.0,
        metavar="SECONDS",
        help="a fixed cost every action pays on top of its layers' times, which the search "
        "adds when it compares plans (e.g. the figure `octopipe calibrate` fits to a run); the "
        "plan's predicted figures keep the default semantics",
    )
    p.add_argument(
        "--overlap-steps",
        action="store_true",
        help="plan for steps run back to back with no barrier: rank plans by their steady "
        "time per step (docs/FORMATS.md); the timelines show one step",
    )
    p.add_argument(
        "--exact",
        type=number(0, MAX_SECONDS, above=True),
        metavar="SECONDS",
        help="after tuning, solve the tuned plan's partition and placement for its fastest "
        "order with an exact solver (OR-Tools' CP-SAT: pip install 'octopipe[exact]'; plans of "
        "at most 512 actions) for up to SECONDS more than --time-budget; the exact order is "
        "written where it is faster (docs/FORMATS.md, the exact scheduler)",
    )


def _add_export_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--torchtitan",
        action="store_true",
        help="only placements torchtitan builds itself (looped, or V with 2 per device); "
        "torchtitan 0.3 runs any placement through octopipe_torchtitan_stages.py",
    )
    p.add_argument(
        "--torchtitan-config",
        metavar="MODULE:CONFIG",
        help="the torchtitan 0.3 config the exported octopipe_torchtitan.py starts from, as "
        "torchtitan's --module/--config take them (e.g. llama3:llama3_8b); default: "
        "torchtitan's own config of a model of --model's shape where it has one (Llama 3, "
        "Qwen3, DeepSeek-V3, gpt-oss; docs/LAYOUTS.md), else no 0.3 export (an error with "
        "--runner torchtitan)",
    )
    p.add_argument(
        "--megatron",
        action="store_true",
        help="also write megatron_args.sh: the plan as Megatron-LM's pretraining arguments "
        "(degrees, batch sizes, distributed optimizer, recomputation, uneven stages), or say "
        "in one line why Megatron-LM cannot run it (--gpus --runner megatron implies it and "
        "plans only what Megatron-LM runs)",
    )
    p.add_argument(
        "--torchtitan-assets",
        metavar="DIR",
        help="the tokenizer folder torchtitan reads (its --hf_assets_path), written into the "
        "printed launch command; default: $TORCHTITAN_ASSETS, which the command then needs",
    )
    p.add_argument(
        "--torchtitan-data",
        metavar="PATH",
        help="the data set torchtitan reads (its --dataloader.dataset_path), written into the "
        "printed launch command; default: $TORCHTITAN_DATA, which the command then needs",
    )


def _add_output_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--quiet", action="store_true", help="no progress line (there is none in a pipe either)"
    )
    p.add_argument(
        "--no-png",
        dest="png",
        action="store_false",
        help="draw no timeline (timeline.png and timeline.html take seconds for big plans)",
    )
    p.add_argument("-o", "--output", default="octopipe-plan", help="output folder")


def run(args: argparse.Namespace) -> int:
    if args.exact is not None and args.gpus is not None:
        raise InputError("--exact", "orders the plan of one pipeline: not with --gpus")
    if args.gpus is not None:
        return plan_cluster.run(args)
    if args.runner is not None:
        raise InputError("--runner", "chooses the engine of a cluster layout: give --gpus N too")
    if args.workers is not None:
        raise InputError("--workers", "runs a cluster layout search: give --gpus N too")
    if args.time_budget is None:
        args.time_budget = DEFAULT_TIME_BUDGET
    if args.exact is not None:  # before the search: a missing solver fails at once
        check_exact(args.overlap_steps)
    started = time.perf_counter()
    out = Path(args.output)
    check_output_folder("--output", out, OUTPUT_FILES)  # before any work: fails at once
    profile = _profile(args)
    source = args.profile or args.model or DEFAULT_MODEL
    exports = plan_cluster.exports_of(args)
    if base_config(exports, source, from_profile=args.profile is not None) is not None:
        torchtitan_names(profile, source)  # a name torchtitan lacks fails before the search
    devices = profile.device_list(args.devices)  # a profile without devices needs --devices
    if args.memory_limit is not None:
        limit = parse_size(args.memory_limit, "--memory-limit")
        devices = tuple(d.model_copy(update={"memory_bytes": limit}) for d in devices)
    # The same margin as a cluster plan's: what the memory model may miss is kept free.
    usable = 1.0 - args.memory_headroom
    devices = tuple(d.model_copy(update={"memory_bytes": d.memory_bytes * usable}) for d in devices)
    profile = profile.with_devices(devices)
    P = len(devices)
    M = args.microbatches if args.microbatches is not None else 4 * P
    show = not args.quiet and sys.stderr.isatty()
    # The budget covers the whole command: what the pictures will take is set aside first.
    drawing = picture_seconds(P * M * 3) if args.png else 0.0
    budget = max(0.1 * args.time_budget, args.time_budget - drawing - since(started))
    with _progress(show, budget) as report:
        result = tune(  # every baseline too: the result is never worse than one
            profile,
            M,
            P,
            max_chunks=args.max_chunks,
            time_budget=budget,
            seed=args.seed,
            progress=report,
            torchtitan=args.torchtitan,
            action_overhead=args.action_overhead,
            overlap_steps=args.overlap_steps,
        )
    if not result.best.sim.fits:
        raise MemoryExceededError(shortfall_message(result.best))
    console = Console()
    solved = time.perf_counter()
    if args.exact is not None:  # its seconds come on top of the budget
        result = exact_order(result, profile, args.exact, args.action_overhead, console)
    answer = Answer(result.best.plan, profile, source, args.profile is not None, exports=exports)
    left = args.time_budget + since(solved) - since(started)
    written = write_answer(get_engine(), answer, out, args.png, left)
    for note in written.notes:
        Console(stderr=True).print(f"note: {note}", highlight=False)
    title = profile.name
    if args.action_overhead:
        title += f", {args.action_overhead * 1e6:.0f} us per action"
    if args.overlap_steps:
        title += ", steps overlapped (time: per step, steady state)"
    print_wide(console, comparison_table(result, title))
    console.print("which layers each device holds:")
    for line in device_layers(result.best.plan, profile.layer_names):
        console.print(f"  {line}", highlight=False, soft_wrap=True)
    if result.best.plan.recompute:
        console.print(f"the tuned plan: {recompute_summary(result.best.plan)}")
    if not args.overlap_steps:  # the bounds of one synchronous step (sim/bounds.py)
        from octopipe.sim import Simulator

        bounds = Simulator(profile, args.action_overhead).bounds(result.best.plan)
        console.print(
            f"the tuned plan: {bounds.describe(result.best.sim.iteration_time)}", highlight=False
        )
    console.print(
        f"searched {result.evaluations} candidates in {result.seconds:.1f} s"
        f"{'' if result.converged else ' (time budget reached)'}; "
        f"wrote {', '.join(written.files)}"
    )
    for line in written.lines:
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    return 0


def since(started: float) -> float:
    return time.perf_counter() - started


def shortfall_message(leanest: Evaluated) -> str:
    sim = leanest.sim
    d = max(range(sim.num_devices), key=lambda i: sim.memory_excess_bytes[i])
    return (
        f"no plan fits the devices' memory: under the leanest plan found, device {d} needs "
        f"{sim.memory_excess_bytes[d] / GIB:.2f} GiB more "
        f"({sim.peak_memory_bytes[d] / GIB:.2f} GiB peak, {sim.capacity_bytes[d] / GIB:.2f} GiB "
        "capacity)"
    )


def comparison_table(result: TuneResult, title: str) -> Table:
    best = result.best
    kept = best.label.endswith("(kept)")
    caption = (
        "vs tuned: the row's time over the tuned plan's (1.25x = 25% slower); tuned (X): the "
        "tuner's seed it started from (docs/LAYOUTS.md, reading the labels)"
    )
    if kept:
        caption += "; (kept): no plan faster than this baseline was found"
    table = Table(title=f"{title}: tuned plan vs baselines (simulated)", caption=caption)
    table.add_column("plan", overflow="fold")
    rows = [best, *sorted(result.baselines, key=lambda e: e.sim.iteration_time)]
    # Times and memory in the units of the column's largest figure: a small model's keep digits.
    time_name, per_second = time_unit(max(e.sim.iteration_time for e in rows))
    byte_name, per_byte = byte_unit(max(max(e.sim.peak_memory_bytes) for e in rows))
    for col in (f"time {time_name}", "vs tuned", "bubble", "eff.", f"peak {byte_name}", "fits"):
        table.add_column(col, justify="right", no_wrap=True, overflow="fold")
    times = fmt_column([e.sim.iteration_time * per_second for e in rows])
    peaks = fmt_column([max(e.sim.peak_memory_bytes) / per_byte for e in rows])
    for i, e in enumerate(rows):
        sim = e.sim
        table.add_row(
            e.label if i else f"[bold]{e.label}[/bold]",
            times[i],
            f"{sim.iteration_time / best.sim.iteration_time:.3f}x",
            f"{sim.bubble_ratio:.1%}",
            f"{sim.efficiency:.3f}",
            peaks[i],
            "yes" if sim.fits else "[red]no[/red]",
        )
    return table


def _profile(args: argparse.Namespace) -> Profile:
    """The profile to plan: read from --profile, or estimated for --model (listing devices)."""
    if args.profile and args.model:
        raise InputError("--profile", "give a profile or a model, not both")
    if args.profile:
        return load_profile(args.profile)
    return profile_from_config(
        args.model or DEFAULT_MODEL,
        args.hardware,
        devices=args.devices or DEFAULT_DEVICES,
        tp=resolved(args, "parallelism.tp"),
        seq_len=resolved(args, "data.seq_len"),
        micro_batch_size=resolved(args, "data.micro_batch_size"),
    )


class _progress:
    """A rich progress bar on stderr over the time budget, with the best time so far."""

    def __init__(self, show: bool, budget: float):
        self.show, self.budget = show, budget
        self.bar: Progress | None = None

    def __enter__(self):
        if not self.show:
            return None
        self.bar = Progress(
            TextColumn("tuning"),
            BarColumn(),
            TextColumn("best {task.fields[best]}"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        self.bar.start()
        self.task = self.bar.add_task("tune", total=self.budget, best="-")
        return self.report

    def report(self, best_time: float, elapsed: float) -> None:
        assert self.bar is not None
        self.bar.update(self.task, completed=min(elapsed, self.budget), best=fmt_time(best_time))

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()


def _chunks(text: str) -> int | None:
    """`--max-chunks`: a count, or `auto` (None: the tuner's default depth)."""
    return None if text == "auto" else count(1, MAX_CHUNKS)(text)
