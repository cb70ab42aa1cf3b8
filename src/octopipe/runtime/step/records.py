"""What a rank records of its steps and actions: plain data its launcher reads back (pickled)
without importing the step's machinery."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ActionRecord:
    """When one action ran, in seconds since the job's common start (a barrier)."""

    step: int
    action: str
    wait_start: float  # began waiting for its inputs
    start: float  # inputs ready, compute began
    end: float


@dataclass(frozen=True)
class StepRecord:
    """One rank's step: its losses, how long it took, its share of the gradient norm."""

    losses: tuple[float, ...]  # per microbatch, unscaled; empty but on the last stage
    duration: float  # from the step's start barrier to this rank's optimizer step end
    # This rank's share of the squared gradient norm before clipping (`optim.squared_norm`);
    # None where the step does not measure it (overlapped steps).
    grad_squares: float | None = None
