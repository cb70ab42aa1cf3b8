"""A run's logs (`octopipe run --log-dir DIR`): every step's report as a JSON line in
`DIR/log.jsonl` (the `--json` step lines), and as TensorBoard scalars in event files in DIR,
through `torch.utils.tensorboard` (which needs the `tensorboard` package, the `[logs]` extra;
without it, the JSON lines only).

Each step is logged once. A run that starts at step K + 1 (resumed from `step-K`, or K = 0)
continues the folder: what it held from step K + 1 on (a run that went past its last
checkpoint before it stopped) is what this run replaces. `log.jsonl` keeps only its lines of
earlier steps (rewritten whole, then appended to); the TensorBoard writer is opened with
`purge_step=K + 1`, so TensorBoard discards the older event files' scalars from that step on.

Scalars, by the step (from 1, as the console's): `train/loss`, `train/lr`, `train/grad_norm`,
`train/step_time`, `train/tokens_per_second`, `train/model_tflops_per_rank`, `train/mfu`,
`memory/peak_bytes`, `val/loss`, `val/perplexity`; those unknown for a run are left out.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from octopipe.jsonfile import dumps
from octopipe.outfiles import refuse_not_regular

LOG = "log.jsonl"


def tensorboard_available() -> bool:
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return False
    return True


class RunLogs:
    """Called with each report (notes are not logged); `close` when the run ends. The folder
    and files are made at the first step, so a run refused before it trains leaves none."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self._lines: Any = None
        self._writer: Any = None

    def _open(self, first_step: int) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        log = self.folder / LOG
        refuse_not_regular(log, "--log-dir")  # appending to a FIFO would block
        if log.exists():
            _keep_before(log, first_step)
        self._lines = log.open("a", encoding="utf-8")
        if tensorboard_available():
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(str(self.folder), flush_secs=10, purge_step=first_step)

    def __call__(self, report) -> None:
        from octopipe.runtime.job.progress import StepReport

        if not isinstance(report, StepReport):
            return
        if self._lines is None:
            self._open(report.step)
        self._lines.write(dumps(report.as_json()) + "\n")
        self._lines.flush()
        if self._writer is None:
            return
        for tag, value in (
            ("train/loss", report.loss),
            ("train/lr", report.lr),
            ("train/grad_norm", report.grad_norm),
            ("train/step_time", report.step_time),
            ("train/tokens_per_second", report.tokens_per_second),
            ("train/model_tflops_per_rank", report.tflops_per_rank),
            ("train/mfu", report.mfu),
            ("memory/peak_bytes", report.peak_memory_bytes),
            ("val/loss", report.val_loss),
            ("val/perplexity", report.perplexity),
        ):
            if value is not None:
                self._writer.add_scalar(tag, value, report.step)

    def close(self) -> None:
        if self._lines is not None:
            self._lines.close()
        if self._writer is not None:
            self._writer.close()

    def __enter__(self) -> RunLogs:
        return self

    def __exit__(self, *_exc) -> None:
        self.close()


def _keep_before(log: Path, first_step: int) -> None:
    """Keep the lines of `log` for steps before `first_step`, streamed into a file beside it
    that replaces it. A line that is not a step's (one cut short by a killed run) goes too."""
    partial = log.with_name(f".{log.name}.partial")
    try:
        with log.open(encoding="utf-8", errors="replace") as lines, partial.open("w") as kept:
            for line in lines:
                if _step_of(line) < first_step:
                    kept.write(line if line.endswith("\n") else line + "\n")
        os.replace(partial, log)
    finally:
        partial.unlink(missing_ok=True)


def _step_of(line: str) -> float:
    """A log line's step; infinity for a line that is not a step's."""
    try:
        step = json.loads(line).get("step")
    except (ValueError, AttributeError):
        return math.inf
    return step if isinstance(step, int) else math.inf
