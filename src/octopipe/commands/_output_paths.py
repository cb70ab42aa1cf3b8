"""Files a command will write, checked before it starts working: a run must not train for an
hour and then fail on a mistyped folder."""

from __future__ import annotations

import os
from pathlib import Path

from octopipe.errors import InputError

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
    if extensions and target.suffix.lower() not in extensions:
        raise InputError(
            flag, f"{path} must end in {' or '.join(extensions)} (it says what is written)"
        )
    if not folder.is_dir():
        raise InputError(flag, f"folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise InputError(flag, f"folder {folder} is not writable")
    if target.exists() and not os.access(target, os.W_OK):
        raise InputError(flag, f"{path} is not writable")


def check_output_folder(flag: str, path: str | Path) -> None:
    """Refuse, in one line, a folder that is a file or could not be created or written."""
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise InputError(flag, f"{path} is a file, not a folder")
    existing = next((p for p in (target, *target.parents) if p.exists()), Path("."))
    if not existing.is_dir():
        raise InputError(flag, f"{existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise InputError(flag, f"{existing} is not writable")
