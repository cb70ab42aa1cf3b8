"""A plan in torchtitan's terms: the values both torchtitan writers (the 0.3 config module and
the 0.2 TOML) take from a plan and its profile: the degrees, the microbatch size, the batch
sizes that give the plan's microbatch count, the schedule name and the placement style.

Nothing here writes a file or knows a torchtitan version's syntax.
"""

from __future__ import annotations

import textwrap

from octopipe.engines.answer import microbatch_size, planned_shape
from octopipe.placement import torchtitan_style
from octopipe.plan import Plan, split_backwards
from octopipe.profile import Profile

# The schedule name torchtitan is given: with a CSV the order comes from the file, but the name
# still picks how torchtitan assigns stages to ranks (a V schedule means the V placement).
TORCHTITAN_SCHEDULE = {"loop": "PipelineScheduleMulti", "v": "ZBVZeroBubble"}


def placement_style(plan: Plan) -> str:
    """'loop' or 'v' when torchtitan builds the plan's stage-to-rank map itself, else 'free'."""
    return torchtitan_style(plan.placement, plan.num_devices) or "free"


def schedule_name(plan: Plan) -> str:
    """The `pipeline_parallel_schedule` that makes torchtitan place the stages as planned; a
    free placement takes the loop's name (its map then comes from elsewhere)."""
    return TORCHTITAN_SCHEDULE.get(placement_style(plan), TORCHTITAN_SCHEDULE["loop"])


def module_fqns_per_model_part(plan: Plan, profile: Profile) -> list[list[str]]:
    """Per stage (model part, in stage order), the profile's layer names it holds."""
    return [[layer.name for layer in profile.layers[s.start : s.end]] for s in plan.stages]


def batch_sizes(plan: Plan, profile: Profile) -> tuple[int, int]:
    """torchtitan's `(local_batch_size, global_batch_size)` for the plan: torchtitan runs
    local_batch_size / pipeline_parallel_microbatch_size microbatches under PP; without PP
    (one device) a local batch of one microbatch, accumulated over the plan's microbatches
    (global = local x dp x M). An unknown microbatch size is taken as 1."""
    dp = planned_shape(plan, profile).dp
    size = microbatch_size(plan, profile) or 1
    step = plan.num_microbatches * size
    local = step if plan.num_devices > 1 else size
    return local, step * dp


def splits_backward(plan: Plan) -> bool:
    """Whether the schedule runs split backwards (I and W actions)."""
    return bool(split_backwards(plan))


def caveats(plan: Plan, profile: Profile, layout_notes: bool = True) -> list[str]:
    """Where torchtitan will not run the plan exactly as it was costed, one sentence each (the
    writers put them in their files as comments). `layout_notes=False` leaves out the memory
    technique and recomputation, which the 0.3 export sets itself (`titan_layout`)."""
    out = []
    if microbatch_size(plan, profile) is None:
        out.append(
            "The profile does not record its microbatch size, so 1 was assumed; for costs of b "
            "samples, multiply pipeline_parallel_microbatch_size and both batch sizes by b."
        )
    if layout_notes and plan.shape is not None and plan.shape.zero:
        out.append(
            "The plan's memory figures assume the optimizer state sharded across the "
            "data-parallel replicas (ZeRO-1, Megatron-LM's distributed optimizer), which "
            "torchtitan does not offer as such; its FSDP (data_parallel_shard_degree) shards "
            "weights and gradients too, at other communication costs."
        )
    dp = planned_shape(plan, profile).dp
    if dp > 1 and len(set(profile.devices or ())) > 1:
        out.append(
            "torchtitan numbers ranks with the pipeline outermost (mesh pp, dp_replicate, "
            "dp_shard, cp, tp), where the plan's GPU numbering puts DP outermost (TP, CP, PP, "
            "DP); the plan's devices differ, so order the GPUs (hosts) for torchtitan's "
            "numbering."
        )
    if plan.predicted is not None and "step_time" in plan.predicted:
        out.append(
            "The plan was tuned for overlapped steps (no barrier between steps); torchtitan "
            "runs synchronous steps, each of which takes longer than step_time."
        )
    if layout_notes and plan.recompute:
        out.append(
            f"The plan has {recompute_summary(plan)}; torchtitan's activation_checkpoint is one "
            "setting for every layer, so the base config's (none under a split backward) is "
            "left as it is: memory and time differ from the plan's where stages recompute."
        )
    return out


def recompute_summary(plan: Plan) -> str:
    """What the plan's stages recompute, in words: "3 of 24 stages recompute (2 full, 1
    selective)"."""
    kinds = [plan.recompute_of(s) for s in range(plan.num_stages)]
    counted = [f"{kinds.count(k)} {k}" for k in ("full", "selective") if k in kinds]
    some = sum(k != "none" for k in kinds)
    return f"{some} of {plan.num_stages} stages recompute ({', '.join(counted)})"


def comment_lines(paragraphs: list[str], width: int = 92) -> str:
    """Paragraphs as `#` comment lines (TOML and Python share the syntax), one blank comment
    line between them. The text is OctoPipe's own prose, never a user's string."""
    blocks = ["".join(f"# {line}\n" for line in textwrap.wrap(p, width)) for p in paragraphs]
    return "#\n".join(blocks)
