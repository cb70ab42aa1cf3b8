"""The checkpoint folder (`--checkpoint-dir`): which checkpoint a run resumes, the lock that
keeps a second run out, and whether there is room for the next one.

- `choose(root)`: the newest complete checkpoint. Complete means its marker (`octopipe.json`)
  reads strictly and names the step its folder's name does, its index reads safely
  (`metadata`), every shard the index names is there, long enough, and, where the marker
  records checksums (`checksums`), every file has the bytes that were saved. A newer
  folder that fails is skipped with a one-line warning (`CheckpointSkipped`); if every one
  fails, the run is refused. An index that would run code is refused, never skipped. The one
  chosen without checksums (written before them, or its marker lost the key) is resumed with a
  one-line warning that its bytes were not verified (`CheckpointUnverified`).
- `hold(root)`: an exclusive lock (`DIR/.octopipe.lock`, `flock`) for the run's whole life. The
  kernel drops it when the holder dies however it dies, so a dead run never blocks the next;
  the file records the holder's pid, host and start, for the message a second run gets.
- `check_room(root, nbytes)`: free space for one more checkpoint, refused in one line.

Writing and loading the tensors is `store.py`'s; this module reads only markers, indices,
file sizes and (`checksums.py`) the files' bytes.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import socket
import time
import warnings
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from octopipe.errors import InputError, OctoPipeError
from octopipe.jsonfile import read_json
from octopipe.outfiles import refuse_not_regular
from octopipe.runtime.checkpoint.checksums import DIGEST, verify
from octopipe.runtime.checkpoint.metadata import METADATA_FILE, DamagedCheckpoint, read_metadata
from octopipe.runtime.checkpoint.notices import CheckpointSkipped, CheckpointUnverified

if TYPE_CHECKING:
    from torch.distributed.checkpoint.metadata import Metadata

FORMAT = "octopipe.checkpoint/1"
MARKER = "octopipe.json"
LOCK = ".octopipe.lock"
STEP_DIR = re.compile(r"step-([0-9]{1,18})")
_PER_TENSOR_BYTES = 4096  # what DCP adds to each tensor's data (torch.save's header, the index)


class NoSpace(OctoPipeError):
    """Too little free space for a checkpoint; the message names the folder and the bytes."""


class Marker(BaseModel):
    """`octopipe.json`: what a run needs besides the tensors (docs/FORMATS.md)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    format: Literal["octopipe.checkpoint/1"]
    step: int = Field(strict=True, ge=0)
    model: str = Field(strict=True)
    layers: tuple[str, ...]
    seed: int = Field(strict=True)
    model_id: str | None = Field(default=None, strict=True)
    optimizer: str | None = Field(default=None, strict=True)
    # file name -> "sha256:<hex>" of every file the save wrote but this one (`checksums`);
    # absent in checkpoints written before checksums existed
    checksums: dict[str, str] | None = None
    # the learning-rate schedule it was trained on; absent in checkpoints written before it
    schedule: Schedule | None = None

    @field_validator("checksums")
    @classmethod
    def _plain_names_and_digests(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        for name, digest in (value or {}).items():
            if Path(name).name != name or name in ("", ".", "..", MARKER):
                raise ValueError(f"{name!r} is not a file of the checkpoint's folder")
            if not DIGEST.fullmatch(digest):
                raise ValueError(f"{name}: expected sha256:<64 hex digits>, got {digest!r}")
        return value


class Schedule(BaseModel):
    """The learning-rate schedule a checkpoint was trained on (`schedule.py`)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    lr: float = Field(strict=True, ge=0, allow_inf_nan=False)
    warmup_steps: int = Field(strict=True, ge=0)
    decay: Literal["constant", "cosine"]
    min_lr: float = Field(strict=True, ge=0, allow_inf_nan=False)
    total_steps: int = Field(strict=True, ge=1)

    @field_validator("lr", "min_lr", mode="before")
    @classmethod
    def _a_number(cls, value: object) -> object:
        # JSON writes 0.0 as 0.0, but a hand-edited 0 is a number too (strict floats refuse
        # ints); a bool is no number
        return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


@dataclass(frozen=True)
class Resumable:
    path: Path
    step: int
    marker: Marker


def read_marker(folder: Path) -> Marker:
    """The marker of checkpoint `folder`; DamagedCheckpoint (one line) if it is not sound."""
    path = folder / MARKER
    if not path.is_file():
        raise DamagedCheckpoint(str(folder), f"no {MARKER}: the save did not finish")
    try:
        data = read_json(path)
    except InputError as exc:  # unreadable: damaged, as a truncated shard is
        raise DamagedCheckpoint(exc.where, exc.message, exc.place) from None
    try:
        return Marker.model_validate(data)
    except ValidationError as exc:
        from octopipe.profile import first_error

        place, message = first_error(exc)
        raise DamagedCheckpoint(str(path), message, place) from None


def choose(root: str | Path) -> Resumable | None:
    """The newest complete checkpoint in `root`, or None if it holds no `step-N` folder.
    Newer incomplete ones are skipped with a warning; none complete is an InputError."""
    root = Path(root)
    found = sorted(
        (
            (int(m.group(1)), child)
            for child in _children(root)
            if (m := STEP_DIR.fullmatch(child.name))
        ),
        reverse=True,
    )
    faults = []
    for step, folder in found:
        try:
            marker = read_marker(folder)
            if marker.step != step:
                raise DamagedCheckpoint(
                    str(folder / MARKER), f"says step {marker.step}, its folder step {step}"
                )
            check_complete(folder, marker)
        except DamagedCheckpoint as exc:  # an UnsafeCheckpoint is not skipped: it propagates
            faults.append(str(exc))
            continue
        for fault in faults:
            warnings.warn(f"{fault}; skipped for {folder.name}", CheckpointSkipped, stacklevel=2)
        if marker.checksums is None:
            warnings.warn(unverified(folder), CheckpointUnverified, stacklevel=2)
        return Resumable(folder, step, marker)
    if faults:
        raise InputError("--resume", f"no complete checkpoint in {root}: {'; '.join(faults[:3])}")
    return None


def unverified(folder: Path) -> str:
    return (
        f"{folder}: its {MARKER} carries no checksums, so its bytes were not verified (a "
        "checkpoint written before checksums, or a marker that lost them): a changed byte "
        "would load as wrong weights"
    )


def check_complete(folder: Path, marker: Marker) -> None:
    """DamagedCheckpoint unless the index reads safely, every shard file it names is there
    and long enough, and every file has the checksum the marker records (where it does)."""
    index = read_metadata(folder)  # first: an index that would run code is refused, not skipped
    sums = marker.checksums
    if sums is not None:  # the index's bytes before what it says is believed
        verify(folder, sums, [METADATA_FILE])
    shards = check_shards(folder, index)  # a short shard is named as such, before its digest
    if sums is not None:
        verify(folder, sums, sorted({*shards, *sums} - {METADATA_FILE}))


def check_shards(folder: Path, index: Metadata | None = None) -> list[str]:
    """The index (read safely, unless given) names shard files that are all there and long
    enough; their names."""
    index = read_metadata(folder) if index is None else index
    needed: dict[str, int] = {}
    for info in index.storage_data.values():
        end = info.offset + info.length
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), end)
    for name, end in sorted(needed.items()):
        shard = folder / name
        size = shard.stat().st_size if shard.is_file() else None
        if size is None or size < end:
            state = "is missing" if size is None else f"holds {size:,} of {end:,} bytes"
            raise DamagedCheckpoint(str(shard), f"shard {state}")
    return sorted(needed)


def _children(root: Path) -> list[Path]:
    try:
        return [child for child in root.iterdir() if child.is_dir()]
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise InputError("--checkpoint-dir", f"{root}: {exc.strerror or exc}") from None


# --- the folder a run writes to ---------------------------------------------------------------


def keep_newest(root: str | Path, keep: int, saved: int) -> list[Path]:
    """After the save of step `saved`: remove every `step-N` folder of `root` with N at most
    `saved` but the newest `keep` (`--keep-last`); newer ones (damaged leftovers a resume
    skipped, replaced when their step is saved) are not this save's business. Each is renamed
    aside first, so that a crash midway leaves no half-removed `step-N` behind. The removed."""
    root = Path(root)
    steps = sorted(
        (int(m.group(1)), child)
        for child in _children(root)
        if (m := STEP_DIR.fullmatch(child.name)) and int(m.group(1)) <= saved
    )
    removed = []
    for _, folder in steps[: max(len(steps) - keep, 0)]:
        aside = folder.with_name(f".{folder.name}.removed")
        os.rename(folder, aside)
        shutil.rmtree(aside, ignore_errors=True)
        removed.append(folder)
    return removed


def check_folder(root: str | Path) -> None:
    """`--checkpoint-dir` is a folder this process can write, or one it can create."""
    from octopipe.outfiles import check_output_folder  # plain path checks

    check_output_folder("--checkpoint-dir", root, (LOCK,))


def check_room(root: str | Path, nbytes: int, what: str = "a checkpoint") -> None:
    """Refuse, in one line naming the folder and the bytes, a checkpoint that will not fit."""
    root = Path(root)
    probe = next((p for p in (root, *root.parents) if p.exists()), Path("."))
    free = shutil.disk_usage(probe).free
    if free < nbytes:
        raise NoSpace(no_space_message(root, nbytes, what, free))


def no_space_message(root: Path, nbytes: int, what: str, free: int | None = None) -> str:
    have = "" if free is None else f" ({free:,} bytes free)"
    return f"no space for {what} in {root}{have}: it needs about {nbytes:,} bytes"


def is_no_space(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def checkpoint_bytes(model, optimizer: str, momentum: float = 0.0) -> int:
    """About how many bytes a checkpoint of `model` (a meta-device model will do) takes: every
    parameter and its optimizer state (Adam: two moments and a step count; SGD: a momentum
    buffer when momentum is on), each tensor with what DCP adds to it."""
    adam = optimizer in ("adam", "adamw")
    copies = 1 + (2 if adam else 0) + (1 if optimizer == "sgd" and momentum else 0)
    tensors = copies + (1 if adam else 0)  # Adam's step is a tensor of its own
    return sum(
        copies * p.numel() * p.element_size() + tensors * _PER_TENSOR_BYTES
        for p in model.parameters()
    )


@contextmanager
def hold(root: str | Path) -> Iterator[None]:
    """Keep every other run out of `root` while the block runs (module docstring)."""
    root = Path(root)
    made = not root.exists()
    root.mkdir(parents=True, exist_ok=True)
    path = root / LOCK
    refuse_not_regular(path, "--checkpoint-dir")  # opening a FIFO would block, a device worse
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    refused = True
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InputError("--checkpoint-dir", _in_use(root, path)) from None
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
        yield
        refused = False
    finally:
        os.close(fd)  # closing drops the lock
        if made and refused and [p.name for p in root.iterdir()] == [LOCK]:
            path.unlink(missing_ok=True)  # a run refused before it wrote: the folder it made
            root.rmdir()  # goes too, as it was


def _in_use(root: Path, lock: Path) -> str:
    try:
        holder = json.loads(lock.read_text())
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(holder["since"])))
        who = f"pid {int(holder['pid'])} on {holder['host']}, since {since}"
    except (OSError, ValueError, KeyError, TypeError):
        who = "another process"
    return (
        f"{root} is in use by another run ({who}); wait for it, or give another folder. The "
        f"lock is released when that run ends, however it ends; if it persists (a host that "
        f"went down with a network file system), remove {lock}"
    )


def model_identity(spec: object) -> str:
    """What a checkpoint records as its model, to tell another `--model` on resume: a config
    file by its content (a folder or checkpoint may move between machines, the model does not
    change), a factory by its import path, a bundled model by its name."""
    if callable(spec):
        return f"{getattr(spec, '__module__', '?')}:{getattr(spec, '__qualname__', spec)}"
    text = str(spec)
    path = Path(text.removeprefix("hf:"))
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        return f"{'hf:' if text.startswith('hf:') else ''}sha256:{_sha256(path)}"
    return text


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


@contextmanager
def hold_all(roots: Iterable[str | Path]) -> Iterator[None]:
    """`hold` every folder of `roots` (each once) for the duration."""
    with ExitStack() as stack:
        for root in sorted({str(Path(r)) for r in roots}):
            stack.enter_context(hold(root))
        yield
