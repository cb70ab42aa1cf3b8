"""The ranks' starter (Linux): one spawned process imports what every rank needs, once, then
forks the ranks from itself, so N ranks pay for one import of torch and the runtime instead of
N at once on the host's cores.

The launcher spawns the starter as soon as it knows the number of ranks (`octopipe run` even
before it imports torch: `spawn.start_early`), checks the run meanwhile, then sends it what the
ranks run (`go`); a refused run stops it instead. `Forked`, at the end, is the launcher's
handle on it. The
starter forks the ranks, reports each one's pid and exit code to the launcher (`status`), and
exits when the last is gone. It never initializes CUDA or starts a thread of its own before
forking, so each rank starts from a process that only imported modules.

Nothing outlives the launcher: the starter asks the kernel for a signal when the launcher dies
(PR_SET_PDEATHSIG; SIGUSR2), and then kills its ranks, waits for them and removes the run's
temporary folder; on SIGTERM (the launcher stopping the run) it kills its ranks, waits for
them and reports them. Each rank asks for SIGKILL when the starter dies, and checks the starter
is still there once it has asked. This
module imports nothing heavy: the starter holds on to the launcher before it imports torch.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib
import os
import pickle
import shutil
import signal
import sys
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from pathlib import Path

from octopipe.runtime.launch.watch import GRACE_S, TRACEBACK

# What every rank imports before it trains, imported once by the starter, not by the launcher,
# which only checks and watches: the session (the whole runtime) and torch._dynamo, which torch
# imports the first time a rank builds a model on the meta device or steps an optimizer.
RANK_MODULES = ("octopipe.runtime.job.session", "torch._dynamo")

_PR_SET_PDEATHSIG = 1
_DEATH_SIGNAL = signal.SIGUSR2  # what the starter gets when the launcher dies

# The first message a failed start sends the launcher on rank 0's pipe: `spawn` reads it as
# that rank's error (with its traceback).
_ERROR = "error"


def available() -> bool:
    """Whether ranks are forked from a starter here (Linux: the death signal it relies on)."""
    return sys.platform.startswith("linux") and hasattr(os, "fork")


def starter_entry(
    parent_pid: int,
    folder: Path,
    name: str,
    preload: Sequence[str],
    writers: list[Connection],
    go: Connection,
    status: Connection,
) -> None:
    """The starter's first call: hold on to the launcher, import `preload`, wait for what the
    ranks run (pickled `(run, args, warm)`: `warm()` here once, if not None, then
    `run(rank, world, writer, *args)` in each rank), fork them and report them until the last
    is gone."""
    children: dict[int, int] = {}  # pid -> rank
    _hold_on(parent_pid, folder, f"{name}-fork", children, status)
    try:
        for module in preload:
            try:
                importlib.import_module(module)
            except ImportError:  # a rank that needs it says so itself
                pass
        message = go.recv_bytes()
    except EOFError:  # the launcher refused the run (or stopped): nothing to start
        os._exit(0)
    except BaseException:  # noqa: BLE001 - rank 0's error, as it would have been in rank 0
        _fail(writers[0], traceback.format_exc())
    try:
        run, args, warm = pickle.loads(message)
    except BaseException:  # noqa: BLE001
        _fail(writers[0], traceback.format_exc())
    go.close()
    if warm is not None:
        try:
            warm()
        except Exception:  # noqa: BLE001 - only a head start: each rank does it again and fails
            pass
    sys.stdout.flush()  # or a rank would print what is buffered here again
    sys.stderr.flush()
    me = os.getpid()
    for rank in range(len(writers)):
        pid = os.fork()
        if pid == 0:
            _rank(rank, writers, status, me, name, run, args)
        children[pid] = rank
        status.send(("pid", rank, pid))
    for writer in writers:  # each rank holds its own: the launcher sees EOF when it is gone
        writer.close()
    while children:
        try:
            pid, code = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        rank = children.pop(pid, None)
        if rank is not None:
            _report(status, rank, os.waitstatus_to_exitcode(code))
    os._exit(0)


def _rank(
    rank: int,
    writers: list[Connection],
    status: Connection,
    starter: int,
    name: str,
    run: Callable,
    args: tuple,
) -> None:
    """A forked rank: dies with the starter, keeps only its own pipe, runs; never returns."""
    code = 1
    try:
        for signum in (signal.SIGTERM, _DEATH_SIGNAL):  # the starter's handlers are not ours
            signal.signal(signum, signal.SIG_DFL)
        _death_signal(signal.SIGKILL)
        if os.getppid() != starter:  # the starter died before we asked
            os._exit(1)
        _name_process(f"{name}-rank{rank}")
        status.close()
        for other, writer in enumerate(writers):
            if other != rank:
                writer.close()
        run(rank, len(writers), writers[rank], *args)
        code = 0
    finally:
        os._exit(code)


def _hold_on(
    parent_pid: int, folder: Path, title: str, children: dict[int, int], status: Connection
) -> None:
    """Die with the launcher (leaving nothing behind), leave Ctrl-C to it, show `title`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher stops the run in order

    def ending(launcher_gone: bool):
        def end(_signum, _frame) -> None:
            for pid in list(children):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            for pid, rank in list(children.items()):
                try:
                    _, code = os.waitpid(pid, 0)
                except ChildProcessError:
                    continue
                _report(status, rank, os.waitstatus_to_exitcode(code))
            if launcher_gone:  # nobody else is left to remove the run's folder
                shutil.rmtree(folder, ignore_errors=True)
            os._exit(1)

        return end

    # SIGTERM: the launcher stops the run (it removes the folder itself). The death signal is
    # one nobody else sends: the kernel sends it as the launcher's thread that started us exits,
    # while the launcher's other threads may still be going (our parent pid then still reads as
    # the launcher's, so it cannot tell).
    signal.signal(signal.SIGTERM, ending(launcher_gone=False))
    signal.signal(_DEATH_SIGNAL, ending(launcher_gone=True))
    _death_signal(_DEATH_SIGNAL)
    if os.getppid() != parent_pid:  # the launcher died before we asked
        ending(launcher_gone=True)(_DEATH_SIGNAL, None)
    _name_process(title)


