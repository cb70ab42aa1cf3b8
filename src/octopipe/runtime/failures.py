"""How a run fails, as the launcher and every rank raise it: a rank's failure, or a stop.

Below both the launcher (`launch/`) and a rank's job (`job/`), so each raises and catches them
without importing the other. Imports nothing of torch.
"""

from __future__ import annotations

import signal


class RankFailure(RuntimeError):
    """A rank raised (or died); the message names the rank and carries its original traceback,
    or is the whole story for a failure that needs none (a non-finite loss)."""

    exit_codes: tuple[int | None, ...] = ()  # every spawned rank's, once all are stopped
    bad_input: bool = False  # a rank refused its input (OctoPipeError): the user's to mend


class Stopped(KeyboardInterrupt):
    """The launching process got SIGTERM, SIGINT or SIGHUP; every rank has been stopped."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"stopped by {signal.Signals(signum).name}; every rank was stopped")
