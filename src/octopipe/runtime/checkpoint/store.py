"""Checkpoints through `torch.distributed.checkpoint`, keyed by module FQN, so any plan and any
data-parallel degree can resume any checkpoint of the same model.

`DIR/step-N` holds, after step N (N steps done): every parameter as `model.<fqn>` and every
tensor of its optimizer state as `optim.<fqn>.<name>` (`exp_avg`, `momentum_buffer`, ...),
written by whichever ranks hold them (replicas write a tensor once: DCP deduplicates; a
tensor-parallel or FSDP2 parameter is a DTensor, each rank writing its shard under the same
full FQN, and any later layout reads the pieces it needs), and
`octopipe.json`, by rank 0, once every rank has written, with the SHA-256 of every other file
(`checksums`: the ranks hash their shares of the files, rank 0 gathers them). All of it is
written into `DIR/.step-N.partial` and renamed to `step-N` once complete, so a `step-N`
folder is whole or damaged, never half-written; a crash leaves at most a `.partial` folder,
which the next save clears. The learning rate and the data are functions of the step, so the
step is all the rest a run needs to continue as if it had not stopped, under the same
settings; the marker's `schedule` records the learning-rate settings, so that a resume under
others says what it reshapes (`schedule.py`). Which checkpoint a run
resumes, the folder's lock and its free space: `folder.py`.

Every read of a checkpoint's index goes through `metadata.read_metadata`, which runs
nothing the file names, and only tensor entries are loaded: opening a checkpoint never runs code.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.tensor import DTensor

from octopipe.errors import InputError
from octopipe.jsonfile import write_json
from octopipe.runtime.checkpoint.checksums import digests, hashed_files, share
from octopipe.runtime.checkpoint.folder import (
    FORMAT,
    MARKER,
    NoSpace,
    Resumable,
    check_room,
    is_no_space,
    no_space_message,
    read_marker,
)
from octopipe.runtime.checkpoint.metadata import (
    CheckedReader,
    TensorsOnlyPlanner,
    read_metadata,
    require_tensors,
)

__all__ = ["FORMAT", "MARKER", "check_compatible", "load", "load_weights", "save", "step_dir"]


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"step-{step}"


def _partial_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f".step-{step}.partial"


def check_compatible(
    found: Resumable,
    layers: Iterable[str],
    model: nn.Module,
    *,
    seed: int,
    optimizer: str,
    model_id: str,
) -> None:
    """Refuse a checkpoint of another model (other layers, parameters of other shapes, another
    `--model`), of another seed or optimizer, and one whose loading would run code or allocate
    what no parameter needs. Markers written before a key existed are not checked for it."""
    path, marker = found.path, found.marker
    if list(marker.layers) != list(layers):
        raise InputError(str(path), "a checkpoint of another model: its layers differ")
    if marker.model_id is not None and marker.model_id != model_id:
        raise InputError(
            "--model", f"{path} was written by another model ({marker.model}): {model_id} differs"
        )
    if marker.seed != seed:
        raise InputError(
            "--seed", f"{path} was trained with --seed {marker.seed}; resume with it (got {seed})"
        )
    if marker.optimizer is not None and marker.optimizer != optimizer:
        raise InputError(
            "--optimizer",
            f"{path} holds {marker.optimizer} state; resume with it (got {optimizer})",
        )
    saved = read_metadata(path)
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    _loaded_entries(saved, shapes, path)
    for name, shape in shapes.items():
        meta = saved.state_dict_metadata.get(f"model.{name}")
        if meta is None or tuple(meta.size) != shape:
            found_as = "missing" if meta is None else f"of shape {tuple(meta.size)}"
            raise InputError(
                str(path), f"a checkpoint of another model: {name} is {found_as}, not {shape}"
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
    nbytes: int = 0,
) -> Path:
    """Collective: every rank calls it after the same step. `nbytes`: about what the whole
    checkpoint takes, checked against the folder's free space first (NoSpace on every rank)."""
    root, rank0 = Path(root), dist.get_rank() == 0
    partial, path = _partial_dir(root, step), step_dir(root, step)
    verdict = [_prepare(root, nbytes, step) if rank0 else None]
    dist.broadcast_object_list(verdict, src=0)
    if verdict[0] is not None:
        raise NoSpace(verdict[0])
    state = {f"model.{k}": v.detach() for k, v in _named_parameters(modules).items()}
    state.update(_optimizer_tensors(modules, optimizer))
    try:
        dcp.save(state, checkpoint_id=str(partial))
    except CheckpointException as exc:  # raised on every rank when any rank's write failed
        if rank0:
            shutil.rmtree(partial, ignore_errors=True)
        if any(is_no_space(cause) for cause, _ in exc.failures.values()):
            raise NoSpace(
                no_space_message(root, nbytes, f"the checkpoint of step {step}")
            ) from None
        raise
    dist.barrier()
    checksums = _checksums(partial)
    if rank0:
        marker = {"format": FORMAT, "step": step, **about, "checksums": checksums}
        try:
            write_json(partial / MARKER, marker, sync=True)
        except OSError as exc:
            shutil.rmtree(partial, ignore_errors=True)
            if is_no_space(exc):
                message = no_space_message(root, nbytes, f"the checkpoint of step {step}")
                raise NoSpace(message) from None
            raise
        _restrict(partial)
        _put_in_place(partial, path)
    dist.barrier()
    return path


