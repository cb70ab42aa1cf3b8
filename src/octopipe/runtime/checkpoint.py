"""Checkpoints through `torch.distributed.checkpoint`, keyed by module FQN, so any plan and any
data-parallel degree can resume any checkpoint of the same model.

`DIR/step-N` holds, after step N (N steps done): every parameter as `model.<fqn>` and every
tensor of its optimizer state as `optim.<fqn>.<name>` (`exp_avg`, `momentum_buffer`, ...),
written by whichever ranks hold them (replicas write a tensor once: DCP deduplicates; a
tensor-parallel or FSDP2 parameter is a DTensor, each rank writing its shard under the same
full FQN, and any later layout reads the pieces it needs), and
`octopipe.json` last, by rank 0, once every rank has written: a folder without it is an
interrupted save and is ignored. The learning rate and the data are functions of the step, so
the step is all the rest a run needs to continue as if it had not stopped.
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
from torch.distributed.tensor import DTensor

from octopipe.errors import InputError

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
    """Refuse a checkpoint of another model: other layers, or parameters of other shapes."""
    marker = json.loads((path / MARKER).read_text())
    if marker.get("format") != FORMAT:
        raise InputError(str(path), f"not an OctoPipe checkpoint ({MARKER} format)")
    if list(marker.get("layers", [])) != list(layers):
        raise InputError(str(path), "a checkpoint of another model: its layers differ")
    saved = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    for name, p in model.named_parameters():
        meta = saved.get(f"model.{name}")
        if meta is None or tuple(meta.size) != tuple(p.shape):
            found = "missing" if meta is None else f"of shape {tuple(meta.size)}"
            raise InputError(
                str(path),
                f"a checkpoint of another model: {name} is {found}, not {tuple(p.shape)}",
            )


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
    """Load this rank's parameters and optimizer state; the checkpoint's step."""
    params = _named_parameters(modules)
    saved = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    state: dict[str, torch.Tensor] = {f"model.{k}": p.detach() for k, p in params.items()}
    local = _local(optimizer)
    mine = {id(p) for group in local.param_groups for p in group["params"]} if local else set()
    wanted: dict[str, tuple[torch.Tensor, str]] = {}  # checkpoint key -> (parameter, state name)
    for fqn, p in params.items():
        if id(p) not in mine:
            continue
        prefix = f"optim.{fqn}."
        for key, meta in saved.items():
            if key.startswith(prefix):
                state[key] = _load_target(p, meta)
                wanted[key] = (p, key[len(prefix) :])
    with torch.no_grad():
        dcp.load(state, checkpoint_id=str(path))
    for key, (p, name) in wanted.items():
        local.state[p][name] = state[key].to(p.device) if state[key].dim() else state[key]
    return json.loads((path / MARKER).read_text())["step"]


def _load_target(param: torch.Tensor, meta) -> torch.Tensor:
    """Where a saved optimizer tensor is read into: laid out as its parameter when it has the
    parameter's shape (a DTensor's state is sharded as it is), else whole."""
    if isinstance(param, DTensor) and tuple(meta.size) == tuple(param.shape):
        return torch.empty_like(param.detach(), dtype=meta.properties.dtype)
    return torch.empty(meta.size, dtype=meta.properties.dtype)


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
