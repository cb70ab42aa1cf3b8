"""What `octopipe run` shows while it trains (on the process that speaks for the run: the
launcher, or rank 0 under torchrun): every note and every step as one line on stderr, and,
when stderr is a terminal, a progress bar below the lines.

A step's line, its JSON line (`--json`, on stdout) and its log number it alike, from 1 (step N
of M: N steps done after it, so the checkpoint saved after it is `step-N`); the bar counts
the steps done. Notes (start-up stages, checkpoints saved and resumed) carry the seconds since
the run began; a passing one (what is under way before the processes start) shows in the bar
only, so that a run refused meanwhile prints its one error line and nothing else. A warning
from the ranks is a line of its own, `octopipe run: warning: ...`.

`notes`, what the command knows of the run before it starts (what a step is, the device the
plan was priced for), and the warnings of its checks that are about what it will do (`warn_later`:
a checkpoint resumed unverified) wait for the first line the run prints (the processes
starting, or the first step), so that they come before every step but never before a refusal.

The time left (the line's `ETA`, the bar's last column) is paced by the steps this process has
seen since the first one it reported, never by the steps a resumed checkpoint had done: it
says "estimating" until two steps were reported.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from octopipe.jsonfile import dumps
from octopipe.units import fmt_bytes, fmt_eta


class RunProgress:
    """A context around the run; called with each `StepReport` and `RunNote`."""

    def __init__(
        self, total_steps: int, json_lines: bool, also=None, notes: tuple[str, ...] = ()
    ) -> None:
        """`also`: called with every report too (the run's logs). `notes`: lines printed
        before the run's first (module docstring)."""
        self.total, self.json_lines, self.also = total_steps, json_lines, also
        self._held = [f"octopipe run: note: {note}" for note in notes]
        self._started = time.perf_counter()
        self._bar: Any = None  # rich's Progress, on a terminal only, from the first report
        self._task: Any = None
        self._first: tuple[int, float] | None = None  # the first step reported, and when
        self._step_time_sum = 0.0  # the measured times of the steps reported after it

    def __enter__(self) -> RunProgress:
        return self

    def __exit__(self, *_exc) -> None:
        if self._bar is not None:
            self._bar.stop()

    def __call__(self, report) -> None:
        from octopipe.runtime.job.progress import RunNote

        # A step's arrival, before the logs take it (opening them at the first step can take
        # seconds, while the next steps' reports queue up behind it).
        arrived = None if isinstance(report, RunNote) else time.perf_counter()
        if self.also is not None:
            self.also(report)
        if isinstance(report, RunNote):
            if report.passing:
                self._under_way(report.text)
            elif report.warning:
                self._line(f"octopipe run: warning: {report.text}")
            else:
                self._line(f"[{time.perf_counter() - self._started:.1f} s] {report.text}")
            return
        if self.json_lines:
            self._flush_notes()  # before the step's JSON line, as before its console line
            print(dumps(report.as_json()), flush=True)
        time_left = self._time_left(report, arrived)
        self._line(step_line(report, self.total, time_left))
        if report.val_loss is not None:
            self._line(evaluation_line(report))
        if self._bar is not None:
            speed = f"{report.tokens_per_second:,.0f}"
            self._bar.update(
                self._task,
                completed=report.step,
                doing=f"loss {report.loss:.4g}, {speed} tokens/s",
                left=_bar_eta(time_left, report.step >= self.total),
            )

    def warn_later(self, text: str) -> None:
        """A warning of the checks before the start, said with the notes: only if the run
        passes them (a refused run's error stays its one line)."""
        self._held.append(f"octopipe run: warning: {text}")

    def _flush_notes(self) -> None:
        held, self._held = self._held, []
        for line in held:
            self._line(line)

    def _time_left(self, report, now: float) -> float | None:
        """Seconds to the last step at the pace of the steps this process has seen after the
        first one it reported (which carries the start-up's warm-up, and follows a resumed
        checkpoint's steps): their wall-clock pace, or their measured step time where that is
        slower (reports that arrive together say nothing of the pace); None before a pace is
        known, or after the last step. `now`: when the report arrived."""
        step = report.step
        if self._first is None:
            self._first = (step, now)
            return None
        first_step, first_time = self._first
        if step <= first_step or step >= self.total:
            return None
        self._step_time_sum += report.step_time
        pace = max((now - first_time), self._step_time_sum) / (step - first_step)
        return pace * (self.total - step)

    def _under_way(self, text: str) -> None:
        if sys.stderr.isatty():
            if self._bar is None:
                self._start_bar()
            self._bar.update(self._task, doing=text)

    def _line(self, text: str) -> None:
        self._flush_notes()
        if not sys.stderr.isatty():
            print(text, file=sys.stderr, flush=True)
            return
        if self._bar is None:
            self._start_bar()
        self._bar.console.print(text, markup=False, highlight=False)  # above the bar

    def _start_bar(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
        )

        self._bar = Progress(
            TextColumn("[bold]steps done[/]"),
            MofNCompleteColumn(),
            BarColumn(),
            TextColumn("{task.fields[doing]}"),
            # the step line's estimate: rich's own paces by the reports' arrival alone, and two
            # that arrive together read as an instant step ("0:00:00" with most of the run to go)
            TextColumn("[cyan]{task.fields[left]}"),
            console=Console(stderr=True),
            transient=True,
            # JSON lines on a terminal go above the bar; piped, stdout is left alone.
            redirect_stdout=sys.stdout.isatty(),
        )
        self._bar.start()
        self._task = self._bar.add_task("", total=self.total, doing="", left="")


def _bar_eta(time_left: float | None, done: bool) -> str:
    if done:
        return ""
    return "ETA estimating" if time_left is None else f"ETA {fmt_eta(time_left)}"


def step_line(report, total_steps: int, time_left: float | None = None) -> str:
    """`step 5/10: loss 5.21, lr 3e-04, grad norm 0.81, 12.3 ms, 5,570 tokens/s, MFU 31.2%`:
    the step's number (from 1) over the run's last; unknown figures left out; `time_left`
    (seconds), the estimate to the last step, as `ETA 3 min 05 s`."""
    parts = [f"loss {report.loss:.6g}"]
    if report.lr is not None:
        parts.append(f"lr {report.lr:.3g}")
    if report.grad_norm is not None:
        parts.append(f"grad norm {report.grad_norm:.4g}")
    parts.append(f"{report.step_time * 1e3:.1f} ms")
    parts.append(f"{report.tokens_per_second:,.0f} tokens/s")
    if report.tflops_per_rank is not None:
        parts.append(f"{report.tflops_per_rank:.3g} TFLOP/s per rank")
    if report.mfu is not None:
        parts.append(f"MFU {100 * report.mfu:.1f}%")
    if report.peak_memory_bytes:
        parts.append(f"peak {fmt_bytes(report.peak_memory_bytes)}")
    if time_left is not None:
        parts.append(f"ETA {fmt_eta(time_left)}")
    return f"step {report.step}/{total_steps}: " + ", ".join(parts)


def evaluation_line(report) -> str:
    ppl = report.perplexity
    shown = f", perplexity {ppl:.4g}" if ppl is not None else ""
    return f"step {report.step}: held-out loss {report.val_loss:.6g}{shown}"