def _checksums(partial: Path) -> dict[str, str]:
    """Collective, once every rank has written: the digest of every file of the checkpoint
    (`checksums`), the files shared among the ranks, each hashing its part as a stream."""
    names = hashed_files(partial, MARKER)
    mine = digests(partial, share(names, dist.get_rank(), dist.get_world_size()))
    every: list[dict[str, str] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return {name: digest for part in every for name, digest in (part or {}).items()}


def _prepare(root: Path, nbytes: int, step: int) -> str | None:
    """Rank 0, before a save: clear what crashed saves left (no other run writes here: the
    folder is locked), then the free-space verdict (None: room enough)."""
    root.mkdir(parents=True, exist_ok=True)
    leftovers = (".step-*.partial", ".step-*.replaced", ".step-*.removed")
    for leftover in [p for pattern in leftovers for p in root.glob(pattern)]:
        shutil.rmtree(leftover, ignore_errors=True)
    try:
        check_room(root, nbytes, f"the checkpoint of step {step}")
    except NoSpace as exc:
        return str(exc)
    return None


def _restrict(folder: Path) -> None:
    """Nobody but the owner may write a checkpoint, whatever the umask: what a run resumes
    from must not be open to changes by others."""
    for item in [folder, *folder.iterdir()]:
        mode = item.stat().st_mode & 0o7777
        os.chmod(item, mode & ~0o022)


def _put_in_place(partial: Path, path: Path) -> None:
    """Rename the finished checkpoint to its name; a damaged one of the same step (which a
    resume skipped) is moved aside first and removed after."""
    aside = path.with_name(f".{path.name}.replaced")
    if path.exists():
        os.rename(path, aside)
    os.rename(partial, path)
    _sync_folder(path.parent)
    shutil.rmtree(aside, ignore_errors=True)


def _sync_folder(folder: Path) -> None:
    """Make the rename durable: the folder's entry, not only the files, reaches the disk."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
    for key, (fqn, _) in wanted.items():
        state[key] = _load_target(params[fqn], saved.state_dict_metadata[key])
    with torch.no_grad():
        dcp.load(state, storage_reader=CheckedReader(path, saved), planner=TensorsOnlyPlanner())
    for key, (fqn, name) in wanted.items():
        p = params[fqn]
        local.state[p][name] = state[key].to(p.device) if state[key].dim() else state[key]
    return read_marker(path).step


def load_weights(path: Path, model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter of `model` (a meta-device model will do: only names and shapes are
    read) as saved in checkpoint `path`, whole, in this process, without a process group and
    through the safe reader: FQN -> tensor, in the dtype it was saved in. The checkpoint must
    have passed `check_compatible` for this model."""
    saved = read_metadata(path)
    names = [name for name, _ in model.named_parameters()]
    require_tensors(saved, [f"model.{n}" for n in names], path)
    entries = saved.state_dict_metadata
    state = {
        f"model.{n}": torch.empty(entries[f"model.{n}"].size, dtype=_dtype(entries, n))
        for n in names
    }
    dcp.load(
        state, storage_reader=CheckedReader(path, saved), planner=TensorsOnlyPlanner(), no_dist=True
    )
    return {n: state[f"model.{n}"] for n in names}


def _dtype(entries, name: str) -> torch.dtype:
    return entries[f"model.{name}"].properties.dtype


def _load_target(param: torch.Tensor, meta) -> torch.Tensor:
    """Where a saved optimizer tensor is read into: laid out as its parameter when it has the
    parameter's shape (a DTensor's state is sharded as it is), else whole."""
    if isinstance(param, DTensor) and tuple(meta.size) == tuple(param.shape):
        return torch.empty_like(param.detach(), dtype=meta.properties.dtype)
    return torch.empty(meta.size, dtype=meta.properties.dtype)


def _named_parameters(modules: Mapping[int, nn.Module]) -> dict[str, nn.Parameter]:
    """The rank's parameters by FQN in the whole model (a stage module's `part` keeps them)."""
    return {k: p for m in modules.values() for k, p in m.named_weights().items()}


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
