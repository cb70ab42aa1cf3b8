"""Profile (`octopipe.profile/1`): per-layer costs, devices, links and data parallelism.

Load, validate, save.

This module only describes a model's costs; it does not compute them (see `costmodel/` and
`runtime/measure/profiler.py`) nor interpret them (see `sim/`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from octopipe.errors import InputError
from octopipe.jsonfile import read_json, write_json
from octopipe.limits import (
    MAX_DEVICES,
    MAX_LAYERS,
    Bandwidth,
    ByteCount,
    Capacity,
    Degree,
    Flag,
    Index,
    MicroBatchSize,
    Seconds,
    SeqLen,
    Speed,
    Text,
)

PROFILE_FORMAT = "octopipe.profile/1"


class _Frozen(BaseModel):
    # Readers ignore keys they do not know (docs/FORMATS.md: stable contracts).
    model_config = ConfigDict(frozen=True, extra="ignore")


RECOMPUTATIONS = ("selective", "full")  # what a stage may recompute besides nothing


class Recomputed(_Frozen):
    """A layer's costs when its stage recomputes it: the backward for the input redoes (part
    of) the forward first, and less is held from F. Under a split backward, `wact_bytes` may
    exceed `act_bytes`: the recomputed inputs of the weight gradients are held from I to W."""

    b: Seconds = Field(description="backward-for-input seconds, the redone forward included")
    act_bytes: ByteCount = Field(description="held from F until the backward")
    wact_bytes: ByteCount = Field(description="held after I until W")


class Recomputation(_Frozen):
    """The layer's costs under each kind of recomputation it offers (absent: not offered)."""

    full: Recomputed | None = Field(default=None, description="the whole forward redone")
    selective: Recomputed | None = Field(default=None, description="the attention core redone")

    def of(self, kind: str) -> Recomputed | None:
        return getattr(self, kind)


class LayerCost(_Frozen):
    """One layer's cost for one microbatch on a device of speed 1.0."""

    name: Text
    kind: Text = "layer"
    f: Seconds = Field(description="forward seconds")
    b: Seconds = Field(description="backward-for-input seconds")
    w: Seconds = Field(description="backward-for-weights seconds")
    act_bytes: ByteCount = Field(description="held from F until the backward")
    wact_bytes: ByteCount = Field(description="part of act_bytes still held after I until W")
    param_bytes: ByteCount = Field(description="static: weights, gradients, optimizer state")
    out_bytes: ByteCount = Field(description="output size: what crosses a stage boundary")
    grad_bytes: ByteCount = Field(default=0, description="gradients data parallelism reduces")
    wgrad_bytes: ByteCount = Field(
        default=0, description="output gradients W needs, held from I until W"
    )
    recompute: Recomputation | None = Field(
        default=None, description="its costs when its stage recomputes it, per kind"
    )

    @model_validator(mode="after")
    def _wact_within_act(self) -> LayerCost:
        if self.wact_bytes > self.act_bytes:
            raise ValueError(f"wact_bytes ({self.wact_bytes}) exceeds act_bytes ({self.act_bytes})")
        return self

    @property
    def work(self) -> float:
        return self.f + self.b + self.w


class Device(_Frozen):
    speed: Speed = Field(default=1.0, description="a device of speed s runs an op in t/s")
    memory_bytes: Capacity = Field(default=float("inf"), description="capacity to fit")
    node: Index = Field(default=0, description="the node (host) the device sits on")
    name: Text | None = Field(
        default=None, description="the accelerator's kind (a preset's name): for labels only"
    )


class Link(_Frozen):
    bandwidth: Bandwidth = Field(default=float("inf"), description="bytes per second")
    latency: Seconds = Field(default=0.0, description="seconds per transfer")

    def transfer_time(self, nbytes: float) -> float:
        return self.latency + nbytes / self.bandwidth


class Links(_Frozen):
    """Transfers inside a node and between nodes; replaces `link` when given."""

    intra_node: Link
    inter_node: Link


