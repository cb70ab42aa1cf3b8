"""A run's logs (`octopipe run --log-dir DIR`): every step's report as a JSON line in
`DIR/log.jsonl` (the `--json` step lines; appended to, so a resumed run continues the file),
and as TensorBoard scalars in event files in DIR, through `torch.utils.tensorboard` (which
needs the `tensorboard` package, the `[logs]` extra; without it, the JSON lines only).

Scalars, by the step (from 0): `train/loss`, `train/lr`, `train/grad_norm`,
`train/step_time`, `train/tokens_per_second`, `train/model_tflops_per_rank`, `train/mfu`,
`memory/peak_bytes`, `val/loss`, `val/perplexity`; those unknown for a run are left out.
"""

from __future__ import annotations

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

    def _open(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        refuse_not_regular(self.folder / LOG, "--log-dir")  # appending to a FIFO would block
        self._lines = (self.folder / LOG).open("a", encoding="utf-8")
        if tensorboard_available():
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(str(self.folder), flush_secs=10)

    def __call__(self, report) -> None:
        from octopipe.runtime.job.progress import StepReport

        if not isinstance(report, StepReport):
            return
        if self._lines is None:
            self._open()
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
