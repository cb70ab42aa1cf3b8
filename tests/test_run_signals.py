"""Killing `octopipe run` or one of its ranks leaves nothing behind: no process, no temp folder.

Each test starts the command in a session of its own, marks its environment, and finds every
process that inherited the mark by scanning /proc (ranks name themselves `octopipe-rankN`).
"""

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from executor_helpers import gpipe

from octopipe.plan import save_plan

pytestmark = [
    pytest.mark.slow,  # real process groups: the full suite, not `-m "not slow"`
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
]

HERE = Path(__file__).parent
GONE_WITHIN_S = 30.0  # the bound for every rank to exit after a kill


def marked_processes(mark: str) -> dict[int, str]:
    """pid -> name of every live (not zombie) process whose environment holds `mark`."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            name = (entry / "comm").read_text().strip()
        except OSError:  # gone meanwhile
            continue
        if mark.encode() in environ and state != "Z":
            found[int(entry.name)] = name
    return found


def wait_until_gone(mark: str) -> dict[int, str]:
    deadline = time.monotonic() + GONE_WITHIN_S
    while (left := marked_processes(mark)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


@pytest.fixture
def training(tmp_path):
    """Start a long two-rank run; yield (process, mark, its temp folder) once a step is done."""
    save_plan(gpipe(2, 2), tmp_path / "plan.json")
    temp = tmp_path / "tmp"
    temp.mkdir()
    mark = f"OCTOPIPE_TEST_MARK={uuid.uuid4().hex}"
    key, value = mark.split("=")
    env = {
        **os.environ,
        key: value,
        "TMPDIR": str(temp),
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [sys.executable, "-m", "octopipe", "run", "--plan", str(tmp_path / "plan.json")]
    cmd += ["--model", "executor_helpers:sleepy_model", "--steps", "100000", "--json"]
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: a Ctrl-C can be sent to it alone
        preexec_fn=as_from_a_terminal,
    )
    try:
        first = proc.stdout.readline()  # a step line: both ranks are training
        assert first.startswith('{"step": 1'), proc.stderr.read()
        assert run_folders(temp), "the launcher's temp folder should exist while it runs"
        yield proc, mark, temp
    finally:
        for pid in marked_processes(mark):  # a failed test must not leave its run behind
            os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.communicate()


def as_from_a_terminal() -> None:
    """In the child before exec: SIGINT at its default, as a terminal starts a command. A
    suite started in the background by a shell (`pytest &`) has SIGINT ignored, which its
    children inherit, and the launcher leaves an ignored signal ignored
    (`runtime/launch/spawn.py`)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_folders(temp: Path) -> list[Path]:
    """The launcher's temp folders (torch keeps a cache of its own there too)."""
    return [p for p in temp.iterdir() if p.name.startswith("octopipe")]


def ranks(mark: str) -> dict[str, int]:
    return {name: pid for pid, name in marked_processes(mark).items() if "-rank" in name}


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "how, code",
    [
        ("SIGTERM to the launcher", 128 + signal.SIGTERM),
        ("Ctrl-C to the whole group", 128 + signal.SIGINT),
        ("SIGKILL to the launcher", -signal.SIGKILL),
    ],
)
def test_stopping_the_launcher_stops_every_rank_and_removes_the_temp_folder(training, how, code):
    proc, mark, temp = training
    assert set(ranks(mark)) == {"octopipe-rank0", "octopipe-rank1"}
    if how.startswith("Ctrl-C"):
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal does: every process of the group
    else:
        os.kill(proc.pid, getattr(signal, how.split()[0]))
    _, err = proc.communicate(timeout=GONE_WITHIN_S)
    assert proc.returncode == code, err
    assert wait_until_gone(mark) == {}
    assert run_folders(temp) == []
    if code > 0:  # the launcher lived to say so, in one line
        said = err.strip().splitlines()[-1]
        assert said == f"octopipe run: stopped by {signal.Signals(code - 128).name}; " + (
            "every rank was stopped"
        )


@pytest.mark.timeout(120)
def test_a_rank_killed_by_sigkill_is_named_as_the_cause(training):
    proc, mark, temp = training
    os.kill(ranks(mark)["octopipe-rank1"], signal.SIGKILL)
    _, err = proc.communicate(timeout=GONE_WITHIN_S)
    assert proc.returncode == 1
    assert err.strip().splitlines()[-1] == "octopipe run: rank 1 was killed by SIGKILL"
    assert wait_until_gone(mark) == {}
    assert run_folders(temp) == []
