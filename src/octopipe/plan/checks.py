"""The plan's validation: a plan file (JSON, or a schedule CSV) read into a `Plan`, each field
checked as it is read, and the plan's structure checked (`check_structure`, also called on
plans built in memory); every fault is one `InputError` line naming the file and the place.

What a plan holds and how it is written is `data.py`; this module only reads and checks.
"""

from __future__ import annotations

import csv
import math
import re
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from octopipe.actions import Action, B, F, I, Kind, W, parse_entry
from octopipe.errors import InputError, OctoPipeWarning
from octopipe.jsonfile import read_json
from octopipe.limits import (
    MAX_DEVICES,
    MAX_LAYERS,
    MAX_MICRO_BATCH_SIZE,
    MAX_MICROBATCHES,
    MAX_PARALLEL_DEGREE,
    MAX_SEQ_LEN,
    MAX_STAGE_MICROBATCHES,
)
from octopipe.plan.data import PLAN_FORMAT, Plan, Stage, flatten_entries
from octopipe.plan.shape import (
    DEFAULT_RANK_ORDER,
    NO_RECOMPUTE,
    RANK_ORDERS,
    RECOMPUTE_KINDS,
    JobShape,
)

_BIT = {k: 1 << k.code for k in Kind}  # check_structure's bit set of kinds
_FULL, _SPLIT = _BIT[F] | _BIT[B], _BIT[F] | _BIT[I] | _BIT[W]


def plan_from_dict(data: Any, where: str = "<plan>", num_layers: int | None = None) -> Plan:
    """Parse a plan file's content; a fault raises an InputError naming its place. Given
    `num_layers`, the stages must cover exactly that many layers."""
    if not isinstance(data, dict):
        raise InputError(where, "expected a JSON object")
    fmt = data.get("format", PLAN_FORMAT)
    if fmt != PLAN_FORMAT:
        raise InputError(where, f"unknown format {fmt!r}, expected {PLAN_FORMAT!r}", "format")
    nd = _positive_int(data, "num_devices", where, maximum=MAX_DEVICES)
    nm = _positive_int(data, "num_microbatches", where, maximum=MAX_MICROBATCHES)
    raw_stages = data.get("stages")
    if not isinstance(raw_stages, list) or not raw_stages:
        raise InputError(where, "expected a non-empty list of stages", "stages")
    if len(raw_stages) * nm > MAX_STAGE_MICROBATCHES:
        raise InputError(
            where,
            f"{len(raw_stages):,} stages x {nm:,} microbatches; a plan holds at most "
            f"{MAX_STAGE_MICROBATCHES:,} (stage, microbatch) pairs",
            "stages",
        )
    stages, recompute = [], []
    for i, st in enumerate(raw_stages):
        place = f"stages[{i}]"
        if not isinstance(st, dict):
            raise InputError(where, "expected an object with 'layers' and 'device'", place)
        rng, dev = st.get("layers"), st.get("device")
        if not (
            isinstance(rng, list)
            and len(rng) == 2
            and all(_is_int(x) and 0 <= x <= MAX_LAYERS for x in rng)
        ):
            raise InputError(
                where, f"expected [start, end) as two integers, got {rng!r}", place + ".layers"
            )
        if not _is_int(dev):
            raise InputError(where, f"expected a device index, got {dev!r}", place + ".device")
        kind = st.get("recompute", NO_RECOMPUTE)
        if not isinstance(kind, str) or kind not in RECOMPUTE_KINDS:
            kinds = ", ".join(RECOMPUTE_KINDS)
            raise InputError(where, f"expected one of {kinds}, got {kind!r}", place + ".recompute")
        stages.append(Stage(rng[0], rng[1], dev))
        recompute.append(kind)
    raw_sched = data.get("schedule")
    if not isinstance(raw_sched, dict):
        raise InputError(where, "expected an object mapping device to its action list", "schedule")
    entries: dict[int, list[tuple[Action, ...]]] = {}
    for key, acts in raw_sched.items():
        if not (isinstance(key, str) and re.fullmatch(r"[0-9]+", key)):
            raise InputError(where, f"device key must be a device index, got {key!r}", "schedule")
        if int(key) in entries:
            raise InputError(where, f"device {int(key)} is listed twice", f"schedule.{key}")
        if not isinstance(acts, list):
            raise InputError(where, "expected a list of actions", f"schedule.{key}")
        parsed = []
        for j, text in enumerate(acts):
            try:
                parsed.append(parse_entry(str(text)))
            except ValueError as exc:
                raise InputError(where, str(exc), f"schedule.{key}[{j}]") from None
        entries[int(key)] = parsed
    schedule, composites = flatten_entries(entries)
    predicted = _predicted(data.get("predicted"), where)
    parallelism = _parallelism(data.get("parallelism"), nd, where)
    shape = None if parallelism is None else JobShape.from_json(parallelism, nm)
    names = _layer_names(data.get("layer_names"), stages[-1].end, where)
    made_for = _made_for(data.get("profile"), nd, where)
    plan = Plan(
        nd,
        nm,
        tuple(stages),
        schedule,
        predicted,
        composites,
        shape,
        names,
        made_for,
        tuple(recompute),
    )
    check_structure(plan, where, num_layers)
    return plan


