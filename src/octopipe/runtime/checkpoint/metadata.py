"""Reading a `torch.distributed.checkpoint` folder without running anything it holds.

Checkpoints travel between people and machines, so opening one must not execute it. DCP
stores its index (`.metadata`) as a pickle, and torch's `FileSystemReader` reads it with a
plain `pickle.load`, which runs whatever callables the file names. Here the index is read by
an unpickler that resolves only the globals DCP's metadata is made of (`ALLOWED_GLOBALS`) and
refuses every other one by name. The index is then checked for shape (types, shard names,
chunk bounds), and a key stored as pickled bytes (`BytesStorageMetadata`, which DCP's default
planner loads with `torch.load(weights_only=False)`) is refused for every key OctoPipe loads.

`read_metadata` is used for every read: the launcher's check before any rank starts and each
rank's load, which hands the checked index to `dcp.load` through `CheckedReader` (so the
index is not read a second time) with `TensorsOnlyPlanner` (which refuses bytes entries).
Tensor data itself is read by torch with `weights_only=True`.

Nothing here decides which checkpoint to use or what a run does with it (`store.py`, `folder.py`).
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import ReadItem

from octopipe.errors import InputError

METADATA_FILE = ".metadata"

# Exactly what torch 2.13 pickles into `.metadata` (found with pickletools on real checkpoints
# of every optimizer's state): DCP's own dataclasses and enum, the shard record, torch.Size, the
# layout lookup, and the checkpoint's path. BytesStorageMetadata is resolved so that a key
# declared as bytes can be refused by name below. None of these runs code given any arguments.
_DCP = "torch.distributed.checkpoint.metadata"
ALLOWED_GLOBALS = frozenset(
    {
        (_DCP, "Metadata"),
        (_DCP, "TensorStorageMetadata"),
        (_DCP, "BytesStorageMetadata"),
        (_DCP, "ChunkStorageMetadata"),
        (_DCP, "TensorProperties"),
        (_DCP, "MetadataIndex"),
        (_DCP, "StorageMeta"),
        (_DCP, "_MEM_FORMAT_ENCODING"),
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),  # a dict lookup of torch.strided & co.
        ("pathlib", "PosixPath"),  # StorageMeta.checkpoint_id
    }
)
# torch's dtypes are inert values (not callable); taken from the module's namespace, so that no
# name from the file triggers an import.
_DTYPES = frozenset(name for name, value in vars(torch).items() if isinstance(value, torch.dtype))


class UnsafeCheckpoint(InputError):
    """A checkpoint whose loading would run code: refused, never skipped."""


class DamagedCheckpoint(InputError):
    """A checkpoint that cannot be read as written: truncated, garbled, incomplete."""


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file: io.BufferedReader, where: str) -> None:
        super().__init__(file)
        self.where = where

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED_GLOBALS or (module == "torch" and name in _DTYPES):
            return super().find_class(module, name)
        raise UnsafeCheckpoint(
            self.where,
            f"refused to load: it names {module}.{name}, which is no part of a checkpoint's "
            "metadata (opening a checkpoint never runs code)",
        )

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafeCheckpoint(self.where, "refused to load: it holds a persistent reference")


def read_metadata(folder: str | Path) -> Metadata:
    """The checked index of the checkpoint in `folder`; UnsafeCheckpoint or DamagedCheckpoint
    (one line naming the file) when it cannot be trusted or read."""
    path = Path(folder) / METADATA_FILE
    where = str(path)
    try:
        with open(path, "rb") as file:
            metadata = _MetadataUnpickler(file, where).load()
    except InputError:
        raise
    except OSError as exc:
        raise DamagedCheckpoint(where, f"cannot read: {exc.strerror or exc}") from None
    except Exception as exc:  # noqa: BLE001 - any fault of a damaged pickle: EOF, bad opcodes
        raise DamagedCheckpoint(where, f"not a readable checkpoint index ({_brief(exc)})") from None
    _check_shape(metadata, where)
    return metadata


def require_tensors(metadata: Metadata, keys: Iterable[str], where: str | Path) -> None:
    """Refuse a checkpoint that declares any of `keys` as pickled bytes (loading runs them)."""
    entries = metadata.state_dict_metadata
    for key in keys:
        if isinstance(entries.get(key), BytesStorageMetadata):
            raise UnsafeCheckpoint(
                str(Path(where) / METADATA_FILE),
                f"{key} is stored as pickled bytes, which loading would run as code; "
                "OctoPipe checkpoints hold tensors only",
            )


class CheckedReader(FileSystemReader):
    """torch's reader over `folder`, handing DCP an index already read by `read_metadata`."""

    def __init__(self, folder: str | Path, metadata: Metadata) -> None:
        super().__init__(str(folder))
        self._metadata = metadata

    def read_metadata(self) -> Metadata:  # no **kwargs: DCP then tries no rank-local index
        self._metadata.storage_meta.load_id = self.load_id
        return self._metadata


