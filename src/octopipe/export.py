"""Writers that hand a plan to torchtitan; the schedule CSV itself is `plan.save_schedule_csv`
(one row per rank of `{stage}{F|B|I|W}{mb}` actions, the format `torch.distributed.pipelining`'s
`_load_csv` and torchtitan's `pipeline_parallel_schedule_csv` read).

- `torchtitan_settings` / `write_torchtitan_toml`: the `[parallelism]` keys that make torchtitan
  build the plan's stages from the profile's module names and run the CSV's order, plus the
  `[training]` batch size that yields the plan's microbatch count. torchtitan places stages on
  ranks itself, looped or V-shaped (two per rank), chosen by the schedule name; a plan with
  another placement gets a warning in the file (`octopipe plan --torchtitan` avoids them).

Nothing here decides or evaluates a plan.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from octopipe.placement import torchtitan_style
from octopipe.plan import Plan
from octopipe.profile import Profile

# The schedule name torchtitan is given: with a CSV the order comes from the file, but the name
# still picks how torchtitan assigns stages to ranks (a V schedule means the V placement).
TORCHTITAN_SCHEDULE = {"loop": "PipelineScheduleMulti", "v": "ZBVZeroBubble"}


def module_fqns_per_model_part(plan: Plan, profile: Profile) -> list[list[str]]:
    """Per stage (model part, in stage order), the profile's layer names it holds."""
    return [[layer.name for layer in profile.layers[s.start : s.end]] for s in plan.stages]


def torchtitan_settings(
    plan: Plan, profile: Profile, csv_path: str, microbatch_size: int = 1
) -> dict[str, dict[str, Any]]:
    """torchtitan job-config sections reproducing `plan` (key names of torchtitan's JobConfig)."""
    return {
        "parallelism": {
            "pipeline_parallel_degree": plan.num_devices,
            "pipeline_parallel_schedule": TORCHTITAN_SCHEDULE.get(
                torchtitan_style(plan.placement, plan.num_devices) or "loop"
            ),
            "pipeline_parallel_schedule_csv": csv_path,
            "pipeline_parallel_microbatch_size": microbatch_size,
            "module_fqns_per_model_part": module_fqns_per_model_part(plan, profile),
        },
        # torchtitan's microbatch count is local_batch_size / pipeline_parallel_microbatch_size.
        "training": {"local_batch_size": plan.num_microbatches * microbatch_size},
    }


def to_toml(sections: dict[str, dict[str, Any]]) -> str:
    """TOML for flat sections of ints, strings and (nested) lists of strings."""
    lines: list[str] = []
    for name, keys in sections.items():
        lines.append(f"[{name}]")
        for key, value in keys.items():
            lines.append(f"{key} = {_toml_value(value)}")
        lines.append("")
    return "\n".join(lines)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


def write_torchtitan_toml(
    plan: Plan, profile: Profile, path: str | Path, csv_path: str, microbatch_size: int = 1
) -> None:
    header = (
        f"# torchtitan settings for an OctoPipe plan of {profile.name}: {plan.num_stages} stages "
        f"on {plan.num_devices} devices, {plan.num_microbatches} microbatches.\n"
        "# Merge into your job's config; the CSV path is relative to where torchtitan runs.\n"
    )
    if torchtitan_style(plan.placement, plan.num_devices) is None:
        header += (
            "# WARNING: torchtitan cannot place this plan's stages as planned (it only builds\n"
            "# looped or two-per-rank V placements); plan with `octopipe plan --torchtitan`.\n"
        )
    header += "\n"
    body = to_toml(torchtitan_settings(plan, profile, csv_path, microbatch_size))
    Path(path).write_text(header + body)