def check_layer_names(
    names: Sequence[str] | None, expected: Sequence[str], where: str, of: str = "the profile"
) -> None:
    """A plan made for other layers must not be used: its `layer_names`, where it lists them,
    are `expected` in order (absent, only the count was checked)."""
    if names is None or list(names) == list(expected):
        return
    for i, (a, b) in enumerate(zip(names, expected)):
        if a != b:
            raise InputError(where, f"layer {i} is {a!r} in the plan but {b!r} in {of}")
    raise InputError(where, f"the plan has {len(names)} layers, {of} {len(expected)}")


def warn_if_made_for_another(plan: Plan, profile, where: str, of: str) -> None:
    """A plan made from a profile of another microbatch size or sequence length still runs
    on this one, but its figures are then this profile's: said as a warning."""
    for key, what in (("microbatch_size", "microbatch size"), ("seq_len", "sequence length")):
        planned, costed = plan.made_for_value(key), getattr(profile, key)
        if planned is not None and costed is not None and planned != costed:
            warnings.warn(
                f"{where} was made for a {what} of {planned}; {of} costs {costed}",
                OctoPipeWarning,
                stacklevel=2,
            )


def _layer_names(raw: Any, num_layers: int, where: str) -> tuple[str, ...] | None:
    if raw is None:
        return None
    if not (isinstance(raw, list) and all(isinstance(n, str) for n in raw)):
        raise InputError(where, "expected a list of layer names", "layer_names")
    if len(raw) != num_layers:
        raise InputError(
            where, f"{len(raw)} names for the stages' {num_layers} layers", "layer_names"
        )
    return tuple(raw)


_MADE_FOR = (
    ("microbatch_size", MAX_MICRO_BATCH_SIZE),
    ("seq_len", MAX_SEQ_LEN),
    ("devices", MAX_DEVICES),
)


_MAX_NAME = 4096  # characters of a name in the profile key, as limits.Text


