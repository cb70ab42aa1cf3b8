"""What a schedule generator returns, and the stage-to-device maps the named schedules use.

A `ScheduleSpec` says where each stage runs and in which order each device runs its compute
actions; it knows nothing of layers (that is `partition.py`) nor of time (that is `sim/`).
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


def looped_placement(num_devices: int, chunks: int) -> tuple[int, ...]:
    """Stage s on device s mod P: chunk c of device d is stage c*P + d (Megatron, torch 'loop')."""
    return tuple(s % num_devices for s in range(num_devices * chunks))


def v_placement(num_devices: int) -> tuple[int, ...]:
    """Two stages per device in a V: device d holds stages d and 2P-1-d (ZB-V, DualPipeV)."""
    P = num_devices
    return tuple(s if s < P else 2 * P - 1 - s for s in range(2 * P))