def _report(status: Connection, rank: int, code: int) -> None:
    try:
        status.send(("exit", rank, code))
    except OSError:  # the launcher is gone
        pass


def _fail(writer: Connection, text: str) -> None:
    try:
        writer.send((_ERROR, 0, text, TRACEBACK))
    except OSError:
        pass
    os._exit(1)


def _libc():
    return ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def _death_signal(signum: int) -> None:
    """Have the kernel send `signum` to this process when its parent dies."""
    _libc().prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0)


def _name_process(title: str) -> None:
    """The kernel's name of this process (15 bytes shown by ps, top and /proc/PID/comm)."""
    PR_SET_NAME = 15
    _libc().prctl(PR_SET_NAME, title.encode()[:15], 0, 0, 0)


# --- in the launcher ---------------------------------------------------------------------------


class Forked:
    """The launcher's side (`spawn.py`): the ranks forked by one starter process, started
    before what they run is known (`go`); their pids and exit codes come from the starter."""

    def __init__(
        self, ctx, name: str, tmp: Path, writers: list[Connection], preload: Sequence[str]
    ) -> None:
        go_reader, self._go = ctx.Pipe(duplex=False)
        self._status, status_writer = ctx.Pipe(duplex=False)
        self.starter = ctx.Process(
            target=starter_entry,
            args=(os.getpid(), tmp, name, tuple(preload), writers, go_reader, status_writer),
            name=f"{name}-fork",
            daemon=True,
        )
        self.starter.start()
        go_reader.close()
        status_writer.close()
        self._eof = False
        self.forked = [False] * len(writers)
        self.codes: list[int | None] = [None] * len(writers)
        self.procs = [ForkedRank(self, rank) for rank in range(len(writers))]

    def go(self, run: Callable, args: tuple, warm: Callable[[], None] | None = None) -> None:
        """Start the ranks: `warm()` once in the starter, then `run(rank, world, writer, *args)`
        in each."""
        from multiprocessing.reduction import ForkingPickler

        try:
            self._go.send_bytes(bytes(ForkingPickler.dumps((run, args, warm))))
        except OSError:  # the starter is gone: its exit code tells (`poll`)
            pass
        self._go.close()

    def poll(self) -> None:
        """Take in what the starter reported; once it is gone, every rank it did not report
        went with it (killed by the death signal), or never started."""
        self._drain()
        if self.starter.exitcode is None:
            return
        self._drain()  # all it wrote before it went is in the pipe by now
        for rank, code in enumerate(self.codes):
            if code is None:
                gone = -signal.SIGKILL if self.forked[rank] else self.starter.exitcode
                self.codes[rank] = gone or 1

    def _drain(self) -> None:
        while not self._eof and self._status.poll(0):
            try:
                what, rank, value = self._status.recv()
            except (EOFError, OSError):
                self._eof = True
                return
            if what == "pid":
                self.forked[rank] = True
            else:
                self.codes[rank] = value

    def stop(self) -> None:
        """Leave nothing running: ask the starter (it kills its ranks and reports them), then
        force."""
        if self.stopped:
            return
        self._go.close()  # a starter still waiting leaves
        if self.starter.is_alive():
            self.starter.terminate()
        self.starter.join(GRACE_S)
        if self.starter.is_alive():
            self.starter.kill()
            self.starter.join()
        self.poll()
        self._status.close()

    @property
    def stopped(self) -> bool:
        return self._status.closed


class ForkedRank:
    """One forked rank, as `_watch` and `_failure` look at a process."""

    def __init__(self, group: Forked, rank: int) -> None:
        self._group, self._rank = group, rank

    @property
    def exitcode(self) -> int | None:
        if self._group.codes[self._rank] is None and not self._group.stopped:
            self._group.poll()
        return self._group.codes[self._rank]