def _made_for(raw: Any, num_devices: int, where: str) -> dict[str, Any] | None:
    """The optional `profile` object: `name` and `device` strings, positive
    `microbatch_size`, `seq_len` and `devices` (the plan's device count) and the `precision`,
    each optional; other keys ignored."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise InputError(where, "expected an object of the profile's figures", "profile")
    out: dict[str, Any] = {}
    for key in ("name", "device"):
        text = raw.get(key)
        if text is not None:
            if not isinstance(text, str) or len(text) > _MAX_NAME:
                raise InputError(where, f"expected a string, got {text!r}", f"profile.{key}")
            out[key] = text
    for key, maximum in _MADE_FOR:
        if key in raw:
            out[key] = _positive_int(raw, key, where, "profile.", maximum)
    precision = raw.get("precision")
    if precision is not None:
        from octopipe.costmodel.precision import PRECISIONS

        if precision not in PRECISIONS:
            raise InputError(
                where,
                f"expected one of {', '.join(PRECISIONS)}, got {precision!r}",
                "profile.precision",
            )
        out["precision"] = precision
    if out.get("devices", num_devices) != num_devices:
        raise InputError(
            where,
            f"the plan's profile lists {out['devices']} devices but the plan has {num_devices}",
            "profile.devices",
        )
    return out


def _predicted(raw: Any, where: str) -> dict[str, Any] | None:
    """The optional `predicted` figures, kept as written; the one a run reports
    (`iteration_time`) must be a finite number >= 0 when given."""
    if not isinstance(raw, dict):
        return None
    time = raw.get("iteration_time")
    if time is not None and not (
        isinstance(time, int | float) and not isinstance(time, bool) and 0 <= time < math.inf
    ):
        raise InputError(
            where, f"expected a number of seconds, got {time!r}", "predicted.iteration_time"
        )
    return raw


PARALLELISM_KEYS = ("tp", "pp", "dp", "microbatch_size")
MAX_ZERO_STAGE = 3  # ZeRO-1 to -3; what the optimizer state sharding of the memory figures is
ZERO_STAGES = (0, 1, 3)  # what `run --zero` runs (FSDP2 for 3); a plan of ZeRO-2 is refused


def _parallelism(raw: Any, num_devices: int, where: str) -> dict[str, Any] | None:
    """The optional `parallelism` object: positive `tp`, `pp`, `dp`, `microbatch_size`, with
    `pp` the plan's device count; optional: a ZeRO stage `zero` (0, 1 or 3), the degrees `cp`,
    `ep` (default 1) and `etp`, HSDP's `shard_group`, `recompute` (default none) and
    `rank_order` (default octopipe)."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise InputError(where, "expected an object of tp, pp, dp, microbatch_size", "parallelism")
    out = {
        key: _positive_int(raw, key, where, "parallelism.", MAX_PARALLEL_DEGREE)
        for key in PARALLELISM_KEYS
    }
    zero = raw.get("zero", 0)
    if not (_is_int(zero) and zero in ZERO_STAGES):
        raise InputError(
            where,
            f"expected 0, 1 or 3 (ZeRO-2 is neither planned nor run), got {zero!r}",
            "parallelism.zero",
        )
    if zero:
        out["zero"] = zero
    for key in ("cp", "ep"):  # optional degrees, 1 when absent
        if key in raw and _positive_int(raw, key, where, "parallelism.", MAX_PARALLEL_DEGREE) != 1:
            out[key] = raw[key]
    if "shard_group" in raw:
        out["shard_group"] = _shard_group(raw, out, zero, where)
    recompute = raw.get("recompute", "none")
    if not isinstance(recompute, str) or recompute not in RECOMPUTE_KINDS:
        kinds = ", ".join(RECOMPUTE_KINDS)
        raise InputError(
            where, f"expected one of {kinds}, got {recompute!r}", "parallelism.recompute"
        )
    if recompute != "none":
        out["recompute"] = recompute
    order = raw.get("rank_order", DEFAULT_RANK_ORDER)
    if not isinstance(order, str) or order not in RANK_ORDERS:
        orders = ", ".join(RANK_ORDERS)
        raise InputError(
            where, f"expected one of {orders}, got {order!r}", "parallelism.rank_order"
        )
    if order != DEFAULT_RANK_ORDER:
        out["rank_order"] = order
    if "etp" in raw:
        out["etp"] = _positive_int(raw, "etp", where, "parallelism.", MAX_PARALLEL_DEGREE)
    if out["pp"] != num_devices:
        raise InputError(
            where, f"pp is {out['pp']} but the plan has {num_devices} devices", "parallelism.pp"
        )
    return out


def _shard_group(raw: dict, out: dict, zero: int, where: str) -> int:
    """HSDP's optional `shard_group`: ZeRO-3 over groups of S of the DP x CP ranks, S a
    divisor of them and a multiple of CP."""
    group = _positive_int(raw, "shard_group", where, "parallelism.", MAX_PARALLEL_DEGREE)
    cp, ranks = out.get("cp", 1), out["dp"] * out.get("cp", 1)
    if zero != 3:
        raise InputError(where, "shards weights: needs zero 3", "parallelism.shard_group")
    if ranks % group or group % cp:
        raise InputError(
            where,
            f"{group} is not a multiple of CP {cp} dividing DP x CP = {ranks}",
            "parallelism.shard_group",
        )
    return group


