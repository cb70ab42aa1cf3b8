"""What a spawned rank does so that it never outlives the process that launched it.

The launcher stops its ranks itself when it can (a rank failed, or it got SIGTERM or Ctrl-C).
It cannot when it is killed outright (SIGKILL, the OOM killer): then each rank notices that its
parent is gone, removes the run's temporary folder (nobody else is left to) and exits. A thread
polls the parent's pid instead of PR_SET_PDEATHSIG, because the death signal would end the rank
before it could clean up, and the thread works wherever Python runs. Torch's blocking calls
(transfers, collectives, autograd) release the GIL, so the thread gets to run while they wait.

The thread starts first thing in a rank (`rank_entry`), before the rank imports torch (seconds,
on a loaded machine): what the rank runs travels `Deferred`, pickled as the process is spawned
but unpickled only once the lifeline holds. This module imports nothing heavy.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import pickle
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

POLL_S = 0.2  # how often a rank looks for its parent: it exits at most this long after


class Deferred:
    """`obj`, pickled while the process is spawned (so pipes, queues and shared tensors in it
    travel as multiprocessing sends them) but unpickled only when `load` is called."""

    def __init__(self, obj) -> None:
        self._obj, self._data = obj, None

    def __reduce__(self):
        from multiprocessing.reduction import ForkingPickler

        return (_packed, (bytes(ForkingPickler.dumps(self._obj)),))

    def load(self):
        return self._obj if self._data is None else pickle.loads(self._data)


def _packed(data: bytes) -> Deferred:
    deferred = Deferred(None)
    deferred._data = data
    return deferred


def rank_entry(parent_pid: int, folder: Path, title: str, work: Deferred) -> None:
    """A spawned rank's first call: hold on to the parent, then load and run `work`, a
    (function, args) pair."""
    hold_on(parent_pid, folder, title)
    function, args = work.load()
    function(*args)


def hold_on(parent_pid: int, folder: Path, title: str) -> None:
    """Set this rank up: die with `parent_pid` (removing `folder`), leave Ctrl-C to the parent,
    and show `title` in ps/top."""
    # A terminal's Ctrl-C reaches every process of the foreground group; the parent stops the
    # ranks in order, so a rank must not die of it half-way through a transfer.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _name_process(title)
    watcher = threading.Thread(
        target=_exit_with_parent, args=(parent_pid, folder), name="octopipe-lifeline", daemon=True
    )
    watcher.start()


def _exit_with_parent(parent_pid: int, folder: Path) -> None:
    # Reparented (to init or a subreaper) means the parent died; checked against the pid the
    # parent passed, so a parent that died while this rank was still starting counts too.
    while os.getppid() == parent_pid:
        time.sleep(POLL_S)
    shutil.rmtree(folder, ignore_errors=True)
    os._exit(1)


def _name_process(title: str) -> None:
    """The kernel's name of this process (Linux: 15 bytes shown by ps, top and /proc/PID/comm);
    elsewhere nothing."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    PR_SET_NAME = 15
    libc.prctl(PR_SET_NAME, title.encode()[:15], 0, 0, 0)
