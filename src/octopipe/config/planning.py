"""The job settings of the commands that plan and price (`plan`, `plan --gpus`, `estimate`,
`profile-arch`) beyond `run`'s: the cluster, the shape's degrees `run` takes from its plan, the
precision. Each is a `setting(...)` as `run`'s are (`job.py`), and the settings both share (the
model, TP, CP, DP, EP, the ZeRO stage, the sequence, the microbatch size, the global batch) are
`run`'s own: every command's flags for them come from one definition (`add_job_flags`), with
one meaning and one default rule, and docs/FORMATS.md lists them all (`docs.py`).

    add_job_flags(parser, ("model.name", "cluster.hardware", "parallelism.tp", ...))
    args.tp, args.hardware       # each flag's value by its keyword; None where not given

A setting's default of None means "not given": each command resolves it by the rule its doc
states (the plan's where there is one, else the default the doc names: `resolved`).
Stdlib only.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from octopipe.config.fields import Setting, setting, settings_of
from octopipe.config.flags import add_setting_flag
from octopipe.config.job import SECTIONS as RUN_SECTIONS
from octopipe.costmodel.hardware import PRESETS
from octopipe.costmodel.precision import FP8_SCALINGS, PRECISIONS
from octopipe.limits import MAX_PARALLEL_DEGREE
from octopipe.plan.shape import RANK_ORDERS, RECOMPUTE_KINDS

# A plan "fits" when its peak stays under this fraction less than each GPU's capacity: room for
# the allocator's fragmentation, kernels' workspaces and the CUDA context, which no plan counts.
DEFAULT_HEADROOM = 0.05
# What the planning commands take where a run-setting's default says "the plan's": there is
# no plan yet.
PLANNING_DEFAULTS = {
    "data.seq_len": 4096,
    "data.micro_batch_size": 1,
    "data.global_batch": 512,
    "parallelism.tp": 1,
    "parallelism.cp": 1,
    "parallelism.ep": 1,
    "parallelism.zero": 0,
    "shape.pp": 1,
}


@dataclass(frozen=True)
class ClusterSection:
    hardware: str = setting(
        "h100",
        f"the GPU preset (docs/COSTMODEL.md): {', '.join(PRESETS)}",
        flag="--hardware",
    )
    gpus: str | None = setting(
        None,
        "GPUs of the job: a count of --hardware GPUs (16), or counts of presets "
        f"(4xh100,4xa100: whole nodes of each; presets: {', '.join(PRESETS)})",
        flag="--gpus",
    )
    gpus_per_node: int | None = setting(
        None,
        "GPUs per node, the NVLink domain (default: the preset's: 8, GB200 NVL72's 72)",
        flag="--gpus-per-node",
        low=1,
        high=1024,
    )
    memory_headroom: float = setting(
        DEFAULT_HEADROOM,
        "fraction of each GPU's memory a plan leaves free (fragmentation, workspaces)",
        flag="--memory-headroom",
        low=0,
        high=1,
        open_high=True,
    )


@dataclass(frozen=True)
class ShapeSection:
    pp: int | None = setting(
        None,
        "pipeline-parallel degree: devices of one pipeline (default 1)",
        flag="--pp",
        low=1,
        high=MAX_PARALLEL_DEGREE,
    )
    etp: int | None = setting(
        None,
        "expert TP of the MoE layers, folded with EP over TP x CP x DP (Megatron-Core's MoE "
        "parallel folding; default: TP without EP, 1 with it)",
        flag="--etp",
        low=1,
        high=MAX_PARALLEL_DEGREE,
    )
    shard_group: int | None = setting(
        None,
        "HSDP: ZeRO-2/3 shards over groups of this many DP x CP ranks, replicated across the "
        "groups (default: all of them)",
        flag="--shard-group",
        low=1,
        high=MAX_PARALLEL_DEGREE,
    )
    recompute: str = setting(
        "none",
        "activation recomputation of every block: none, selective (the attention core) or "
        "full (the flag alone: full)",
        flag="--recompute",
        choices=RECOMPUTE_KINDS,
        flag_const="full",
    )
    rank_order: str | None = setting(
        None,
        "how ranks are numbered: octopipe (TP, CP, PP, DP) or megatron (Megatron-Core's "
        "tp-cp-ep-dp-pp, PP outermost); default octopipe, or with plan --gpus every order the "
        "--runner runs, each priced (torchtitan numbers PP outermost only)",
        flag="--rank-order",
        choices=RANK_ORDERS,
    )


@dataclass(frozen=True)
class PrecisionSection:
    precision: str = setting(
        "bf16",
        "the blocks' GEMMs in BF16, FP8 (Transformer Engine, Hopper and later) or MXFP8 "
        "(Blackwell); attention, norms, embedding, head and optimizer stay as they are",
        flag="--precision",
        choices=PRECISIONS,
    )
    fp8_scaling: str = setting(
        "delayed",
        "FP8's per-tensor scaling: delayed (amax history) or current (an amax pass first)",
        flag="--fp8-scaling",
        choices=FP8_SCALINGS,
    )


PLANNING_SECTIONS: dict[str, type] = {
    "cluster": ClusterSection,
    "shape": ShapeSection,
    "precision": PrecisionSection,
}


def planning_settings() -> list[Setting]:
    """The planning commands' own settings, section by section."""
    return [s for name, cls in PLANNING_SECTIONS.items() for s in settings_of(name, cls)]


def job_setting(key: str) -> Setting:
    """A setting by its key, `run`'s or the planning commands'."""
    section, _, name = key.partition(".")
    cls = PLANNING_SECTIONS.get(section) or RUN_SECTIONS[section]
    found = next((s for s in settings_of(section, cls) if s.name == name), None)
    if found is None or not any(f.name == name for f in fields(cls)):
        raise KeyError(key)
    return found


def add_job_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    keys: Sequence[str],
    required: Sequence[str] = (),
) -> None:
    """The flags of these settings (by key), each as its one definition says: its doc, type,
    bounds and choices; the value lands in `args.<keyword>` (None where not given and the
    setting's default is "not given")."""
    for key in keys:
        add_setting_flag(parser, job_setting(key), required=key in required)


def resolved(args: argparse.Namespace, key: str) -> Any:
    """A planning command's value of a setting: the flag's, else what the planning commands
    take where the setting's default is "the plan's" (`PLANNING_DEFAULTS`)."""
    value = getattr(args, job_setting(key).keyword)
    return PLANNING_DEFAULTS.get(key) if value is None else value
