"""Named pipeline schedules: per-device compute orders and the stage placement they assume.

    spec = generate("i1f1b", num_devices=4, num_microbatches=8)   # chunks default to 2
    spec.placement   # stage -> device
    spec.orders      # device -> tuple[Action]

Every schedule is written with one mechanism (`writer.OrderWriter`): the 1F1B family
(`one_f_one_b.py`: GPipe, 1F1B, interleaved 1F1B, ZB-H1, ZB-H2) differs only in a per-device
rule; the V-shaped ones (`v_shape.py`: ZB-V, DualPipeV) are phase scripts. Where
`torch.distributed.pipelining` has the same schedule the orders equal its compute orders
(tests/test_torch_parity.py). `list_scheduler.py` (the tuner's) is separate.
"""

from __future__ import annotations

from collections.abc import Callable

from octopipe import placement as maps
from octopipe.actions import Action
from octopipe.errors import InputError
from octopipe.limits import MAX_STAGE_MICROBATCHES
from octopipe.schedules import one_f_one_b as family
from octopipe.schedules.spec import ScheduleSpec
from octopipe.schedules.v_shape import dualpipev_order, zbv_order

__all__ = ["DEFAULT_CHUNKS", "SCHEDULES", "ScheduleSpec", "generate", "placement_of"]

SCHEDULES = ("gpipe", "1f1b", "i1f1b", "zbh1", "zbh2", "zbv", "dualpipev")

DEFAULT_CHUNKS = {
    "gpipe": 1,
    "1f1b": 1,
    "zbh1": 1,
    "zbh2": 1,
    "i1f1b": 2,
    "zbv": 2,
    "dualpipev": 2,
}

_FAMILY_RULES: dict[str, Callable[[int, int, int, int], family.DeviceRule]] = {
    "gpipe": family.gpipe_rule,
    "1f1b": family.one_f_one_b_rule,
    "i1f1b": family.interleaved_rule,
    "zbh1": family.zbh1_rule,
    "zbh2": family.zbh2_rule,
}
_V_ORDERS: dict[str, Callable[[int, int, int], tuple[Action, ...]]] = {
    "zbv": zbv_order,
    "dualpipev": dualpipev_order,
}
_ONE_CHUNK_ONLY = ("1f1b", "zbh2")
_INTERLEAVED_ROUNDS = ("i1f1b", "zbh1")  # chunks take turns in rounds of equal size


def generate(
    name: str, num_devices: int, num_microbatches: int, chunks: int | None = None
) -> ScheduleSpec:
    """The schedule `name` for P devices, M microbatches and V stages per device.

    An unsupported combination raises InputError naming the schedule and the reason.
    """
    V = DEFAULT_CHUNKS.get(name, 1) if chunks is None else chunks
    check_supported(name, num_devices, num_microbatches, V)
    P, M = num_devices, num_microbatches
    if name in _V_ORDERS:
        make = _V_ORDERS[name]
        orders = {d: make(d, P, M) for d in range(P)}
        return ScheduleSpec(name, 2 * P, maps.v_shape(range(P), 2), orders)
    rule = _FAMILY_RULES[name]
    orders = {d: family.family_order(d, P, V, M, rule(d, P, V, M)) for d in range(P)}
    return ScheduleSpec(name, P * V, maps.interleaved(range(P), V), orders)


def placement_of(
    name: str, num_devices: int, num_microbatches: int, chunks: int | None = None
) -> tuple[int, ...]:
    """The stage placement `generate` would give, without building the orders (InputError as
    it would raise)."""
    V = DEFAULT_CHUNKS.get(name, 1) if chunks is None else chunks
    check_supported(name, num_devices, num_microbatches, V)
    if name in _V_ORDERS:
        return tuple(maps.v_shape(range(num_devices), 2))
    return tuple(maps.interleaved(range(num_devices), V))


def check_supported(name: str, num_devices: int, num_microbatches: int, chunks: int) -> None:
    """Raise InputError when `name` cannot run with these counts."""
    if name not in SCHEDULES:
        known = ", ".join(SCHEDULES)
        raise InputError("schedule", f"unknown schedule {name!r}; choose one of {known}")
    counts = (("devices", num_devices), ("microbatches", num_microbatches), ("chunks", chunks))
    for what, value in counts:
        if value < 1:
            raise InputError(name, f"needs at least 1 of {what}, got {value}")
    P, M, V = num_devices, num_microbatches, chunks
    if P * V * M > MAX_STAGE_MICROBATCHES:  # before the orders are built
        raise InputError(
            name,
            f"{P * V:,} stages x {M:,} microbatches; a plan holds at most "
            f"{MAX_STAGE_MICROBATCHES:,} (stage, microbatch) pairs",
        )
    if name in _ONE_CHUNK_ONLY and V != 1:
        raise InputError(name, f"runs one stage per device (chunks 1), got chunks {V}")
    if name in _V_ORDERS and V != 2:
        raise InputError(name, f"runs exactly two stages per device (chunks 2), got chunks {V}")
    if name in _INTERLEAVED_ROUNDS and V > 1 and not family.rounds_fit(P, M):
        rounds = max(1, M // P)
        raise InputError(
            name,
            f"with {V} chunks needs the microbatches ({M}) to split into {rounds} equal rounds "
            f"(a multiple of {rounds}, e.g. a multiple of the {P} devices)",
        )
    if name == "dualpipev" and M < 2 * P:
        raise InputError(name, f"needs at least 2 x devices = {2 * P} microbatches, got {M}")
