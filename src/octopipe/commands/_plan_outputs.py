"""What `octopipe plan` writes: plan.json, schedule.csv, torchtitan.toml and the timelines,
and how long drawing them takes (the command's time budget covers it)."""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console

from octopipe.export import write_torchtitan_toml
from octopipe.plan import Plan, save_plan, save_schedule_csv
from octopipe.profile import Profile
from octopipe.sim import Simulator

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


def write_outputs(plan: Plan, profile: Profile, out: Path, pictures: bool = True) -> list[str]:
    plan = plan.with_layer_names(profile.layer_names)
    save_plan(plan, out / "plan.json")
    save_schedule_csv(plan, out / "schedule.csv")
    write_torchtitan_toml(plan, profile, out / "torchtitan.toml", "schedule.csv")
    written = ["plan.json", "schedule.csv", "torchtitan.toml"]
    if not pictures:
        return written
    from octopipe.viz.html import save_html_timeline
    from octopipe.viz.timeline import save_timeline

    result = Simulator(profile).run(plan, detail=True)
    title = f"{profile.name}: tuned plan"
    save_timeline(result, out / "timeline.png", title=title)
    save_html_timeline(result, out / "timeline.html", title=title)
    return [*written, "timeline.png", "timeline.html"]
