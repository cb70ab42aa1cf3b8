"""Plan (`octopipe.plan/1`): stages, placement and per-device schedule, written as JSON and CSV.

A plan says what runs where and in which order; it does not say how long anything takes
(that is `sim/`) nor how a plan is found (`schedules/`, `partition.py`, `tuner/`). Reading a
plan file and checking a plan is `checks.py`.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from operator import itemgetter
from pathlib import Path
from typing import Any, NamedTuple

from octopipe.actions import Action, B, F, I, Kind, W, format_entry
from octopipe.jsonfile import write_json
from octopipe.plan.shape import NO_RECOMPUTE, JobShape

PLAN_FORMAT = "octopipe.plan/1"


class Stage(NamedTuple):
    """Layers `[start, end)` of the profile, run on `device`."""

    start: int
    end: int
    device: int

    @property
    def num_layers(self) -> int:
        return self.end - self.start


Composites = frozenset[tuple[int, tuple[Action, ...]]]  # (device, the parts in order)


_ACTION_TYPE, _KIND_TYPE = {Action}, {Kind}
_KIND_OF = itemgetter(1)


def _normalized(acts: object) -> bool:
    """Whether a device's actions are a tuple of Actions of kind Kind. Checked with C-level
    maps, not a loop: every Plan built (and every copy of one) checks all its actions."""
    return (
        type(acts) is tuple
        and set(map(type, acts)) <= _ACTION_TYPE
        and set(map(type, map(_KIND_OF, acts))) <= _KIND_TYPE
    )


@dataclass(frozen=True)
class Plan:
    """What runs where, and in which order. `schedule` lists each device's actions, a
    composite entry of torch's (`(0F7;7B3)OVERLAP_F_B`) as its parts in order; `composites`
    remembers those entries by their parts, so the plan writes them back as it read them
    wherever the parts still stand together in that order (a reordered schedule keeps the
    composites it did not break up)."""

    num_devices: int
    num_microbatches: int
    stages: tuple[Stage, ...]
    schedule: Mapping[int, tuple[Action, ...]]  # device -> its compute actions in order
    predicted: Mapping[str, Any] | None = field(default=None, compare=False)
    composites: Composites = field(default=frozenset(), compare=False)
    # How the plan sits in the whole job (docs/FORMATS.md, `parallelism`): its degrees, PP
    # being num_devices, and M its num_microbatches. None: a pipeline on its own.
    shape: JobShape | None = field(default=None, compare=False)
    # The profile's layer names, in order (docs/FORMATS.md): the executor checks them against
    # the model's before it starts. None: not recorded (then only the count is checked).
    layer_names: tuple[str, ...] | None = field(default=None, compare=False)
    # What the plan's costs were for (docs/FORMATS.md, `profile`): the profile's name,
    # microbatch size, sequence length and device count, those it knew. None: not recorded.
    profile: Mapping[str, Any] | None = field(default=None, compare=False)
    # Per stage, what it recomputes in its backward: "none", "selective" or "full"
    # (docs/FORMATS.md). Empty: no stage recomputes anything.
    recompute: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if all(kind == NO_RECOMPUTE for kind in self.recompute):
            object.__setattr__(self, "recompute", ())
        elif len(self.recompute) != len(self.stages):
            raise ValueError(f"{len(self.recompute)} recompute kinds for {len(self.stages)} stages")
        # Tuples of Actions with one kind type (Kind), whatever the caller built them with.
        if not all(_normalized(acts) for acts in self.schedule.values()):
            normalized = {
                d: tuple(Action(int(s), Kind(k), int(m)) for s, k, m in acts)
                for d, acts in self.schedule.items()
            }
            object.__setattr__(self, "schedule", normalized)

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def placement(self) -> tuple[int, ...]:
        """Stage index -> device."""
        return tuple(s.device for s in self.stages)

    def recompute_of(self, stage: int) -> str:
        """What `stage` recomputes: "none", "selective" or "full"."""
        return self.recompute[stage] if self.recompute else NO_RECOMPUTE

    def stages_on(self, device: int) -> list[int]:
        return [i for i, s in enumerate(self.stages) if s.device == device]

    def with_predicted(self, predicted: Mapping[str, Any]) -> Plan:
        return replace(self, predicted=predicted)

    def with_shape(self, shape: JobShape | None = None, **degrees: Any) -> Plan:
        """The plan as one part of a job (docs/FORMATS.md, `parallelism`): `shape`, or the
        shape of these `degrees` (JobShape's fields) over the plan's devices and microbatches.
        The shape's PP is the plan's device count; its microbatch count becomes the plan's."""
        if shape is None:
            shape = JobShape(pp=self.num_devices, num_microbatches=self.num_microbatches, **degrees)
        elif degrees:
            raise TypeError("give a shape or its degrees, not both")
        if shape.pp != self.num_devices:
            raise ValueError(f"a shape of PP {shape.pp} for a plan of {self.num_devices} devices")
        if shape.num_microbatches != self.num_microbatches:
            shape = replace(shape, num_microbatches=self.num_microbatches)
        return replace(self, shape=shape)

    def with_layer_names(self, names: Sequence[str]) -> Plan:
        return replace(self, layer_names=tuple(names))

    def made_for(self, profile) -> Plan:
        """The plan with what its profile's costs are for recorded (`profile` key): the name,
        and the microbatch size, sequence length, device count and device kind the profile
        knows."""
        devices = profile.devices
        kinds = {d.name for d in devices or ()}
        known = {
            "name": profile.name,
            "microbatch_size": profile.microbatch_size,
            "seq_len": profile.seq_len,
            "devices": len(devices) if devices and len(devices) == self.num_devices else None,
            # the one kind of device the costs are for (h100, cpu, ...), where the profile says
            "device": kinds.pop() if len(kinds) == 1 and None not in kinds else None,
            # what the blocks' GEMMs were priced in, where not BF16: a run must train so
            "precision": profile.precision if profile.precision != "bf16" else None,
        }
        return replace(self, profile={k: v for k, v in known.items() if v is not None})

    def made_for_value(self, key: str) -> Any:
        """One figure of the `profile` key (`microbatch_size`, `seq_len`, `devices`), or None."""
        return (self.profile or {}).get(key)

    def entries(self, device: int) -> list[tuple[Action, ...]]:
        """The device's schedule entries: one action each, or a composite's parts."""
        acts = self.schedule.get(device, ())
        starting = {parts[0]: parts for d, parts in self.composites if d == device}
        out, pos = [], 0
        while pos < len(acts):
            parts = starting.get(acts[pos])
            if parts is None or tuple(acts[pos : pos + len(parts)]) != parts:
                parts = (acts[pos],)
            out.append(parts)
            pos += len(parts)
        return out

    # --- serialization -----------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "format": PLAN_FORMAT,
            "num_devices": self.num_devices,
            "num_microbatches": self.num_microbatches,
            "stages": [
                {"layers": [s.start, s.end], "device": s.device, **self._recompute_key(i)}
                for i, s in enumerate(self.stages)
            ],
        }
        data["schedule"] = {
            str(d): [format_entry(e) for e in self.entries(d)] for d in sorted(self.schedule)
        }
        if self.predicted is not None:
            data["predicted"] = dict(self.predicted)
        if self.shape is not None:
            data["parallelism"] = self.shape.to_json()
        if self.layer_names is not None:
            data["layer_names"] = list(self.layer_names)
        if self.profile is not None:
            data["profile"] = dict(self.profile)
        return data

    def _recompute_key(self, stage: int) -> dict[str, str]:
        """A stage's optional `recompute` key: written only where it recomputes something."""
        kind = self.recompute_of(stage)
        return {} if kind == NO_RECOMPUTE else {"recompute": kind}

    def csv_rows(self) -> list[list[str]]:
        """One row per device (rank), as `_PipelineScheduleRuntime._load_csv` reads them."""
        return [[format_entry(e) for e in self.entries(d)] for d in range(self.num_devices)]


