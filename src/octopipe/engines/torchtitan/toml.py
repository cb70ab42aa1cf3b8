"""The torchtitan job-config fragment for torchtitan up to 0.2, which read TOML job files:
`torchtitan.toml`. torchtitan 0.3 reads no TOML; its export is `titan_config`.

`torchtitan_settings` / `write_torchtitan_toml`: the `[parallelism]` keys that make torchtitan
build the plan's stages from the profile's module names and run the CSV's order, with the plan's
tensor- and data-parallel degrees, plus the `[training]` batch sizes that yield the plan's
microbatch count and size. torchtitan places stages on ranks itself, looped or V-shaped (two per
rank), chosen by the schedule name; a plan with another placement gets a warning in the file
(`octopipe plan --torchtitan` avoids them). The names are the profile's as they are (torchtitan
0.2's Llama called its head `output`).

Nothing here decides or evaluates a plan.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from octopipe.engines.answer import microbatch_size, planned_shape
from octopipe.engines.torchtitan.plan import (
    batch_sizes,
    caveats,
    comment_lines,
    module_fqns_per_model_part,
    placement_style,
    schedule_name,
)
from octopipe.outfiles import write_text
from octopipe.plan import Plan
from octopipe.profile import Profile


def torchtitan_settings(plan: Plan, profile: Profile, csv_path: str) -> dict[str, dict[str, Any]]:
    """torchtitan 0.2 job-config sections reproducing `plan` (key names of its JobConfig); an
    unknown microbatch size is taken as 1."""
    shape = planned_shape(plan, profile)
    tp, dp = shape.tp, shape.dp
    local_batch, global_batch = batch_sizes(plan, profile)
    return {
        "parallelism": {
            "pipeline_parallel_degree": plan.num_devices,
            "pipeline_parallel_schedule": schedule_name(plan),
            "pipeline_parallel_schedule_csv": csv_path,
            "pipeline_parallel_microbatch_size": microbatch_size(plan, profile) or 1,
            "module_fqns_per_model_part": module_fqns_per_model_part(plan, profile),
            "tensor_parallel_degree": tp,
            "data_parallel_replicate_degree": dp,
            # torchtitan's default (-1) shards over every rank left, i.e. FSDP; the plan's
            # memory and gradient all-reduce are those of whole replicas.
            "data_parallel_shard_degree": 1,
        },
        "training": {"local_batch_size": local_batch, "global_batch_size": global_batch},
        **_quantization(profile),
    }


def _quantization(profile: Profile) -> dict[str, dict[str, Any]]:
    """torchtitan 0.2's converters for the precision priced: the blocks' linears (and any
    experts' grouped GEMMs) in FP8 with per-tensor scaling computed at each cast (the cost
    model's current scaling), or MXFP8; the output head in BF16, as priced."""
    if profile.precision == "bf16":
        return {}
    moe = any(layer.kind in ("moe", "moe_mlp") for layer in profile.layers)
    kind = "float8" if profile.precision == "fp8" else "mx"
    converters = [f"quantize.linear.{kind}", *([f"quantize.grouped_mm.{kind}"] if moe else [])]
    linear: dict[str, Any] = (
        {"recipe_name": "tensorwise", "filter_fqns": ["output"]}
        if kind == "float8"
        else {"recipe_name": "mxfp8_cublas", "filter_fqns": ["output"]}
    )
    out = {"model": {"converters": converters}, f"quantize.linear.{kind}": linear}
    if moe:
        out[f"quantize.grouped_mm.{kind}"] = {"fqns": ["experts"]}
    return out


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
        "# For torchtitan up to 0.2 (TOML job files); for 0.3, see octopipe_torchtitan.py.\n"
        f"# {plan.num_stages} stages on {plan.num_devices} devices, "
        f"{plan.num_microbatches} microbatches.\n"
        "# Merge into your job's config.\n"
    )
    header += comment_lines(caveats(plan, profile))
    if placement_style(plan) == "free":
        header += (
            "# WARNING: torchtitan 0.2 cannot place this plan's stages as planned (it only builds\n"
            "# looped or two-per-rank V placements); plan with `octopipe plan --torchtitan`, or\n"
            "# run octopipe_torchtitan.py in torchtitan 0.3, which places any stage-to-rank map.\n"
        )
    header += "\n"
    body = to_toml(torchtitan_settings(plan, profile, csv_path))
    write_text(path, header + body)  # UTF-8 (TOML's) whatever the locale, whole or not at all
