"""The layout search's work side by side on forked workers: the finalists tuned one job each,
the results taken back in the finalists' order (`tune_all`), and the next layouts screened
ahead while this process screens the current one (`ScreenAhead`).

    jobs = [TuneJob(row, evaluations, budget, seed, max_chunks) for row in finalists]
    done = tune_all(search, jobs, workers=2)       # [(row, evaluations, cut, cpu_seconds)]

Each tuning is independent of the others (its own start, seed and counted work), so the results
are the same whichever worker runs which job and however many workers there are: `workers=1`
(or a platform without fork, or a process running other threads) runs them in this process,
one after the other. The workers are forked from this process (they inherit the search's cost
tables; nothing is pickled but a job index and the results) and are all joined before
`tune_all` returns, whatever happens.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from octopipe.layouts.layout import Layout
from octopipe.layouts.planner import LayoutSearch, Row


@dataclass(frozen=True)
class TuneJob:
    """One finalist's tuning, as `LayoutSearch.tune` takes it."""

    start: Row
    evaluations: int
    time_budget: float
    seed: int
    max_chunks: int | None


Tuned = tuple[Row, int, bool, float]  # the row, evaluations made, cut by time, CPU seconds

# What forked workers tune: set just before the pool forks, read by `_tune_one` in the child.
_FORKED: tuple[LayoutSearch, list[TuneJob]] | None = None


def default_workers() -> int:
    """The cores this process may run on (at least 1)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no affinity on this platform
        return max(1, os.cpu_count() or 1)


def can_fork() -> bool:
    """Whether this process may fork workers: the platform forks, and no other thread runs (a
    thread holding a lock when the process forks would leave the child stuck on it)."""
    return "fork" in multiprocessing.get_all_start_methods() and threading.active_count() == 1


def tune_all(search: LayoutSearch, jobs: list[TuneJob], workers: int) -> list[Tuned]:
    """Every job's tuning, in the jobs' order: on `workers` forked processes where there are
    two jobs or more and `can_fork`, else here one after the other."""
    workers = min(workers, len(jobs))
    if workers <= 1 or not can_fork():
        return [_tune(search, job) for job in jobs]
    global _FORKED
    _FORKED = (search, jobs)
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"))
    try:
        return list(pool.map(_tune_one, range(len(jobs))))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # no worker outlives the search
        _FORKED = None


def _tune_one(index: int) -> Tuned:
    assert _FORKED is not None, "a worker forked without its jobs"
    search, jobs = _FORKED
    return _tune(search, jobs[index])


def _tune(search: LayoutSearch, job: TuneJob) -> Tuned:
    began = time.process_time()
    row, spent, cut = search.tune(
        job.start, job.evaluations, job.time_budget, job.seed, job.max_chunks
    )
    return row, spent, cut, time.process_time() - began


# --- screening ahead ----------------------------------------------------------------------

_AHEAD: LayoutSearch | None = None  # what a screening worker screens with, set before it forks


class ScreenAhead:
    """Screens, on forked workers, the layouts the search is likely to screen next while this
    process screens the current one. `take` gives what `LayoutSearch.screen` and `.standard`
    would give here: a worker's standard rows carry their bounds, and those at or above the
    `beat` of the moment of taking are dropped (the beat only falls, so the worker, started
    with an earlier one, simulated a superset). A layout the search then skips is wasted work,
    never a changed answer. `waited`: CPU seconds this process would have waited for workers
    on a quiet machine (a worker's job less this process's CPU seconds since it started)."""

    def __init__(self, search: LayoutSearch, workers: int):
        self.search = search
        self.helpers = workers - 1 if can_fork() else 0
        self.pool = None  # a multiprocessing pool: its workers can be ended mid-job
        self.started: dict = {}  # layout -> (async result, this process's CPU seconds then)
        self.waited = 0.0

    def ahead(self, layouts: Iterable[Layout], beat: float) -> None:
        """Start the first of `layouts` not started yet, if a worker is free."""
        if self.helpers <= 0:
            return
        busy = sum(not r.ready() for r, _ in self.started.values())
        if busy >= self.helpers:
            return
        layout = next((x for x in layouts if x not in self.started), None)
        if layout is None:
            return
        if self.pool is None:
            global _AHEAD
            _AHEAD = self.search
            self.pool = multiprocessing.get_context("fork").Pool(self.helpers)
        result = self.pool.apply_async(_screen_one, (layout, beat))
        self.started[layout] = (result, time.process_time())

    def take(self, layout: Layout, beat: float) -> tuple[Row | None, list[Row]]:
        """The layout's screening row and its standard rows under `beat`."""
        found = self.started.pop(layout, None)
        if found is None:
            return self.search.screen(layout), self.search.standard(layout, beat)
        result, since = found
        row, bounded, cpu = result.get()
        self.waited += max(0.0, cpu - (time.process_time() - since))
        return row, [r for bound, r in bounded if bound < beat]

    def close(self) -> None:
        """End every worker: what they still screen is for layouts the search left out."""
        global _AHEAD
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()
            self.pool = None
        self.started.clear()
        _AHEAD = None


def _screen_one(layout: Layout, beat: float) -> tuple[Row | None, list[tuple], float]:
    assert _AHEAD is not None, "a screening worker forked without its search"
    began = time.process_time()
    row = _AHEAD.screen(layout)
    bounded = _AHEAD.standard_bounded(layout, beat)
    return row, bounded, time.process_time() - began
