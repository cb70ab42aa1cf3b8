"""The learning-rate schedule a checkpoint was trained on, and what a resume does to it.

The learning rate is a function of the step and of the run's schedule (`OptimizerConfig`: peak
`lr`, `warmup_steps`, `decay`, `min_lr`, and `total_steps`, where the cosine ends: `--steps`;
the default warm-up is a tenth of `--steps` too). A resume keeps the step, not the schedule:
the resumed run follows its own. With the same settings that is the checkpoint's curve; with
another `--steps` (or `--lr`, `--lr-warmup`, `--lr-decay`, `--min-lr`) the curve is reshaped,
and the learning rate can jump at the resumed step (a cosine of 50 steps resumed at step 40 as
one of 200 goes from near its floor back up near its peak). So a save records the schedule in
its marker (`schedule`), and on resume one warning line says how this run's differs from it:
what changed, and the learning rate of the first resumed step (and where the two differ most)
under each.

Files only: no torch, no process group.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from octopipe.errors import InputError


class LearningRates(Protocol):
    """What a schedule is to this module (`runtime.step.optim.OptimizerConfig`, a dataclass:
    `KEYS` are its fields), named here without importing the step's module."""

    lr: float
    warmup_steps: int
    decay: str
    min_lr: float
    total_steps: int

    def lr_at(self, step: int) -> float: ...


# The marker's `schedule` keys: every field the learning rate of a step depends on.
KEYS = ("lr", "warmup_steps", "decay", "min_lr", "total_steps")
# How each is set on the command line, for the warning.
_FLAGS = {
    "lr": "--lr",
    "warmup_steps": "warm-up steps",
    "decay": "--lr-decay",
    "min_lr": "--min-lr",
    "total_steps": "--steps",
}


def schedule_record(optimizer: LearningRates) -> dict[str, Any]:
    """What a checkpoint's marker records of the schedule it was trained on."""
    return {key: getattr(optimizer, key) for key in KEYS}


def as_optimizer(schedule: dict[str, Any], like: LearningRates) -> LearningRates:
    """`like` with the recorded schedule's fields: the checkpoint's learning-rate curve."""
    return replace(like, **{key: schedule[key] for key in KEYS})


def reshaped(
    schedule: dict[str, Any] | None, run: LearningRates, first_step: int, where: str
) -> str | None:
    """One line when resuming checkpoint `where` (trained on `schedule`, None: not recorded)
    at step index `first_step` under `run`'s schedule changes the learning rate of a step
    still to run; None when the curve continues unchanged or nothing was recorded."""
    if schedule is None:
        return None
    saved = as_optimizer(schedule, run)
    widest = _widest_gap(saved, run, first_step)
    if widest is None:
        return None
    changes = ", ".join(
        f"{_FLAGS[key]} {_shown(schedule[key])} -> {_shown(getattr(run, key))}"
        for key in KEYS
        if schedule[key] != getattr(run, key)
    )
    line = (
        f"{where} was trained on another learning-rate schedule ({changes}); resumed, the run "
        f"follows its own: {_at(saved, run, first_step)}"
    )
    if widest != first_step:
        line += f"; the widest gap: {_at(saved, run, widest)}"
    return line


def _at(saved: LearningRates, run: LearningRates, k: int) -> str:
    """Step index `k`'s learning rate under both, the step numbered from 1 as step lines are."""
    return (
        f"step {k + 1} at lr {run.lr_at(k):.3g} (the checkpoint's schedule: {saved.lr_at(k):.3g})"
    )


def _widest_gap(saved: LearningRates, run: LearningRates, first: int) -> int | None:
    """The step index from `first` to the run's last where the two learning rates differ the
    most, relative to the larger; None where they never differ by more than 0.1%."""
    # Each curve is a warm-up line, then a constant or a cosine that ends at its floor: they
    # part and meet where a piece ends, so those steps are looked at, and a few spread over
    # the rest for the middle of two cosines (a run of 10^9 steps is not walked through).
    ends = (saved.warmup_steps, run.warmup_steps, saved.total_steps, run.total_steps - 1)
    spread = range(first, run.total_steps, max(1, (run.total_steps - first) // 64))
    candidates = {first, *spread, *(e + d for e in ends for d in (-1, 0, 1))}
    best, widest = _TOLERANCE, None
    for k in sorted(k for k in candidates if first <= k < run.total_steps):
        a, b = saved.lr_at(k), run.lr_at(k)
        gap = abs(a - b) / max(abs(a), abs(b)) if a != b else 0.0
        if gap > best:
            best, widest = gap, k
    return widest


_TOLERANCE = 1e-3  # a relative gap below this is no change worth a warning


def _shown(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def resumed_schedule(root: str | None, run: LearningRates, first_step: int) -> str | None:
    """After a rank resumed `first_step` steps from checkpoint folder `root`'s `step-K`: the
    warning `reshaped` gives for the run's schedule `run`, or None. The marker was read
    strictly before the load; one that no longer reads (changed since) leaves the run to go on
    without the comparison."""
    from octopipe.runtime.checkpoint.folder import read_marker

    if not first_step or root is None:
        return None
    folder = Path(root) / f"step-{first_step}"
    try:
        schedule = read_marker(folder).schedule
    except InputError:
        return None
    recorded = None if schedule is None else schedule.model_dump()
    return reshaped(recorded, run, first_step, str(folder))
