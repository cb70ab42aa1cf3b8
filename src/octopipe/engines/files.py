"""What `octopipe plan` writes for an answer, in one place: plan.json and schedule.csv (what every
engine reads), the profile a cluster plan was priced on, the timelines where they can be drawn in
the time left, and each engine's exports with the lines that launch them (`write_exports`).

    written = write_answer(engine, answer, out, pictures=True, seconds_left=20.0)
    written.files, written.lines, written.notes
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

from octopipe.engines import Answer, Engine, write_exports
from octopipe.engines.megatron import ARGS_FILE, LAUNCH_FILE
from octopipe.engines.torchtitan import TOML_FILE
from octopipe.engines.torchtitan.config import CONFIG_MODULE, STAGES_MODULE
from octopipe.plan import Plan, save_plan, save_schedule_csv

# Every file `write_answer` may write: checked before the search, so that none stands there as
# a folder, a device or a FIFO.
OUTPUT_FILES = (
    "plan.json",
    "schedule.csv",
    TOML_FILE,
    f"{CONFIG_MODULE}.py",
    f"{STAGES_MODULE}.py",
    "timeline.png",
    "timeline.html",
    "profile.json",
    ARGS_FILE,
    LAUNCH_FILE,
)
PICTURE_SECONDS = (0.5, 30e-6)  # timeline.png + .html: fixed, per action (benchmarks/bench_viz)


@dataclass(frozen=True)
class Written:
    """What was written: the files' names, the lines that launch them, and notes (what was
    not drawn, and why)."""

    files: tuple[str, ...] = ()
    lines: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


def picture_seconds(num_actions: int) -> float:
    fixed, per_action = PICTURE_SECONDS
    return fixed + per_action * num_actions


def pictures_note(plan: Plan, seconds_left: float) -> str | None:
    """Why the plan's timelines are not drawn in the time left, or None where they fit (the
    time budget is a bound)."""
    n = sum(len(acts) for acts in plan.schedule.values())
    if picture_seconds(n) <= seconds_left:
        return None
    return (
        f"no timeline drawn: {n:,} actions take about {picture_seconds(n):.0f} s to draw, "
        f"{max(seconds_left, 0):.0f} s of --time-budget are left"
    )


def write_answer(
    engine: Engine,
    answer: Answer,
    out: Path,
    pictures: bool = True,
    seconds_left: float = math.inf,
    with_profile: bool = False,
) -> Written:
    """Write the answer's files into `out` (made if missing): plan.json with its layer names
    and what its profile was for, schedule.csv, with `with_profile` the profile, every export
    of `engine`'s (`engines.write_exports`) and, with `pictures` where they fit the time left,
    the timelines."""
    profile = answer.profile
    plan = answer.plan.with_layer_names(profile.layer_names).made_for(profile)
    answer = replace(answer, plan=plan)
    out.mkdir(parents=True, exist_ok=True)
    files = []
    if with_profile:
        from octopipe.profile import save_profile

        save_profile(profile, out / "profile.json")
        files.append("profile.json")
    save_plan(plan, out / "plan.json")
    save_schedule_csv(plan, out / "schedule.csv")
    files += ["plan.json", "schedule.csv"]
    exported, lines = write_exports(engine, answer, out)
    files += exported
    note = pictures_note(plan, seconds_left) if pictures else None
    if pictures and note is None:
        files += _draw(answer, out)
    return Written(tuple(files), tuple(lines), (note,) if note else ())


def _draw(answer: Answer, out: Path) -> list[str]:
    from octopipe.sim import Simulator
    from octopipe.viz.html import save_html_timeline
    from octopipe.viz.style import gpu_names
    from octopipe.viz.timeline import save_timeline

    profile = answer.profile
    result = Simulator(profile).run(answer.plan, detail=True)
    title, names = f"{profile.name}: tuned plan", gpu_names(profile)
    save_timeline(result, out / "timeline.png", title=title, device_names=names)
    save_html_timeline(result, out / "timeline.html", title=title, device_names=names)
    return ["timeline.png", "timeline.html"]
