"""What `octopipe plan` writes: plan.json, schedule.csv, the torchtitan exports (0.3's
octopipe_torchtitan.py when a torchtitan base config is known, 0.2's torchtitan.toml) and the
timelines, and how long drawing them takes (the command's time budget covers it); which exports
a `plan --gpus --runner` answer may take."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rich.console import Console

from octopipe.errors import InputError
from octopipe.export import (
    SHIPPED_BASES,
    TorchtitanBase,
    torchtitan_launch_command,
    write_torchtitan_config,
    write_torchtitan_toml,
)
from octopipe.export.megatron import (
    ARGS_FILE,
    MEGATRON_TARGET,
    megatron_notes,
    megatron_world,
    write_megatron_args,
)
from octopipe.export.titan_config import CONFIG_MODULE, STAGES_MODULE
from octopipe.export.titan_layout import TitanLayout, titan_layout
from octopipe.export.titan_plan import placement_style
from octopipe.layouts.runners import get_runner
from octopipe.plan import Plan, save_plan, save_schedule_csv
from octopipe.profile import Profile
from octopipe.sim import Simulator

# Every file `write_outputs` may write (and profile.json, the cluster plan's): checked before
# the search, so that none stands there as a folder, a device or a FIFO.
OUTPUT_FILES = (
    "plan.json",
    "schedule.csv",
    "torchtitan.toml",
    f"{CONFIG_MODULE}.py",
    f"{STAGES_MODULE}.py",
    "timeline.png",
    "timeline.html",
    "profile.json",
    ARGS_FILE,
)
PICTURE_SECONDS = (0.5, 30e-6)  # timeline.png + .html: fixed, per action (benchmarks/bench_viz)


def picture_seconds(num_actions: int) -> float:
    fixed, per_action = PICTURE_SECONDS
    return fixed + per_action * num_actions


def pictures_fit(plan: Plan, seconds_left: float) -> bool:
    """Whether drawing the plan fits the time left; if not, say so (the budget is a bound)."""
    n = sum(len(acts) for acts in plan.schedule.values())
    if picture_seconds(n) <= seconds_left:
        return True
    Console(stderr=True).print(
        f"note: no timeline drawn: {n:,} actions take about {picture_seconds(n):.0f} s to draw, "
        f"{max(seconds_left, 0):.0f} s of --time-budget are left"
    )
    return False


def since(started: float) -> float:
    return time.perf_counter() - started


def write_outputs(
    plan: Plan,
    profile: Profile,
    out: Path,
    pictures: bool = True,
    torchtitan: TorchtitanBase | None = None,
    source: str | None = None,
    gpus_per_node: int | None = None,
    titan_paths: tuple[str | None, str | None] = (None, None),
) -> list[str]:
    """Write the plan's files into `out`; returns their names. With a torchtitan base config,
    also the torchtitan 0.3 config (launched over nodes of `gpus_per_node`, default one node,
    with the tokenizer folder and data of `titan_paths`), whose layer names must map to
    torchtitan's (else an InputError naming `source`, the profile's file or model); none for a
    plan torchtitan 0.3 cannot run (`torchtitan_report` says why)."""
    plan = plan.with_layer_names(profile.layer_names).made_for(profile)
    save_plan(plan, out / "plan.json")
    save_schedule_csv(plan, out / "schedule.csv")
    # Absolute: torchtitan reads the CSV from wherever it is started.
    csv_path = str((out / "schedule.csv").resolve())
    write_torchtitan_toml(plan, profile, out / "torchtitan.toml", csv_path)
    written = ["plan.json", "schedule.csv", "torchtitan.toml"]
    if torchtitan is not None and not isinstance(runs_in_torchtitan(plan, profile), str):
        where = source or profile.name
        written += write_torchtitan_config(
            plan, profile, out, torchtitan, where, gpus_per_node, *titan_paths
        )
    if not pictures:
        return written
    from octopipe.viz.html import save_html_timeline
    from octopipe.viz.style import gpu_names
    from octopipe.viz.timeline import save_timeline

    result = Simulator(profile).run(plan, detail=True)
    title, names = f"{profile.name}: tuned plan", gpu_names(profile)
    save_timeline(result, out / "timeline.png", title=title, device_names=names)
    save_html_timeline(result, out / "timeline.html", title=title, device_names=names)
    return [*written, "timeline.png", "timeline.html"]


def torchtitan_base(args: argparse.Namespace, default_model: str) -> TorchtitanBase | None:
    """The torchtitan config the 0.3 export starts from: `--torchtitan-config`, else
    torchtitan's own config of the shipped model planned (`--model`, else `default_model`);
    none for a profile."""
    if args.torchtitan_config is not None:
        return TorchtitanBase.parse(args.torchtitan_config)
    return None if args.profile else SHIPPED_BASES.get(args.model or default_model)


def runs_in_torchtitan(
    plan: Plan, profile: Profile, gpus_per_node: int | None = None
) -> TitanLayout | str:
    """How torchtitan 0.3 runs the plan, or the one line that says why it cannot."""
    try:
        return titan_layout(plan, profile, gpus_per_node)
    except InputError as exc:
        return str(exc)


def titan_paths(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """`--torchtitan-assets` and `--torchtitan-data`: the tokenizer folder and the data the
    printed torchtitan command names."""
    return args.torchtitan_assets, args.torchtitan_data


def torchtitan_report(
    plan: Plan,
    profile: Profile,
    out: Path,
    torchtitan: TorchtitanBase | None,
    gpus_per_node: int | None = None,
    titan_paths: tuple[str | None, str | None] = (None, None),
) -> str:
    """What `octopipe plan` says about running the plan in torchtitan: the 0.3 launch command
    for the config `write_outputs` wrote and a line for each place torchtitan runs it otherwise
    than planned, or why there is none."""
    if torchtitan is None:
        return (
            "torchtitan: torchtitan.toml is for torchtitan up to 0.2; for a 0.3 config, give "
            "--torchtitan-config MODULE:CONFIG (the torchtitan config to start from, e.g. "
            "llama3:llama3_8b)"
        )
    lay = runs_in_torchtitan(plan, profile, gpus_per_node)
    if isinstance(lay, str):
        return f"torchtitan 0.3: no {CONFIG_MODULE}.py: {lay}"
    command = torchtitan_launch_command(out, lay.world, gpus_per_node, *titan_paths)
    free = placement_style(plan) == "free"
    placed = " (stages placed by octopipe_torchtitan_stages.py)" if free else ""
    lines = [
        f"torchtitan 0.3{placed}, from {torchtitan.module}.{torchtitan.config}, {lay.describe()}:",
        f"  {command}",
        *(f"note: {n}" for n in lay.notes),
    ]
    return "\n".join(lines)


def megatron_report(plan: Plan, profile: Profile, out: Path) -> str:
    """Write megatron_args.sh for `plan --megatron` and say so, with a line wherever
    Megatron-LM runs the plan otherwise; or the one line why Megatron-LM cannot run it."""
    try:
        write_megatron_args(plan, profile, out / ARGS_FILE)
    except InputError as exc:
        return f"Megatron-LM: no {ARGS_FILE}: {exc}"
    lines = [
        f"Megatron-LM ({MEGATRON_TARGET}), {megatron_world(plan, profile)} GPUs: wrote "
        f'{ARGS_FILE}; source it and pass "${{MEGATRON_ARGS[@]}}" to pretrain_gpt.py with '
        "the model's, data's and optimizer's arguments",
        *(f"note: {n}" for n in megatron_notes(plan)),
    ]
    return "\n".join(lines)


def check_runner_exports(args: argparse.Namespace, runner: str) -> None:
    """An export for another engine than the answer's is refused in one line: the plan was
    searched for `runner` and would reach the other engine as something it was not priced as."""
    if runner == "megatron":
        for flag in ("torchtitan", "torchtitan_config"):
            if getattr(args, flag, None):
                raise InputError(
                    f"--{flag.replace('_', '-')}",
                    "is for torchtitan, but --runner megatron plans for Megatron-LM; drop one "
                    "(or plan with --runner torchtitan)",
                )
    elif args.megatron and runner != "octopipe":
        raise InputError(
            "--megatron",
            f"--runner {runner} plans for {get_runner(runner).engine}, not Megatron-LM; drop "
            "one (or plan with --runner megatron)",
        )