def flatten_entries(
    rows: Mapping[int, Sequence[tuple[Action, ...]]],
) -> tuple[dict[int, tuple[Action, ...]], Composites]:
    """Per-device entries -> the flat schedule and where its composites stood."""
    schedule, composites = {}, set()
    for d, entries in rows.items():
        flat: list[Action] = []
        for parts in entries:
            if len(parts) > 1:
                composites.add((d, tuple(parts)))
            flat.extend(parts)
        schedule[d] = tuple(flat)
    return schedule, frozenset(composites)


def split_backwards(plan: Plan) -> frozenset[tuple[int, int]]:
    """The (stage, microbatch) pairs whose backward is split into I and W."""
    return frozenset(
        (a.stage, a.mb) for acts in plan.schedule.values() for a in acts if a.kind == I
    )


def dependencies(
    plan: Plan, act: Action, split: frozenset[tuple[int, int]] | None = None
) -> Iterator[Action]:
    """The actions whose results `act` consumes (docs/FORMATS.md, default cost semantics).

    `split` is `split_backwards(plan)`; pass it when calling this in a loop. The simulator keeps
    its own integer-indexed lowering of these rules (sim/graph.py) for speed.
    """
    if split is None:
        split = split_backwards(plan)
    s, m = act.stage, act.mb
    if act.kind == F:
        if s > 0:
            yield Action(s - 1, F, m)
    elif act.kind in (B, I):
        yield Action(s, F, m)
        if s + 1 < plan.num_stages:
            yield Action(s + 1, I if (s + 1, m) in split else B, m)
    elif act.kind == W:
        yield Action(s, I, m)


def make_plan(
    num_devices: int,
    num_microbatches: int,
    ranges: Sequence[tuple[int, int]],
    placement: Sequence[int],
    orders: Mapping[int, Iterable[Action]],
    recompute: Sequence[str] = (),
) -> Plan:
    """Assemble a plan from layer ranges, a stage->device map and per-device orders (and,
    per stage, what it recomputes; empty: nothing)."""
    stages = tuple(Stage(a, b, d) for (a, b), d in zip(ranges, placement, strict=True))
    schedule = {d: tuple(orders.get(d, ())) for d in range(num_devices)}
    return Plan(num_devices, num_microbatches, stages, schedule, recompute=tuple(recompute))


def save_plan(plan: Plan, path: str | Path) -> None:
    write_json(path, plan.to_dict())


def save_schedule_csv(plan: Plan, path: str | Path) -> None:
    from octopipe.outfiles import replacing

    with replacing(path) as fh:
        csv.writer(fh).writerows(plan.csv_rows())
