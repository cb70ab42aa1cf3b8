"""The settings of a run that are refused before any rank starts, one line each.

Each would otherwise fail late, inside every rank at once (a timeout of 0 or inf, an optimizer
refusing its learning rate), or not at all: a nan learning rate trains nan weights.
"""

from __future__ import annotations

import math

from octopipe.errors import InputError


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
