"""Run a function on fresh processes, one per rank, and bring back rank 0's result or the cause
of the first failure; nothing is left running, whatever happens to the launching process.

On Linux the ranks are forked from one spawned process, the starter (`forks`), which imports
what every rank needs once, while the launcher checks the run: N ranks then pay for one import
of torch and the runtime, not N at once on the host's cores. `octopipe run` spawns it before it
imports torch itself (`start_early`), so the two imports share the cores. Elsewhere each rank is
spawned.

When the parent stops the ranks: only when one of them fails or dies, or when the parent is told
to stop (SIGTERM, SIGINT, SIGHUP; it then raises `Stopped`). A healthy run of any length
finishes: a wait stuck inside a rank (a transfer, a collective) is bounded by the process
group's timeout, which turns it into that rank's error. If the parent is killed outright, every
rank notices and exits by itself (`forks`: the starter, by the kernel's death signal, and its
ranks with it; `lifeline`: each spawned rank), and nothing is left to clean up: each rank
talks to the parent over a pipe of its own (no named semaphores, which a killed parent would
leak, as multiprocessing's queues would), and holds on to the parent before it imports torch.
"""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from octopipe.errors import OctoPipeError
from octopipe.runtime.failures import RankFailure, Stopped
from octopipe.runtime.launch import forks, lifeline
from octopipe.runtime.launch.forks import Forked
from octopipe.runtime.launch.watch import BAD_INPUT, GRACE_S, TRACEBACK, WHOLE, Inbox, watch

# Every process that times or trains (ranks, and the profiler's) starts with these unless the
# user set them. glibc hands large freed blocks back to the OS at once, so a split backward's
# retained graph faults in fresh pages on every microbatch: keeping freed memory made CPU op
# times steadier and the profile's times match the run's (BENCHMARKS.md, executor diagnosis 2).
CHILD_ENVIRONMENT = {
    "GLIBC_TUNABLES": ":".join(
        f"glibc.malloc.{knob}=4294967296" for knob in ("mmap_threshold", "trim_threshold")
    ),
    "GLOO_SOCKET_IFNAME": "lo",  # one host: gloo's and NCCL's sockets stay on loopback
    "NCCL_SOCKET_IFNAME": "lo",
}


def spawn_ranks(
    body: Callable[..., Any],
    args: tuple,
    nproc: int,
    name: str = "octopipe",
    on_note: Callable[[Any], None] | None = None,
    *,
    check: Callable[[tuple], tuple] | None = None,
    preload: Sequence[str] = (),
    warm: Callable[[tuple], None] | None = None,
):
    """Run `body(rank, world, store, *args)` on `nproc` fresh processes and return what rank 0's
    body returns. `store` is a file for `init_method="file://..."` (rendezvous without opening a
    port) in a temporary folder the body may use too. What a rank passes to `tell_parent` while
    it runs is handed to `on_note` here, in order. The first rank to fail stops all of them and
    the cause is raised as RankFailure.

    On Linux the ranks are forked from one spawned process (`forks`) that imports `preload`
    (modules every rank needs) once for all of them; elsewhere each rank is spawned on its own.
    `check(args)`, if given, is called here once that process is starting, so that the two
    overlap: it returns the args the ranks get, or raises, and then nothing is started.
    `warm(args)`, if given, is called once in that process before the ranks are forked (work
    every rank would repeat; elsewhere, not at all)."""
    if getattr(mp.current_process(), "_inheriting", False):
        raise OctoPipeError(
            "a spawned process ran your script again, to find a function or class of it the "
            "run uses, and the script called octopipe once more: put the script's work under "
            '`if __name__ == "__main__":` (or move what the run uses into a module)'
        )
    ctx = mp.get_context("spawn")
    early = _adopt_early(nproc, name, preload)
    pipes = early.pipes if early else [ctx.Pipe(duplex=False) for _ in range(nproc)]
    inbox = Inbox([reader for reader, _ in pipes])  # (the parent's ends, the ranks')
    ranks: Forked | _Spawned | None = early.ranks if early else None
    with _stop_on_signals(), _run_folder(name, early) as tmp:
        store = str(Path(tmp) / "store")
        try:
            if forks.available() and ranks is None:
                with _starting(body, args, Path(tmp)):
                    ranks = Forked(ctx, name, Path(tmp), [w for _, w in pipes], preload)
                _close_writers(pipes)
            if check is not None:
                args = check(args)
            if isinstance(ranks, Forked):
                ranks.go(
                    _forked_rank, (body, store, args), None if warm is None else partial(warm, args)
                )
            else:
                with _starting(body, args, Path(tmp)):
                    ranks = _Spawned(ctx, name, Path(tmp), pipes, body, store, args)
                _close_writers(pipes)
            payload = watch(ranks.procs, inbox, on_note)
        except RankFailure as failure:
            ranks.stop()
            failure.exit_codes = tuple(p.exitcode for p in ranks.procs)
            raise
        finally:
            if ranks is not None:
                ranks.stop()
            inbox.close()
            _close_writers(pipes)
    # Not a file: the bytes rank 0 (our own child) put in this run's queue a moment ago.
    # Results hold dataclasses, so they need the full unpickler; nothing from disk is read here.
    import torch

    return torch.load(io.BytesIO(payload), weights_only=False)