class DataParallel(_Frozen):
    """Replicas of the whole pipeline whose gradients are averaged by a ring all-reduce (or,
    with `sharded`, reduce-scattered to the optimizer's shards), per stage or per bucket."""

    degree: Degree = Field(default=1, description="pipeline replicas")
    bandwidth: Bandwidth = Field(default=float("inf"), description="bytes per second")
    latency: Seconds = Field(default=0.0, description="seconds per ring step")
    bucket_bytes: Annotated[ByteCount, Field(ge=1)] | None = Field(
        default=None,
        description="reduce in buckets of this many gradient bytes as the backward fills them",
    )
    sharded: Flag = Field(
        default=False, description="reduce-scatter to a sharded optimizer (ZeRO-1) instead"
    )
    at_end: Flag = Field(
        default=False,
        description="a device starts its reductions only after its last action of the step",
    )

    def allreduce_time(self, nbytes: float) -> float:
        """Ring all-reduce of `nbytes`: 2 (D-1) L + 2 (D-1)/D * G / B (0 for one replica);
        sharded, a ring reduce-scatter: half of that."""
        D = self.degree
        if D == 1 or nbytes == 0:
            return 0.0
        ring = 2 * (D - 1) * self.latency + 2 * (D - 1) / D * nbytes / self.bandwidth
        return ring / 2 if self.sharded else ring

    def allgather_time(self, nbytes: float) -> float:
        """Ring all-gather of `nbytes` in all (a sharded optimizer's updated weights):
        (D-1) L + (D-1)/D * G / B."""
        D = self.degree
        if D == 1 or nbytes == 0:
            return 0.0
        return (D - 1) * self.latency + (D - 1) / D * nbytes / self.bandwidth


class Profile(_Frozen):
    name: Text = "profile"
    layers: tuple[LayerCost, ...]
    devices: tuple[Device, ...] | None = None
    link: Link = Link()
    links: Links | None = None
    data_parallel: DataParallel = DataParallel()
    microbatch_size: MicroBatchSize | None = Field(
        default=None, description="samples in the microbatch the costs are for"
    )
    seq_len: SeqLen | None = Field(default=None, description="tokens per sample the costs are for")
    tensor_parallel: Degree = Field(
        default=1, description="GPUs per pipeline device (one tensor-parallel group)"
    )
    blocking_transfers: Flag = Field(
        default=False,
        description="a stage's transfer to its neighbour occupies the sender until it is done",
    )
    precision: Literal["bf16", "fp8", "mxfp8"] = Field(
        default="bf16", description="what the blocks' GEMMs run in (docs/COSTMODEL.md)"
    )
    fp8_scaling: Literal["delayed", "current"] = Field(
        default="delayed", description="FP8's per-tensor scaling, where precision is fp8"
    )

    @field_validator("layers")
    @classmethod
    def _layers(cls, layers: tuple[LayerCost, ...]) -> tuple[LayerCost, ...]:
        if not layers:
            raise ValueError("the layer list is empty")
        if len(layers) > MAX_LAYERS:
            raise ValueError(f"{len(layers):,} layers; at most {MAX_LAYERS:,} are planned")
        return layers

    @field_validator("devices")
    @classmethod
    def _devices(cls, devices: tuple[Device, ...] | None) -> tuple[Device, ...] | None:
        if devices is not None and not 1 <= len(devices) <= MAX_DEVICES:
            raise ValueError(f"{len(devices):,} devices; expected 1 to {MAX_DEVICES:,}")
        return devices

    @property
    def layer_names(self) -> tuple[str, ...]:
        return tuple(layer.name for layer in self.layers)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def device_list(self, num_devices: int | None = None) -> tuple[Device, ...]:
        """The devices a plan runs on: the profile's own, or `num_devices` default ones."""
        if num_devices is None:
            if self.devices is None:
                raise InputError(self.name, "the profile lists no devices: give a device count")
            return self.devices
        if not 1 <= num_devices <= MAX_DEVICES:
            raise InputError(
                self.name, f"device count must be 1 to {MAX_DEVICES:,}, got {num_devices:,}"
            )
        if self.devices is None:
            return tuple(Device() for _ in range(num_devices))
        if len(self.devices) != num_devices:
            raise InputError(
                self.name,
                f"asked for {num_devices} devices but the profile lists {len(self.devices)}",
                "devices",
            )
        return self.devices

    def link_between(self, a: Device, b: Device) -> Link:
        """The link a transfer from device `a` to device `b` takes (docs/FORMATS.md)."""
        if self.links is None:
            return self.link
        return self.links.intra_node if a.node == b.node else self.links.inter_node

    def with_devices(self, devices: list[Device] | tuple[Device, ...]) -> Profile:
        return self.model_copy(update={"devices": tuple(devices)})

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"format": PROFILE_FORMAT, "name": self.name}
        data["layers"] = [
            _given(layer.model_dump(exclude_none=True), grad_bytes=0) for layer in self.layers
        ]
        if self.devices is not None:
            data["devices"] = [
                _given(_finite(d.model_dump()), node=0, name=None) for d in self.devices
            ]
        data["link"] = _finite(self.link.model_dump())
        if self.links is not None:
            data["links"] = {k: _finite(v) for k, v in self.links.model_dump().items()}
        if self.data_parallel != DataParallel():
            dp = _given(
                self.data_parallel.model_dump(), bucket_bytes=None, sharded=False, at_end=False
            )
            data["data_parallel"] = _finite(dp)
        if self.microbatch_size is not None:
            data["microbatch_size"] = self.microbatch_size
        if self.seq_len is not None:
            data["seq_len"] = self.seq_len
        if self.tensor_parallel != 1:
            data["tensor_parallel"] = self.tensor_parallel
        if self.blocking_transfers:
            data["blocking_transfers"] = True
        if self.precision != "bf16":
            data["precision"] = self.precision
            if self.precision == "fp8":
                data["fp8_scaling"] = self.fp8_scaling
        return data


