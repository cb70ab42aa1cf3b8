"""Writers that hand a plan to torchtitan; the schedule CSV itself is `plan.save_schedule_csv`
(one row per rank of `{stage}{F|B|I|W}{mb}` actions, the format `torch.distributed.pipelining`'s
`_load_csv` and torchtitan's `pipeline_parallel_schedule_csv` read).

- `torchtitan_settings` / `write_torchtitan_toml`: the `[parallelism]` keys that make torchtitan
  build the plan's stages from the profile's module names and run the CSV's order, with the
  plan's tensor- and data-parallel degrees, plus the `[training]` batch sizes that yield the
  plan's microbatch count and size. torchtitan places stages on ranks itself, looped or
  V-shaped (two per rank), chosen by the schedule name; a plan with another placement gets a
  warning in the file (`octopipe plan --torchtitan` avoids them).

Nothing here decides or evaluates a plan.
"""

from __future__ import annotations

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


def microbatch_size(plan: Plan, profile: Profile) -> int | None:
    """Samples per microbatch the plan was made for: the plan's, else the profile's; None when
    neither records it."""
    if plan.parallelism is not None:
        return plan.parallelism["microbatch_size"]
    return profile.microbatch_size


def tp_dp_degrees(plan: Plan, profile: Profile) -> tuple[int, int]:
    """The tensor- and data-parallel degrees around the pipeline: the plan's, else the
    profile's."""
    if plan.parallelism is not None:
        return plan.parallelism["tp"], plan.parallelism["dp"]
    return profile.tensor_parallel, profile.data_parallel.degree


def torchtitan_settings(plan: Plan, profile: Profile, csv_path: str) -> dict[str, dict[str, Any]]:
    """torchtitan job-config sections reproducing `plan` (key names of torchtitan's JobConfig);
    an unknown microbatch size is taken as 1."""
    mbs = microbatch_size(plan, profile) or 1
    tp, dp = tp_dp_degrees(plan, profile)
    local_batch = plan.num_microbatches * mbs
    return {
        "parallelism": {
            "pipeline_parallel_degree": plan.num_devices,
            "pipeline_parallel_schedule": TORCHTITAN_SCHEDULE.get(
                torchtitan_style(plan.placement, plan.num_devices) or "loop"
            ),
            "pipeline_parallel_schedule_csv": csv_path,
            "pipeline_parallel_microbatch_size": mbs,
            "module_fqns_per_model_part": module_fqns_per_model_part(plan, profile),
            "tensor_parallel_degree": tp,
            "data_parallel_replicate_degree": dp,
            # torchtitan's default (-1) shards over every rank left, i.e. FSDP; the plan's
            # memory and gradient all-reduce are those of whole replicas.
            "data_parallel_shard_degree": 1,
        },
        # torchtitan's microbatch count is local_batch_size / pipeline_parallel_microbatch_size;
        # a global batch of local x dp means no gradient accumulation.
        "training": {"local_batch_size": local_batch, "global_batch_size": local_batch * dp},
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


# TOML basic strings must escape `"`, `\` and the control characters but tab (U+0000-U+001F,
# U+007F); tab is escaped too so that an escaped string is also safe in a comment.
_TOML_ESCAPES = {c: f"\\u{c:04X}" for c in (*range(0x20), 0x7F)} | str.maketrans(
    {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}
)


def toml_string(text: str) -> str:
    """`text` as a TOML basic string; every other character, non-ASCII included, as itself."""
    return '"' + text.translate(_TOML_ESCAPES) + '"'


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


def write_torchtitan_toml(plan: Plan, profile: Profile, path: str | Path, csv_path: str) -> None:
    header = (
        # The name escaped: a raw newline or control character would end or break the comment.
        f"# torchtitan settings for an OctoPipe plan of profile {toml_string(profile.name)}\n"
        f"# {plan.num_stages} stages on {plan.num_devices} devices, "
        f"{plan.num_microbatches} microbatches.\n"
        "# Merge into your job's config; the CSV path is relative to where torchtitan runs.\n"
    )
    if microbatch_size(plan, profile) is None:
        header += (
            "# The profile does not record its microbatch size, so 1 was assumed; for costs of\n"
            "# b samples, multiply pipeline_parallel_microbatch_size and both batch sizes by b.\n"
        )
    if plan.parallelism is not None and plan.parallelism.get("zero"):
        header += (
            "# NOTE: the plan's memory figures assume the optimizer state sharded across the\n"
            "# data-parallel replicas (ZeRO-1, Megatron-LM's distributed optimizer), which\n"
            "# torchtitan does not offer as such; its FSDP (data_parallel_shard_degree) shards\n"
            "# weights and gradients too, at other communication costs.\n"
        )
    if plan.predicted is not None and "step_time" in plan.predicted:
        header += (
            "# NOTE: the plan was tuned for overlapped steps (no barrier between steps);\n"
            "# torchtitan runs synchronous steps, each of which takes longer than step_time.\n"
        )
    if torchtitan_style(plan.placement, plan.num_devices) is None:
        header += (
            "# WARNING: torchtitan cannot place this plan's stages as planned (it only builds\n"
            "# looped or two-per-rank V placements); plan with `octopipe plan --torchtitan`.\n"
        )
    header += "\n"
    body = to_toml(torchtitan_settings(plan, profile, csv_path))
    Path(path).write_text(header + body, encoding="utf-8")  # TOML is UTF-8 whatever the locale
