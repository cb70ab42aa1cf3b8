"""What an engine is handed: a plan ready to run (`Answer`), the export settings a user gave
(`Exports`), and the shape the answer runs at.

    answer = Answer(plan, profile, model="llama3-8b", gpus_per_node=8)
    planned_shape(answer.plan, answer.profile)     # the plan's JobShape, else its profile's

An answer's plan carries its shape (`Plan.shape`) where a cluster search made it; a
single-pipeline plan is one replica of its profile's TP. Nothing here writes a file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from octopipe.plan import JobShape, Plan
from octopipe.profile import Profile

if TYPE_CHECKING:
    from octopipe.layouts.stack import Stack


@dataclass(frozen=True)
class Exports:
    """The export settings given (`plan`'s flags): torchtitan's base config and the paths its
    launch command names, and whether Megatron-LM's arguments are asked for besides."""

    torchtitan_config: str | None = None  # MODULE:CONFIG; None: torchtitan's own for the model
    torchtitan_assets: str | None = None  # the tokenizer folder torchtitan reads
    torchtitan_data: str | None = None  # the data set torchtitan reads
    megatron: bool = False  # also Megatron-LM's arguments, whatever the engine

    @property
    def titan_paths(self) -> tuple[str | None, str | None]:
        return self.torchtitan_assets, self.torchtitan_data


@dataclass(frozen=True)
class Answer:
    """A plan ready to hand to an engine: with its layer names (and, from a cluster search, its
    shape and predicted figures), the profile it was priced on, and where it runs."""

    plan: Plan
    profile: Profile
    model: str  # the model as `--model` names it, or the profile's file: launch lines name it
    from_profile: bool = False  # planned from a profile file, not a model: no model config
    seq_len: int | None = None  # tokens per sequence (the launch line's), where known
    gpus_per_node: int | None = None  # None: one node holds the job
    overlap_steps: bool = False  # ranked with steps back to back
    exports: Exports = field(default_factory=Exports)
    # The framework's settings it was priced with (its overlaps; the precision is the
    # profile's): every export writes those its engine runs. None: the defaults.
    stack: Stack | None = None

    @property
    def shape(self) -> JobShape:
        return planned_shape(self.plan, self.profile)


def planned_shape(plan: Plan, profile: Profile) -> JobShape:
    """The job's shape the plan was made for: its own (`parallelism`), else the one its
    profile implies (its TP and data-parallel degree; microbatches of 1 sample where it does
    not record their size)."""
    if plan.shape is not None:
        return plan.shape
    return JobShape(
        profile.tensor_parallel,
        plan.num_devices,
        profile.data_parallel.degree,
        profile.microbatch_size or 1,
        plan.num_microbatches,
    )


def microbatch_size(plan: Plan, profile: Profile) -> int | None:
    """Samples per microbatch the plan was made for: the plan's, else the profile's; None when
    neither records it."""
    if plan.shape is not None:
        return plan.shape.microbatch_size
    return profile.microbatch_size