@dataclass
class _Early:
    """A starter spawned before the run's own modules are imported (`start_early`)."""

    nproc: int
    name: str
    preload: tuple[str, ...]
    tmp: Path
    pipes: list[tuple[Connection, Connection]]
    ranks: Forked


_early: _Early | None = None


def start_early(nproc: int, name: str, preload: Sequence[str]) -> None:
    """Spawn the starter of `nproc` ranks now (Linux), before the launcher imports torch and
    checks the run, so that both imports share the host's cores; `spawn_ranks` of the same
    count, name and preload takes it over, any other call finds none (`stop_early`). Only for
    a run whose ranks need nothing of the main script (the command line's)."""
    global _early
    stop_early()
    if not forks.available():
        return
    ctx = mp.get_context("spawn")
    tmp = Path(tempfile.mkdtemp(prefix=f"{name}-"))
    pipes = [ctx.Pipe(duplex=False) for _ in range(nproc)]
    with _starting(None, (), tmp):
        ranks = Forked(ctx, name, tmp, [w for _, w in pipes], preload)
    _close_writers(pipes)
    _early = _Early(nproc, name, tuple(preload), tmp, pipes, ranks)


def stop_early() -> None:
    """Stop a starter `start_early` spawned that no run took over, and remove its folder."""
    global _early
    early, _early = _early, None
    if early is None:
        return
    early.ranks.stop()
    for reader, _ in early.pipes:
        reader.close()
    shutil.rmtree(early.tmp, ignore_errors=True)


def _adopt_early(nproc: int, name: str, preload: Sequence[str]) -> _Early | None:
    global _early
    early = _early
    if early is None or (early.nproc, early.name, early.preload) != (nproc, name, tuple(preload)):
        stop_early()
        return None
    _early = None
    return early


@contextmanager
def _run_folder(name: str, early: _Early | None):
    """The run's temporary folder: the early starter's, or a new one; removed at the end."""
    if early is None:
        with tempfile.TemporaryDirectory(prefix=f"{name}-") as tmp:
            yield tmp
        return
    try:
        yield str(early.tmp)
    finally:
        shutil.rmtree(early.tmp, ignore_errors=True)


@contextmanager
def _starting(body, args: tuple, tmp: Path):
    """What processes started meanwhile begin with: the shared environment, SIGINT ignored, the
    main script hidden unless the ranks need it."""
    # torch._dynamo, imported on the way by torch.optim, makes its compile cache folder at
    # import (TMPDIR/torchinductor_USER); nothing here compiles, so the ranks' goes in this
    # run's folder, which goes with the run.
    cache = {"TORCHINDUCTOR_CACHE_DIR": str(tmp / "inductor")}
    with (
        _environment({**CHILD_ENVIRONMENT, **cache}),
        _children_ignore_sigint(),
        _script_left_alone(body, args),
    ):
        yield


def _close_writers(pipes: list[tuple[Connection, Connection]]) -> None:
    """The ranks' ends, once they have their own copies: EOF here when a rank is gone."""
    for _, writer in pipes:
        writer.close()


class _Spawned:
    """One spawned process per rank (where ranks are not forked), each holding on to the
    launcher with a thread of its own (`lifeline`)."""

    def __init__(self, ctx, name: str, tmp: Path, pipes, body, store: str, args: tuple) -> None:
        self.procs: list[mp.process.BaseProcess] = []
        nproc = len(pipes)
        for rank, (_, writer) in enumerate(pipes):
            work = lifeline.Deferred((_rank_main, (body, rank, nproc, store, args, writer)))
            p = ctx.Process(
                target=lifeline.rank_entry,
                args=(os.getpid(), tmp, f"{name}-rank{rank}", work),
                name=f"{name}-rank{rank}",
                daemon=True,
            )
            p.start()
            self.procs.append(p)

    def stop(self) -> None:
        """Leave nothing running: ask, then force."""
        for p in self.procs:
            if p.is_alive():
                p.terminate()
        for p in self.procs:
            p.join(GRACE_S)
            if p.is_alive():
                p.kill()
                p.join()


