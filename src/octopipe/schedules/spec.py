"""What a schedule generator returns.

A `ScheduleSpec` says where each stage runs (a map from `octopipe.placement`) and in which order
each device runs its compute actions; it knows nothing of layers (that is `partition.py`) nor of
time (that is `sim/`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from octopipe.actions import Action


@dataclass(frozen=True)
class ScheduleSpec:
    """A named schedule for a number of stages: placement and per-device compute orders."""

    name: str
    num_stages: int
    placement: tuple[int, ...]  # stage -> device
    orders: Mapping[int, tuple[Action, ...]]  # device -> its compute actions in order

    @property
    def num_devices(self) -> int:
        return len(self.orders)
