"""Where OctoPipe writes: regular files only, each whole or not at all.

Every file a command writes (JSON, CSV, TOML, pictures, token files, the torchtitan module) goes
through `replacing(path)`: a temporary file beside the target, renamed over it once complete, so
an interrupted write leaves the old file (or none), never half of the new one. A rename replaces
whatever directory entry is there, so before it (and before any work, in the commands' path
checks) the target must be absent or a regular file: a device (`/dev/full`), a FIFO, a socket
or a folder in its place is refused in one line naming it, and is never written over.

Stdlib only: light commands import it.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from octopipe.errors import InputError

_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
)


def not_regular(path: str | Path) -> str | None:
    """What `path` is when something other than a regular file stands there (a symbolic link
    is judged by what it points to), e.g. "a character device"; None when it is absent or a
    regular file."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):  # a parent that is a file: the folder
        return "a broken symbolic link" if os.path.islink(path) else None  # checks say so
    except OSError as exc:
        if os.path.islink(path):  # ELOOP: a link to itself, or a loop of links
            return "a broken symbolic link"
        return f"unreadable ({exc.strerror or exc})"
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def unreadable_input(path: str | Path) -> str | None:
    """Why `path` cannot be read as an input file, in words that follow its name ("does not
    exist", "is a folder", "is a FIFO (named pipe), not a file"); None for a regular file."""
    if not os.path.lexists(path):
        return "does not exist"
    kind = not_regular(path)
    if kind is None:
        return None
    if kind == "a folder":
        return "is a folder, not a file"
    return f"is {kind}, not a file"


def refuse_not_regular(path: str | Path, where: str | None = None) -> None:
    """InputError (one line naming `where`, default the path) unless `path` is absent or a
    regular file: it is never written over."""
    kind = not_regular(path)
    if kind is not None:
        located = f"{where}: {path}" if where else str(path)
        raise InputError(located, f"is {kind}, not a regular file; OctoPipe writes over none")


@contextmanager
def replacing(path: str | Path, mode: str = "w", sync: bool = False) -> Iterator[IO]:
    """A file open for writing (`mode` "w" for UTF-8 text, "wb" for bytes) whose content
    becomes `path` when the block ends without an error: written beside it, then renamed over
    it. `sync`: on the disk before the rename (survives a power cut, not only a crash)."""
    path = Path(path)
    refuse_not_regular(path)
    try:
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:  # name the file the caller asked for, not the temporary one
        raise OSError(exc.errno, exc.strerror, str(path)) from None
    try:
        text = {} if "b" in mode else {"encoding": "utf-8", "newline": ""}  # bytes as given
        with os.fdopen(fd, mode, **text) as file:
            yield file
            if sync:
                file.flush()
                os.fsync(file.fileno())
        os.chmod(temporary, 0o666 & ~_umask())  # mkstemp's 0600 would hide it from others
        refuse_not_regular(path)  # once more: something may have been put there meanwhile
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def rename_into_place(source: str | Path, target: str | Path) -> None:
    """`os.replace(source, target)`, refused when `target` is not absent or a regular file."""
    refuse_not_regular(target)
    os.replace(source, target)


def write_text(path: str | Path, text: str, sync: bool = False) -> None:
    """`text` (UTF-8) in `path`, whole or not at all (`replacing`)."""
    with replacing(path, "w", sync) as file:
        file.write(text)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# --- checked before a command works -------------------------------------------------------
# Files a command will write are checked before it starts: a run must not train for an hour and
# then fail on a mistyped folder.

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