def _given(values: dict[str, Any], **defaults: Any) -> dict[str, Any]:
    """Optional keys are written only where they differ from their default, so a profile that
    does not use them is written as it was before they existed."""
    return {k: v for k, v in values.items() if k not in defaults or v != defaults[k]}


def _finite(values: dict[str, Any]) -> dict[str, Any]:
    """JSON has no infinity: an unlimited capacity or bandwidth is written by omission."""
    return {k: v for k, v in values.items() if v != float("inf")}


def location(loc: tuple[int | str, ...]) -> str:
    """('layers', 12, 'f') -> 'layers[12].f'."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def first_error(err: ValidationError) -> tuple[str, str]:
    """The place and message of a pydantic error's first fault, for a one-line report."""
    e = err.errors()[0]
    msg = e["msg"].removeprefix("Value error, ")
    if e["type"] == "missing":
        msg = "missing field"
    elif "input" in e and e["type"] not in ("model_type",) and not isinstance(e["input"], dict):
        msg = f"{msg} (got {e['input']!r})"
    return location(tuple(e["loc"])), msg


def profile_from_dict(data: Any, where: str = "<profile>") -> Profile:
    if not isinstance(data, dict):
        raise InputError(where, "expected a JSON object")
    fmt = data.get("format", PROFILE_FORMAT)
    if fmt != PROFILE_FORMAT:
        raise InputError(where, f"unknown format {fmt!r}, expected {PROFILE_FORMAT!r}", "format")
    try:
        profile = Profile.model_validate(data)
    except ValidationError as exc:
        place, msg = first_error(exc)
        raise InputError(where, msg, place) from None
    _check_unique_names(profile, where)
    if not any(layer.f or layer.b or layer.w for layer in profile.layers):
        raise InputError(
            where,
            "every layer's f, b and w is 0: nothing to plan or simulate (a profile of times)",
            "layers",
        )
    return profile


def _check_unique_names(profile: Profile, where: str) -> None:
    """A file's layer names say which module of the model each layer is: one name, one layer.
    (Profiles built in code, e.g. uniform test stacks, may repeat a name.)"""
    names = profile.layer_names
    if len(set(names)) == len(names):
        return
    seen: dict[str, int] = {}
    for i, name in enumerate(names):
        first = seen.setdefault(name, i)
        if first != i:
            raise InputError(
                where, f"{name!r} is also the name of layers[{first}]", f"layers[{i}].name"
            )


def load_profile(path: str | Path) -> Profile:
    return profile_from_dict(read_json(path), str(path))


def save_profile(profile: Profile, path: str | Path) -> None:
    write_json(path, profile.to_dict())
