"""Outputs go to regular files only: every writer's rename is refused over a device, a FIFO,
a socket or a folder, which stay as they were; a regular file is replaced whole."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from octopipe.errors import InputError
from octopipe.jsonfile import write_json
from octopipe.outfiles import not_regular, replacing, write_text


def _specials(tmp_path: Path) -> dict[str, Path]:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    folder = tmp_path / "folder"
    folder.mkdir()
    sock_path = tmp_path / "sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sock_path))
    sock.close()
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    to_null = tmp_path / "to-null"
    to_null.symlink_to("/dev/null")
    return {
        "a character device": Path("/dev/full"),
        "a FIFO (named pipe)": fifo,
        "a folder": folder,
        "a socket": sock_path,
        "a broken symbolic link": loop,
        "a character device (linked)": to_null,
    }


def test_what_stands_there_is_named(tmp_path):
    for kind, path in _specials(tmp_path).items():
        assert not_regular(path) == kind.removesuffix(" (linked)")
    (tmp_path / "plain").write_text("x")
    assert not_regular(tmp_path / "plain") is None
    assert not_regular(tmp_path / "absent") is None


@pytest.mark.parametrize("how", ["write_json", "write_text", "bytes"])
def test_nothing_but_a_regular_file_is_written_over(tmp_path, how):
    for kind, path in _specials(tmp_path).items():
        before = os.lstat(path)
        with pytest.raises(InputError, match="not a regular file; OctoPipe writes over none"):
            if how == "write_json":
                write_json(path, {"a": 1})
            elif how == "write_text":
                write_text(path, "text")
            else:
                with replacing(path, "wb") as file:
                    file.write(b"\x00")
        after = os.lstat(path)
        assert (after.st_mode, after.st_ino, after.st_rdev) == (
            before.st_mode,
            before.st_ino,
            before.st_rdev,
        ), kind
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # no leftovers


def test_a_regular_file_is_replaced_whole(tmp_path):
    path = tmp_path / "out.json"
    path.write_text("old")
    write_json(path, {"a": 1})
    assert path.read_text() == '{\n "a": 1\n}\n'
    with pytest.raises(RuntimeError), replacing(path) as file:
        file.write("half")
        raise RuntimeError("interrupted")
    assert path.read_text() == '{\n "a": 1\n}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]
