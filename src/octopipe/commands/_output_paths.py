"""Files a command will write, checked before it starts working: a run must not train for an
hour and then fail on a mistyped folder."""

from __future__ import annotations

import os
from pathlib import Path

from octopipe.errors import InputError


def check_output_file(flag: str, path: str | None) -> None:
    """Refuse, in one line, a path whose file could not be written."""
    if path is None:
        return
    target = Path(path)
    folder = target.parent
    if target.is_dir():
        raise InputError(flag, f"{path} is a folder, not a file")
    if not folder.is_dir():
        raise InputError(flag, f"folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise InputError(flag, f"folder {folder} is not writable")