def check_structure(
    plan: Plan, where: str = "<plan>", num_layers: int | None = None, layers_of: str = "the profile"
) -> None:
    """Check the plan's own consistency (and, given `num_layers`, its fit to a profile, or to
    whatever `layers_of` names in the message).

    Stages tile the layers in order; devices are in range; every (stage, microbatch) has one F
    and either one B or one I and one W, on the stage's device. Dependency order is not checked
    here: the simulator reports a cyclic order as a deadlock.
    """
    nd, nm = plan.num_devices, plan.num_microbatches
    expect = 0
    for i, s in enumerate(plan.stages):
        if s.start != expect:
            raise InputError(
                where,
                f"starts at layer {s.start}, expected {expect} (stages tile the layers in order)",
                f"stages[{i}].layers",
            )
        if s.end <= s.start:
            raise InputError(
                where, f"empty layer range [{s.start}, {s.end})", f"stages[{i}].layers"
            )
        if not 0 <= s.device < nd:
            raise InputError(
                where, f"device {s.device} out of range 0..{nd - 1}", f"stages[{i}].device"
            )
        expect = s.end
    if num_layers is not None and expect != num_layers:
        raise InputError(
            where, f"stages cover {expect} layers but {layers_of} has {num_layers}", "stages"
        )
    for d in plan.schedule:
        if not 0 <= d < nd:
            raise InputError(where, f"device {d} out of range 0..{nd - 1}", f"schedule.{d}")
    S = plan.num_stages
    device_of = plan.placement
    held = [0] * (S * nm)  # per (stage, mb): bit set of the kinds scheduled
    for d, acts in plan.schedule.items():
        for j, (s, k, m) in enumerate(acts):
            if not (0 <= s < S and device_of[s] == d and 0 <= m < nm) or held[s * nm + m] & (
                1 << k.code
            ):
                raise InputError(
                    where, _action_fault(plan, d, Action(s, k, m)), f"schedule.{d}[{j}]"
                )
            held[s * nm + m] |= 1 << k.code
    for i, bits in enumerate(held):
        if bits != _FULL and bits != _SPLIT:
            s, m = divmod(i, nm)
            if not bits & _BIT[F]:
                problem = f"{s}F{m} is missing"
            elif bits & _BIT[B]:
                problem = f"stage {s} microbatch {m} has both B and I/W"
            else:
                problem = f"stage {s} microbatch {m} needs B, or I and W"
            raise InputError(where, problem, "schedule")


def _action_fault(plan: Plan, device: int, a: Action) -> str:
    if not 0 <= a.stage < plan.num_stages:
        return f"action {a}: stage {a.stage} does not exist"
    if plan.stages[a.stage].device != device:
        return f"action {a}: stage {a.stage} is placed on device {plan.stages[a.stage].device}"
    if not 0 <= a.mb < plan.num_microbatches:
        return f"action {a}: microbatch {a.mb} out of range 0..{plan.num_microbatches - 1}"
    return f"action {a} appears twice"


def load_plan(path: str | Path, num_layers: int | None = None) -> Plan:
    return plan_from_dict(read_json(path), str(path), num_layers)


def load_schedule_csv(path: str | Path) -> dict[int, tuple[Action, ...]]:
    """Per rank, its actions in order (a composite entry as its parts)."""
    return flatten_entries(load_schedule_entries(path))[0]


def load_schedule_entries(path: str | Path) -> dict[int, list[tuple[Action, ...]]]:
    """Per rank, its schedule entries as written: one action each, or a composite's parts."""
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    out = {}
    for rank, row in enumerate(rows):
        try:
            out[rank] = [parse_entry(x) for x in row if x.strip()]
        except ValueError as exc:
            raise InputError(str(path), str(exc), f"row {rank}") from None
    return out


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _positive_int(
    data: dict, key: str, where: str, prefix: str = "", maximum: int | None = None
) -> int:
    v = data.get(key)
    if not _is_int(v) or v < 1:
        raise InputError(where, f"expected a positive integer, got {v!r}", prefix + key)
    if maximum is not None and v > maximum:
        raise InputError(where, f"{v:,} is more than the {maximum:,} allowed", prefix + key)
    return v
