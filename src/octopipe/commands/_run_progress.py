"""What `octopipe run` shows while it trains, one call per finished step (on the process that
speaks for the run: the launcher, or rank 0 under torchrun).

With `--json`, each step is one JSON line on stdout as it finishes (the summary stays the last
line). On stderr: a progress bar (step, loss, tokens/s) when stderr is a terminal, else one
plain line per step, which logs keep.
"""

from __future__ import annotations

import sys
from typing import Any

from octopipe.jsonfile import dumps


class RunProgress:
    """A context around the run; called with each step's `StepReport`."""

    def __init__(self, total_steps: int, json_lines: bool) -> None:
        self.total, self.json_lines = total_steps, json_lines
        self._bar: Any = None  # rich's Progress, started at the first step (rank 0 only)
        self._task: Any = None

    def __enter__(self) -> RunProgress:
        return self

    def __exit__(self, *_exc) -> None:
        if self._bar is not None:
            self._bar.stop()

    def __call__(self, report) -> None:
        if self.json_lines:
            print(dumps(report.as_json()), flush=True)
        done = report.step + 1
        speed = f"{report.tokens_per_second:,.0f}"
        if not sys.stderr.isatty():
            print(
                f"step {done}/{self.total}: loss {report.loss:.6g}, "
                f"{report.step_time * 1e3:.1f} ms, {speed} tokens/s",
                file=sys.stderr,
                flush=True,
            )
            return
        if self._bar is None:
            self._start_bar()
        self._bar.update(self._task, completed=done, loss=f"{report.loss:.4g}", speed=speed)

    def _start_bar(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self._bar = Progress(
            TextColumn("[bold]training[/] step"),
            MofNCompleteColumn(),
            BarColumn(),
            TextColumn("loss {task.fields[loss]}, {task.fields[speed]} tokens/s"),
            console=Console(stderr=True),
            transient=True,
            # JSON lines on a terminal go above the bar; piped, stdout is left alone.
            redirect_stdout=sys.stdout.isatty(),
        )
        self._bar.start()
        self._task = self._bar.add_task("", total=self.total, loss="-", speed="-")