class TensorsOnlyPlanner(DefaultLoadPlanner):
    """DCP's default load planner, except that a bytes entry (unpickled with
    `weights_only=False` by the default) is refused: OctoPipe writes tensors only."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        raise UnsafeCheckpoint(
            str(self.metadata.storage_meta.checkpoint_id if self.metadata else "checkpoint"),
            f"{read_item.dest_index.fqn} is stored as pickled bytes; refused",
        )


def _check_shape(metadata: Any, where: str) -> None:
    """The index holds what DCP writes, so a damaged one fails here in one line, not in DCP."""

    def fault(message: str) -> DamagedCheckpoint:
        return DamagedCheckpoint(where, f"damaged checkpoint index: {message}")

    if not isinstance(metadata, Metadata):
        raise fault(f"holds a {type(metadata).__name__}, not DCP metadata")
    entries, storage = metadata.state_dict_metadata, metadata.storage_data
    if not isinstance(entries, dict) or not isinstance(storage, dict):
        raise fault("its tables are missing")
    for key, entry in entries.items():
        if not isinstance(key, str):
            raise fault(f"a key is a {type(key).__name__}")
        if isinstance(entry, BytesStorageMetadata):
            continue  # refused by require_tensors where it matters
        if not isinstance(entry, TensorStorageMetadata):
            raise fault(f"{key} is a {type(entry).__name__}")
        _check_tensor(key, entry, storage, fault)
    for index, info in storage.items():
        if not (isinstance(index, MetadataIndex) and isinstance(info, _StorageInfo)):
            raise fault("a shard record is malformed")
        name = info.relative_path
        if not (isinstance(name, str) and name and Path(name).name == name and name != ".."):
            raise fault(f"shard {name!r} is not a file of the checkpoint's folder")
        if not all(_count(x) for x in (info.offset, info.length)):
            raise fault(f"shard record of {index.fqn} has a bad offset or length")
        if info.transform_descriptors:  # compression etc.: OctoPipe writes none
            raise fault(f"{index.fqn} is stored transformed ({info.transform_descriptors})")
    if metadata.storage_meta is not None and not hasattr(metadata.storage_meta, "load_id"):
        raise fault("its storage record is malformed")


def _check_tensor(key: str, entry: TensorStorageMetadata, storage: dict, fault) -> None:
    size = entry.size
    if not (isinstance(size, torch.Size) and all(_count(n) for n in size)):
        raise fault(f"{key} has a bad size")
    properties = entry.properties
    if not (isinstance(properties, TensorProperties) and isinstance(properties.dtype, torch.dtype)):
        raise fault(f"{key} has no dtype")
    if not isinstance(entry.chunks, list) or not entry.chunks and size.numel():
        raise fault(f"{key} has no chunks")
    for i, chunk in enumerate(entry.chunks):
        if not (
            isinstance(chunk, ChunkStorageMetadata)
            and isinstance(chunk.offsets, torch.Size)
            and isinstance(chunk.sizes, torch.Size)
            and len(chunk.offsets) == len(chunk.sizes) == len(size)
            and all(
                _count(o) and _count(n) and o + n <= whole
                for o, n, whole in zip(chunk.offsets, chunk.sizes, size)
            )
        ):
            raise fault(f"{key} chunk {i} lies outside the tensor")
        if MetadataIndex(key, chunk.offsets) not in storage:
            raise fault(f"{key} chunk {i} has no shard record")


def _count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _brief(exc: Exception) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
