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
) -> None:
    if nproc is not None and nproc < 1:
        raise InputError("--nproc", f"must be at least 1, got {nproc}")
    if steps < 1:
        raise InputError("--steps", f"must be at least 1, got {steps}")
    if not (math.isfinite(timeout) and timeout > 0):
        raise InputError("--timeout", f"must be a positive number of seconds, got {timeout}")
    for flag, value in (("--lr", lr), ("--momentum", momentum), ("--weight-decay", weight_decay)):
        if not (math.isfinite(value) and value >= 0):
            raise InputError(flag, f"must be a finite number >= 0, got {value}")
