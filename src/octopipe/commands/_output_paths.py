"""Files a command will write, checked before it starts working: a run must not train for an
hour and then fail on a mistyped folder, and nothing but a regular file is ever written over
(a device, a FIFO, a socket or a folder standing where a file goes is refused here, and again
at the write itself: `octopipe.outfiles`)."""

from __future__ import annotations

import os
from pathlib import Path

from octopipe.errors import InputError
from octopipe.outfiles import not_regular

PICTURE = (".png", ".svg")  # what the timeline and memory pictures are drawn as
JSON = (".json",)
HTML = (".html", ".htm")


def check_output_file(flag: str, path: str | None, extensions: tuple[str, ...] = ()) -> None:
    """Refuse, in one line, a path whose file could not be written, or (given `extensions`)
    whose name does not end in one of them."""
    if path is None:
        return
    target = Path(path)
    folder = target.parent
    if target.is_dir():
        raise InputError(flag, f"{path} is a folder, not a file")
    kind = not_regular(target)
    if kind is not None:
        raise InputError(flag, f"{path} is {kind}, not a regular file; OctoPipe writes over none")
    if extensions and target.suffix.lower() not in extensions:
        raise InputError(
            flag, f"{path} must end in {' or '.join(extensions)} (it says what is written)"
        )
    _check_link(flag, folder)
    if not folder.is_dir():
        raise InputError(flag, f"folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InputError(flag, f"folder {folder} is not writable")
    if target.exists() and not os.access(target, os.W_OK):
        raise InputError(flag, f"{path} is not writable")


def check_output_folder(flag: str, path: str | Path, files: tuple[str, ...] = ()) -> None:
    """Refuse, in one line, a folder that is a file or could not be created or written, or
    (given `files`, the names the command writes into it) one where any of them stands as
    something other than a regular file."""
    target = Path(path)
    _check_link(flag, target)
    if target.exists() and not target.is_dir():
        raise InputError(flag, f"{path} is {not_regular(target) or 'a file'}, not a folder")
    existing = next((p for p in (target, *target.parents) if p.exists()), Path("."))
    if not existing.is_dir():
        raise InputError(flag, f"{existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise InputError(flag, f"{existing} is not writable")
    for name in files if target.is_dir() else ():
        kind = not_regular(target / name)
        if kind is not None:
            raise InputError(
                flag, f"{target / name} is {kind}, not a regular file; OctoPipe writes over none"
            )


def _check_link(flag: str, path: Path) -> None:
    """A symbolic link on the way that leads nowhere (to itself, in a loop, or to nothing):
    named as such, not left to a later `File exists` or `Too many levels`."""
    for p in (path, *path.parents):
        if os.path.islink(p) and not p.exists():
            raise InputError(
                flag, f"{p} is a symbolic link that leads nowhere (a loop, or a missing target)"
            )