# --- inside a rank -----------------------------------------------------------------------------

_to_parent: tuple[Connection, int] | None = None  # (the pipe to the parent, this rank), in a rank
# What a rank's error message holds: a traceback, or a whole story (plain, or a bad input).


def tell_parent(note: Any) -> None:
    """In a spawned rank: hand `note` (picklable) to the parent's `on_note`."""
    assert _to_parent is not None, "tell_parent is for spawned ranks"
    pipe, rank = _to_parent
    pipe.send(("note", rank, note))


def _forked_rank(rank: int, world: int, pipe: Connection, body, store: str, args: tuple) -> None:
    """A rank forked by the starter (`forks`)."""
    _rank_main(body, rank, world, store, args, pipe)


def _rank_main(body, rank: int, world: int, store: str, args: tuple, pipe: Connection) -> None:
    """One spawned rank (its lifeline already holds): run the body; rank 0 sends its results;
    any error is reported."""
    global _to_parent
    _to_parent = (pipe, rank)
    code = 0
    try:
        import torch

        torch.set_num_threads(1)  # ranks share the host's cores; oversubscription only slows them
        results = body(rank, world, store, *args)
        if rank == 0:
            buf = io.BytesIO()
            torch.save(results, buf)
            message: tuple = ("ok", buf.getvalue())
    except RankFailure as exc:  # says it all: no traceback
        message, code = ("error", rank, str(exc), WHOLE), 1
    except OctoPipeError as exc:  # one line, as from the launcher (e.g. a file changed since)
        message, code = ("error", rank, f"rank {rank}: {exc}", BAD_INPUT), 1
    except BaseException:  # noqa: BLE001 - whatever it was, the parent must hear of it
        message, code = ("error", rank, traceback.format_exc(), TRACEBACK), 1
    if rank == 0 or code:
        try:
            pipe.send(message)
        except OSError:  # the parent is gone; the lifeline is on its way out too
            code = 1
    pipe.close()
    os._exit(code)  # skip interpreter teardown: a peer may be gone, and its sockets with it


# --- in the parent -----------------------------------------------------------------------------


@contextmanager
def _script_left_alone(body, args: tuple):
    """Spawned processes run the parent's main script again (as `__mp_main__`), so that they can
    unpickle functions and classes it defines; without an `if __name__ == "__main__":` guard
    the script would then start a run of its own in each of them. Ranks need nothing from the
    script unless what they are handed refers to it, so unless it does, the script is hidden
    from the processes while they start: a script without the guard works as written."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or path is None or _refers_to_main((body, args)):
        yield
        return
    spec = main.__spec__
    del main.__file__
    main.__spec__ = None
    try:
        yield
    finally:
        main.__file__, main.__spec__ = path, spec


class _ReferenceFinder(pickle.Pickler):
    """Pickles what the ranks are handed only to see which modules it names: tensors' data
    is left out (no copy, and nothing put in shared memory as multiprocessing's pickler would)."""

    def reducer_override(self, obj):
        torch = sys.modules.get("torch")  # no tensor without it
        if torch is not None and isinstance(obj, torch.Tensor):
            return int, ()
        return NotImplemented


def _refers_to_main(obj) -> bool:
    buffer = io.BytesIO()
    try:
        _ReferenceFinder(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    except Exception:  # noqa: BLE001 - unsure: leave the start as multiprocessing makes it
        return True
    return b"__main__" in buffer.getvalue()


@contextmanager
def _environment(defaults: dict[str, str]):
    """`defaults` in os.environ for the duration (values already set win), then as before."""
    added = [k for k in defaults if k not in os.environ]
    os.environ.update({k: defaults[k] for k in added})
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@contextmanager
def _stop_on_signals():
    """SIGTERM, SIGINT and SIGHUP raise `Stopped` here for the duration, so the ranks are
    stopped and the temporary folder removed on the way out. Only signals left at their default
    are taken over (a `nohup` run keeps ignoring SIGHUP), and only the first one raises: a second
    Ctrl-C must not cut the clean-up short."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired = False

    def stop(signum, _frame):
        nonlocal fired
        if not fired:
            fired = True
            raise Stopped(signum)

    previous = {}
    for sig in _STOP_SIGNALS:
        if signal.getsignal(sig) in (signal.SIG_DFL, signal.default_int_handler):
            previous[sig] = signal.signal(sig, stop)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def _children_ignore_sigint():
    """Children started meanwhile begin with SIGINT ignored (an ignored signal survives exec),
    so a Ctrl-C while they import torch does not kill them half-started; `lifeline` keeps it
    ignored. A Ctrl-C in this short window is lost."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
