"""A checkpoint's proof of its bytes: the SHA-256 of every file DCP wrote (each shard and the
index, `.metadata`), recorded in the marker when the save completes and checked before a
checkpoint is resumed or exported.

A shard whose bytes changed but not its length (a flipped bit on disk, a bad copy) passes
every other check and would load as wrong weights; its digest differs. Each file is hashed as
a stream (`hashlib.file_digest`: fixed-size reads, no file held in memory), so proving a
100 GB checkpoint costs one read of it. The ranks of a save share the hashing (`share`).

Checkpoints written before checksums existed have none and are not checked (the marker's
`checksums` key is optional, docs/FORMATS.md). Files only: no torch, no process group.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from octopipe.runtime.checkpoint.metadata import DamagedCheckpoint

ALGORITHM = "sha256"
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def file_digest(path: Path) -> str:
    """`sha256:<hex>` of the file's bytes, read once as a stream."""
    with open(path, "rb") as file:
        return f"{ALGORITHM}:{hashlib.file_digest(file, ALGORITHM).hexdigest()}"


def hashed_files(folder: Path, marker: str) -> list[str]:
    """The files of a checkpoint folder that its checksums cover: every regular file but the
    marker (which holds them), in name order: the shards and `.metadata`."""
    return sorted(p.name for p in Path(folder).iterdir() if p.is_file() and p.name != marker)


def share(names: list[str], rank: int, world: int) -> list[str]:
    """Rank `rank`'s part of the files to hash when `world` ranks hash them together."""
    return names[rank::world]


def digests(folder: Path, names: list[str]) -> dict[str, str]:
    return {name: file_digest(Path(folder) / name) for name in names}


def verify(folder: Path, checksums: Mapping[str, str], names: Iterable[str]) -> None:
    """DamagedCheckpoint (one line naming the file) unless each of `names` has a checksum in
    `checksums` and the bytes it records."""
    folder = Path(folder)
    for name in names:
        path, expected = folder / name, checksums.get(name)
        if expected is None:
            raise DamagedCheckpoint(
                str(path), "has no checksum in the marker: not a file the save wrote"
            )
        try:
            found = file_digest(path)
        except FileNotFoundError:
            raise DamagedCheckpoint(str(path), "is missing (the marker has its checksum)") from None
        except OSError as exc:
            raise DamagedCheckpoint(str(path), f"cannot read: {exc.strerror or exc}") from None
        if found != expected:
            raise DamagedCheckpoint(
                str(path),
                f"its bytes changed since the save ({ALGORITHM} {found[7:19]}..., the marker "
                f"says {expected[7:19]}...)",
            )
