"""The layout search's finalists tuned side by side: one job per finalist, on forked workers,
the results taken back in the finalists' order.

    jobs = [TuneJob(row, evaluations, budget, seed, max_chunks) for row in finalists]
    done = tune_all(search, jobs, workers=2)       # [(row, evaluations, cut, cpu_seconds)]

Each tuning is independent of the others (its own start, seed and counted work), so the results
are the same whichever worker runs which job and however many workers there are: `workers=1`
(or a platform without fork) runs them in this process, one after the other. The workers are
forked from this process (they inherit the search's cost tables; nothing is pickled but a job
index and the results) and are all joined before `tune_all` returns, whatever happens.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

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


def tune_all(search: LayoutSearch, jobs: list[TuneJob], workers: int) -> list[Tuned]:
    """Every job's tuning, in the jobs' order: on `workers` forked processes where there are
    two jobs or more and the platform forks, else here one after the other."""
    forks = "fork" in multiprocessing.get_all_start_methods()
    workers = min(workers, len(jobs))
    if workers <= 1 or not forks:
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
