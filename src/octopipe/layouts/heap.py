"""The cycle collector paused while a layout search runs (`plan_cluster`).

A search holds millions of small objects (generated orders, plans, rows) and makes millions more;
each of Python's full collections walks them all, and the fan-out's rows arriving from a worker
set off collection after collection while they are unpickled (GPT 310B's screening on two
processes: 20.0 CPU s in this process with the collector, 11.7 without). The search makes
almost no cyclic garbage (629 objects over a whole GPT 310B search), so nothing piles up while
the collector waits; reference counting frees everything else as usual. This module must not
change what a search computes: only when memory is swept.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """No automatic cycle collection inside (forked workers inherit the pause); the collector
    as it was after."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
