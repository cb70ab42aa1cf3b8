"""The launcher's watch over its ranks (`spawn.py`): every rank's pipe read as one inbox, its
notes passed on, rank 0's result brought back, and on a failure its cause: a rank killed by a
signal, else the first error reported, else the first rank that died."""

from __future__ import annotations

import multiprocessing as mp
import signal
import time
from multiprocessing.connection import Connection, wait

from octopipe.runtime.failures import RankFailure

GRACE_S = 2.0  # how long a failed run's other ranks get to report or exit before they are killed
_POLL_S = 0.05
# What a rank's error message holds: a traceback, its whole text, or a user's bad input.
TRACEBACK, WHOLE, BAD_INPUT = "traceback", "whole", "bad input"


class Inbox:
    """The parent's ends of the ranks' pipes: the next message of any rank."""

    def __init__(self, readers: list[Connection]) -> None:
        self._open = list(readers)

    def next(self, timeout: float) -> tuple | None:
        if not self._open:
            time.sleep(timeout)
            return None
        for reader in wait(self._open, timeout):
            try:
                return reader.recv()
            except (EOFError, OSError):  # that rank is gone and said all it had
                self._open.remove(reader)
                reader.close()
        return None

    def close(self) -> None:
        for reader in self._open:
            reader.close()
        self._open = []


def watch(procs: list[mp.process.BaseProcess], messages: Inbox, on_note) -> bytes:
    """Wait for rank 0's results and every rank's clean exit, passing notes on; raise the cause
    of the first failure. No deadline: a healthy run may take as long as it takes."""
    payload: bytes | None = None
    while True:
        msg = _next_message(messages, _POLL_S)
        if msg is not None:
            if msg[0] == "note":
                if on_note is not None:
                    on_note(msg[2])
                continue
            if msg[0] == "error":
                raise _failure(procs, messages, [msg])
            payload = msg[1]
        codes = [p.exitcode for p in procs]
        if any(c not in (None, 0) for c in codes):
            raise _failure(procs, messages, [])
        if all(c == 0 for c in codes):
            return payload if payload is not None else _last_result(messages, on_note)


def _last_result(messages: Inbox, on_note) -> bytes:
    """Every rank exited cleanly: rank 0's result is still in the queue, behind its notes."""
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline:
        msg = _next_message(messages, _POLL_S)
        if msg is not None and msg[0] == "note" and on_note is not None:
            on_note(msg[2])
        elif msg is not None and msg[0] == "ok":
            return msg[1]
    raise RankFailure("every rank exited but rank 0 sent no result")


def _failure(
    procs: list[mp.process.BaseProcess], messages: Inbox, errors: list[tuple]
) -> RankFailure:
    """The cause of a failed run. The ranks get a moment to report or exit, since one failure
    brings down its peers with errors of their own: a rank killed by a signal is the cause
    (its peers then fail on broken connections), else the first error reported, else the first
    rank that died."""
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline and any(p.exitcode is None for p in procs):
        msg = _next_message(messages, _POLL_S)
        if msg is not None and msg[0] == "error":
            errors.append(msg)
    while (msg := _next_message(messages, 0)) is not None:
        if msg[0] == "error":
            errors.append(msg)
    reported = {msg[1] for msg in errors}
    codes = [p.exitcode for p in procs]
    for rank, code in enumerate(codes):
        if code is not None and code < 0 and rank not in reported:
            return RankFailure(f"rank {rank} was killed by {signal.Signals(-code).name}")
    if errors:
        _, rank, text, kind = errors[0]
        failure = RankFailure(f"rank {rank} failed:\n{text}" if kind == TRACEBACK else text)
        failure.bad_input = kind == BAD_INPUT
        return failure
    rank, code = next((r, c) for r, c in enumerate(codes) if c not in (None, 0))
    return RankFailure(f"rank {rank} died with exit code {code}")


def _next_message(messages: Inbox, timeout: float) -> tuple | None:
    return messages.next(timeout)
