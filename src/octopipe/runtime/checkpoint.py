"""Checkpoints through `torch.distributed.checkpoint`, keyed by module FQN, so any plan and any
data-parallel degree can resume any checkpoint of the same model.

`DIR/step-N` holds, after step N (N steps done): every parameter as `model.<fqn>` and every
tensor of its optimizer state as `optim.<fqn>.<name>` (`exp_avg`, `momentum_buffer`, ...),
written by whichever ranks hold them (replicas write a tensor once: DCP deduplicates), and
`octopipe.json` last, by rank 0, once every rank has written: a folder without it is an
interrupted save and is ignored. The learning rate and the data are functions of the step, so
the step is all the rest a run needs to continue as if it had not stopped.

Every read of a checkpoint's index goes through `checkpoint_metadata.read_metadata`, which runs
nothing the file names, and only tensor entries are loaded: opening a checkpoint never runs code.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn

from octopipe.errors import InputError
from octopipe.runtime.checkpoint_metadata import (
    CheckedReader,
    TensorsOnlyPlanner,
    read_metadata,
    require_tensors,
)

FORMAT = "octopipe.checkpoint/1"
MARKER = "octopipe.json"
_STEP_DIR = re.compile(r"step-(\d+)")


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"step-{step}"


def latest(root: str | Path) -> tuple[Path, int] | None:
    """The newest complete checkpoint in `root` and its step, or None."""
    found = []
    for child in Path(root).glob("step-*"):
        match = _STEP_DIR.fullmatch(child.name)
        if match and (child / MARKER).is_file():
            found.append((int(match.group(1)), child))
    if not found:
        return None
    step, path = max(found)
    return path, step


def check_compatible(path: Path, layers: Iterable[str], model: nn.Module) -> None:
    """Refuse a checkpoint of another model (other layers, parameters of other shapes), and one
    whose loading would run code or allocate what no parameter needs."""
    marker = json.loads((path / MARKER).read_text())
    if marker.get("format") != FORMAT:
        raise InputError(str(path), f"not an OctoPipe checkpoint ({MARKER} format)")
    if list(marker.get("layers", [])) != list(layers):
        raise InputError(str(path), "a checkpoint of another model: its layers differ")
    saved = read_metadata(path)
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    _loaded_entries(saved, shapes, path)
    for name, shape in shapes.items():
        meta = saved.state_dict_metadata.get(f"model.{name}")
        if meta is None or tuple(meta.size) != shape:
            found = "missing" if meta is None else f"of shape {tuple(meta.size)}"
            raise InputError(
                str(path), f"a checkpoint of another model: {name} is {found}, not {shape}"
            )


def _loaded_entries(
    saved, shapes: Mapping[str, tuple[int, ...]], path: Path
) -> dict[str, tuple[str, str]]:
    """The optimizer-state keys a rank holding parameters `shapes` (FQN -> shape) loads, as
    key -> (FQN, state name). These and the parameters' own keys must be tensors (not pickled
    bytes), and a state tensor is the shape of its parameter or a scalar (a step count)."""
    entries = saved.state_dict_metadata
    wanted: dict[str, tuple[str, str]] = {}
    for fqn in shapes:
        prefix = f"optim.{fqn}."
        wanted.update({k: (fqn, k[len(prefix) :]) for k in entries if k.startswith(prefix)})
    require_tensors(saved, [*(f"model.{fqn}" for fqn in shapes), *wanted], path)
    for key, (fqn, _) in wanted.items():
        size = tuple(entries[key].size)
        if size not in (shapes[fqn], ()):
            raise InputError(
                str(path), f"{key} is of shape {size}; its parameter's is {shapes[fqn]}"
            )
    return wanted


def save(
    root: str | Path,
    step: int,
    modules: Mapping[int, nn.Module],
    optimizer: torch.optim.Optimizer | None,
    about: dict,
) -> Path:
    """Collective: every rank calls it after the same step."""
    path = step_dir(root, step)
    state = {f"model.{k}": v.detach() for k, v in _named_parameters(modules).items()}
    state.update(_optimizer_tensors(modules, optimizer))
    dcp.save(state, checkpoint_id=str(path))
    dist.barrier()
    if dist.get_rank() == 0:
        temporary = path / f"{MARKER}.tmp"
        temporary.write_text(json.dumps({"format": FORMAT, "step": step, **about}, indent=1))
        os.replace(temporary, path / MARKER)
    dist.barrier()
    return path


def load(
    path: Path, modules: Mapping[int, nn.Module], optimizer: torch.optim.Optimizer | None
) -> int:
    """Load this rank's parameters and optimizer state; the checkpoint's step. The index is
    read (and checked) once, here, and handed to DCP as it was checked."""
    params = _named_parameters(modules)
    saved = read_metadata(path)
    state: dict[str, torch.Tensor] = {f"model.{k}": p.detach() for k, p in params.items()}
    local = _local(optimizer)
    mine = {id(p) for group in local.param_groups for p in group["params"]} if local else set()
    shapes = {fqn: tuple(p.shape) for fqn, p in params.items() if id(p) in mine}
    wanted = _loaded_entries(saved, shapes, path)
    require_tensors(saved, state, path)  # every parameter's, held by this rank's optimizer or not
    for key in wanted:
        meta = saved.state_dict_metadata[key]
        state[key] = torch.empty(meta.size, dtype=meta.properties.dtype)
    with torch.no_grad():
        dcp.load(state, storage_reader=CheckedReader(path, saved), planner=TensorsOnlyPlanner())
    for key, (fqn, name) in wanted.items():
        p = params[fqn]
        local.state[p][name] = state[key].to(p.device) if state[key].dim() else state[key]
    return json.loads((path / MARKER).read_text())["step"]


def _named_parameters(modules: Mapping[int, nn.Module]) -> dict[str, nn.Parameter]:
    """The rank's parameters by FQN in the whole model (a stage module's `part` keeps them)."""
    return {k: p for m in modules.values() for k, p in m.part.named_parameters()}


def _local(optimizer: torch.optim.Optimizer | None) -> torch.optim.Optimizer | None:
    """The optimizer holding this rank's state: ZeRO's local shard, or the optimizer itself."""
    return getattr(optimizer, "optim", optimizer)


def _optimizer_tensors(
    modules: Mapping[int, nn.Module], optimizer: torch.optim.Optimizer | None
) -> dict[str, torch.Tensor]:
    local = _local(optimizer)
    if local is None:
        return {}
    fqn_of = {id(p): k for k, p in _named_parameters(modules).items()}
    return {
        f"optim.{fqn_of[id(p)]}.{name}": value
        for p, values in local.state.items()
        for name, value in values.items()
        if isinstance(value, torch.Tensor)
    }
