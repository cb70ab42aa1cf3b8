"""Where the layout search of `plan --gpus` stands: its counts, its safety cap in seconds, and
what it tells a progress line (`SearchProgress`) and the report's notes.

The search's work is counted (layouts screened, evaluations, simulated actions), so its answer
does not hang on the machine; the seconds here only cap it and estimate what is left.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class SearchProgress:
    """One moment of the search, as a progress line shows it."""

    phase: str  # "references", "screening", "tuning"
    doing: str  # the layout being planned, in words
    screened: int  # layouts screened so far
    to_screen: int  # layouts left whose bound could still beat the best step (at most)
    tuned: int  # layouts tuned so far
    to_tune: int  # finalists in all
    best_step: float | None  # the best step found so far (s), fitting plans only
    elapsed: float
    left: float | None  # seconds left, estimated from the pace so far (None: not yet known)


Progress = Callable[[SearchProgress], None]


class Work:
    """The search's counts and pace, its safety cap in seconds, and what cut it short."""

    def __init__(self, budget: float, progress: Progress | None, finalists: int):
        self.started, self.budget, self.progress = time.perf_counter(), budget, progress
        self.evaluations = 0  # simulated baselines and the tuner's evaluations
        self.actions = 0  # the actions screening simulated
        self.screened = self.tuned = 0
        self.to_screen, self.to_tune = 0, finalists
        self.screen_seconds = self.tune_seconds = 0.0
        self.cut_by_time = False
        self.notes: list[str] = []

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def left(self) -> float:
        return max(0.0, self.budget - self.elapsed())

    def out_of_time(self) -> bool:
        if self.left() <= 0:
            if not self.cut_by_time:
                self.notes.append(
                    f"the --time-budget of {self.budget:g} s cut the search: the answer may "
                    "differ on a faster machine"
                )
            self.cut_by_time = True
        return self.cut_by_time

    def did_screen(self, simulations: int, actions: int, seconds: float) -> None:
        self.screened += 1
        self.evaluations += simulations
        self.actions += actions
        self.screen_seconds += seconds

    def did_tune(self, evaluations: int, cut: bool, seconds: float) -> None:
        self.tuned += 1
        self.evaluations += evaluations
        self.tune_seconds += seconds
        if cut:
            self.out_of_time()  # the tuner found the seconds gone: say so once
            self.cut_by_time = True

    def capped(self, screened: int, by_count: bool, at_most: float | None = None) -> None:
        """The screening stopped at its work bound (`by_count`) or the time budget. `at_most`:
        how much faster than the answer a layout left out could be (its step bound's share)."""
        if not by_count:
            return
        missed = (
            "a layout left out could be faster than the answer, by an unknown share (none fit)"
            if at_most is None
            else f"none left out is more than {at_most:.1%} faster than the answer (their "
            "step bounds)"
        )
        self.notes.append(
            f"screened the {screened} layouts of best bound (the screening's work bound); "
            f"the rest were left out: {missed}"
        )

    def estimate_left(self) -> float | None:
        """Seconds left at the pace so far: the layouts still to screen at the screening's
        pace, the finalists still to tune at the tuning's (or, before any, at ten screenings'
        pace each: a tuning does some hundred simulations)."""
        if not self.screened:
            return None
        per_screen = self.screen_seconds / self.screened
        per_tune = self.tune_seconds / self.tuned if self.tuned else 10 * per_screen
        left = self.to_screen * per_screen + max(0, self.to_tune - self.tuned) * per_tune
        return min(left, self.left())

    def say(self, phase: str, doing: str, best_step: float | None) -> None:
        if self.progress is None:
            return
        self.progress(
            SearchProgress(
                phase=phase,
                doing=doing,
                screened=self.screened,
                to_screen=self.to_screen,
                tuned=self.tuned,
                to_tune=self.to_tune,
                best_step=best_step,
                elapsed=self.elapsed(),
                left=self.estimate_left(),
            )
        )
