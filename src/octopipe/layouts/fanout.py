"""The layout search's work side by side on forked workers: the finalists tuned one job each,
the results taken back in the finalists' order (`Finalists`, `tune_all`), and the winner's polish
started early on a guess (`Finalists.polished`). The screening stays in the search's process:
its rows, pickled back from a worker, cost more than screening them here.

    jobs = [TuneJob(row, evaluations, budget, seed, max_chunks) for row in finalists]
    done = tune_all(search, jobs, workers=2)       # [(row, evaluations, cut, cpu_seconds)]

Each tuning is independent of the others (its own start, seed and counted work), so the results
are the same whichever worker runs which job and however many workers there are: `workers=1`
(or a platform without fork, or a process running other threads) runs them in this process,
one after the other. The workers are forked from this process (they inherit the search's cost
tables; nothing is pickled but the jobs and the results) and are all ended before `tune_all`
or `Finalists.close` returns, whatever happens.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import threading
import time
from collections.abc import Callable
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
    actions: int | None = None  # what it may list-schedule (None: `LayoutSearch.tune`'s)


Tuned = tuple[Row, int, bool, float]  # the row, evaluations made, cut by time, CPU seconds

# What forked workers tune with: set just before the pool forks, read in the child.
_FORKED: LayoutSearch | None = None


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
    pool = Finalists(search, jobs, workers)
    try:
        return pool.tune()
    finally:
        pool.close()


Guess = Callable[[list[Tuned]], "TuneJob | None"]


class Finalists:
    """The finalists' tunings on forked workers (one process a job), and beside them the
    search's last tuning, the polish of the winner's layout (`search.py`), started early on a
    guess: whenever a worker would idle (no finalist left to start), `guess` names the polish
    that the finalists tuned so far make likely, and the worker starts it; a guess a later
    finalist overturns is ended. `polished(job)` gives the guess's result only where the
    polish the search then asks for is that very job: the answer is the one without guesses.
    `cpu`: every job's CPU seconds, in the order the workers took them."""

    def __init__(self, search: LayoutSearch, jobs: list[TuneJob], workers: int):
        self.search, self.jobs = search, jobs
        self.workers = min(workers, len(jobs)) if can_fork() else 1
        self.taken: list[object] = []  # the jobs' keys in the order the workers took them
        self.cpu_of: dict[object, float] = {}
        self.running: dict[object, _Forked] = {}  # by key: a finalist's index, or "guess"
        self.guessed: TuneJob | None = None  # the polish guessed, running or done
        self.guess_done: Tuned | None = None

    def tune(self, guess: Guess | None = None) -> list[Tuned]:
        """Every finalist's tuning, in the jobs' order (here, one after the other, with one
        worker or none to fork)."""
        if self.workers <= 1:
            done = [tune_one(self.search, job) for job in self.jobs]
            self.taken = list(range(len(done)))
            self.cpu_of = {i: cpu for i, (*_, cpu) in enumerate(done)}
            return done
        global _FORKED
        _FORKED = self.search
        queue = list(enumerate(self.jobs))
        done_at: dict[int, Tuned] = {}
        while queue or len(done_at) < len(self.jobs):
            while queue and len(self.running) < self.workers:
                i, job = queue.pop(0)
                self._start(i, job)
            if guess is not None and not queue:
                self._guess(guess([done_at[i] for i in sorted(done_at)]))
            for key in _wait(self.running):
                if key == "guess":  # done before the finalists: kept for `polished`
                    self.guess_done = self.running.pop(key).get()
                    continue
                done_at[key] = self.running.pop(key).get()
                self.cpu_of[key] = done_at[key][3]
        return [done_at[i] for i in range(len(self.jobs))]

    def polished(self, job: TuneJob) -> Tuned | None:
        """The guessed polish's result if `job` is the guess (same start, same work), else
        None, the guess ended."""
        if self.guessed is None or not _same(self.guessed, job):
            self._guess(None)
            return None
        done = self.guess_done or self.running.pop("guess").get()
        self.guessed = self.guess_done = None
        self.cpu_of["guess"] = done[3]
        return done

    @property
    def cpu(self) -> list[float]:
        """Each tuning's CPU seconds, in the order the workers took them (a guess ended as
        wasted left out)."""
        return [self.cpu_of[k] for k in self.taken if k in self.cpu_of]

    def _start(self, key: object, job: TuneJob) -> None:
        self.running[key] = _Forked(job)
        self.taken.append(key)

    def _guess(self, job: TuneJob | None) -> None:
        """Make `job` the running guess (None: none), ending another; it starts only on a
        worker that would idle."""
        if self.guessed is not None and job is not None and _same(self.guessed, job):
            return
        if self.guessed is not None:
            if "guess" in self.running:
                self.running.pop("guess").end()
            self.taken.remove("guess")
            self.guessed = self.guess_done = None
        if job is not None and len(self.running) < self.workers:
            self._start("guess", job)
            self.guessed = job

    def close(self) -> None:
        """End every worker (a guess not taken among them): none outlives the search."""
        global _FORKED
        for forked in self.running.values():
            forked.end()
        self.running.clear()
        self.guessed = self.guess_done = None
        _FORKED = None


def _same(a: TuneJob, b: TuneJob) -> bool:
    """Whether two tunings do the same work (their time budgets, a safety cap, aside)."""
    return a.start is b.start and (a.evaluations, a.seed, a.max_chunks, a.actions) == (
        b.evaluations,
        b.seed,
        b.max_chunks,
        b.actions,
    )


class _Forked:
    """One job's tuning in a forked process, its result sent back through a pipe."""

    def __init__(self, job: TuneJob):
        context = multiprocessing.get_context("fork")
        self.receive, send = context.Pipe(duplex=False)
        self.process = context.Process(target=_tune_forked, args=(job, send), daemon=True)
        self.process.start()
        send.close()

    def get(self) -> Tuned:
        try:
            ok, out = self.receive.recv()
        except EOFError:
            ok, out = False, RuntimeError(f"a tuning worker died (exit {self.process.exitcode})")
        self.end()
        if not ok:
            raise out
        return out

    def end(self) -> None:
        if self.process.is_alive():
            self.process.terminate()
        self.process.join()
        self.receive.close()


def _wait(running: dict[object, _Forked]) -> list[object]:
    """The keys of the jobs that have finished, once one has."""
    ready = set(multiprocessing.connection.wait([f.receive for f in running.values()]))
    return [key for key, f in running.items() if f.receive in ready]


def _tune_forked(job: TuneJob, send) -> None:
    assert _FORKED is not None, "a worker forked without its search"
    try:
        out = (True, tune_one(_FORKED, job))
    except BaseException as e:  # the search raises it: one line where it is an InputError
        out = (False, e)
    try:
        send.send(out)
    except Exception as e:  # an exception that does not pickle
        send.send((False, RuntimeError(f"a tuning worker failed: {e!r}")))
    send.close()


def tune_one(search: LayoutSearch, job: TuneJob) -> Tuned:
    """The job's tuning here, with its CPU seconds."""
    began = time.process_time()
    more = {} if job.actions is None else {"actions": job.actions}
    row, spent, cut = search.tune(
        job.start, job.evaluations, job.time_budget, job.seed, job.max_chunks, **more
    )
    return row, spent, cut, time.process_time() - began
