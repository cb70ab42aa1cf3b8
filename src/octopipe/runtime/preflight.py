"""The settings of a run that are refused before any rank starts, one line each: numbers out
of range, combinations not built yet, a tensor-parallel plan that does not fit the model, a
checkpoint that cannot be resumed.

Each would otherwise fail late, inside every rank at once (a timeout of 0 or inf, an optimizer
refusing its learning rate), or not at all: a nan learning rate trains nan weights.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from octopipe.errors import InputError

if TYPE_CHECKING:
    from octopipe.runtime.recipe import ModelRecipe
    from octopipe.runtime.session import RunConfig


def check_run_settings(
    *,
    nproc: int | None,
    steps: int,
    timeout: float,
    lr: float,
    momentum: float,
    weight_decay: float,
    min_lr: float = 0.0,
    warmup_steps: int = 0,
    clip_norm: float | None = None,
    checkpoint_dir: object = None,
    checkpoint_every: int = 0,
    resume: bool = False,
) -> None:
    if nproc is not None and nproc < 1:
        raise InputError("--nproc", f"must be at least 1, got {nproc}")
    if steps < 1:
        raise InputError("--steps", f"must be at least 1, got {steps}")
    if not (math.isfinite(timeout) and timeout > 0):
        raise InputError("--timeout", f"must be a positive number of seconds, got {timeout}")
    for flag, value in (
        ("--lr", lr),
        ("--momentum", momentum),
        ("--weight-decay", weight_decay),
        ("--min-lr", min_lr),
    ):
        if not (math.isfinite(value) and value >= 0):
            raise InputError(flag, f"must be a finite number >= 0, got {value}")
    if clip_norm is not None and not (math.isfinite(clip_norm) and clip_norm > 0):
        raise InputError("--clip-norm", f"must be a positive number, got {clip_norm}")
    for flag, count in (("--lr-warmup", warmup_steps), ("--checkpoint-every", checkpoint_every)):
        if count < 0:
            raise InputError(flag, f"must be at least 0, got {count}")
    if (checkpoint_every or resume) and checkpoint_dir is None:
        flag = "--resume" if resume else "--checkpoint-every"
        raise InputError(flag, "needs --checkpoint-dir")


def check_overlap(config: RunConfig) -> None:
    """What overlapped steps do not combine with yet, refused in one line."""
    if not config.overlap_steps:
        return
    for flag, used in (
        ("--zero", config.zero),
        ("--checkpoint-every", config.checkpoint_every),
        ("--resume", config.resume),
    ):
        if used:
            raise InputError(flag, "not supported with --overlap-steps yet")


def check_parallelism(config: RunConfig, recipe: ModelRecipe) -> None:
    """Tensor parallelism needs a plan that applies to the model; neither it nor FSDP2 (`--zero
    3`) combines with every other setting yet."""
    if config.zero not in (0, 1, 3):
        raise InputError("--zero", f"must be 0, 1 or 3, got {config.zero}")
    if config.tp == 1:
        return
    if config.zero == 1:
        raise InputError("--zero", "1 is not supported with --tp > 1 yet; use --zero 3 (FSDP2)")
    if recipe.tp_plan is None:
        raise InputError(
            "--tp",
            f"{recipe.name} has no tensor-parallel plan: give the model a tp_plan "
            "(docs/FORMATS.md, tensor parallelism) or run it with --tp 1",
        )
    if config.seq_len % config.tp:
        raise InputError(
            "--seq-len",
            f"{config.seq_len} tokens do not split into {config.tp} equal shares "
            "(tensor parallelism splits the sequence between layers)",
        )
    from octopipe.runtime.parallel.tensor_parallel import check_plan

    check_plan(recipe.tp_plan(config.tp), recipe.meta_model)


def check_resumable(config: RunConfig, recipe: ModelRecipe) -> None:
    """A checkpoint to resume must be of this model and before the run's last step."""
    found = config.resume_from()
    if found is None:
        return
    from octopipe.runtime.checkpoint import check_compatible

    path, step = found
    check_compatible(path, recipe.layers, recipe.meta_model)
    if step >= config.steps:
        raise InputError("--steps", f"{path} is at step {step}; --steps {config.steps} is done")
