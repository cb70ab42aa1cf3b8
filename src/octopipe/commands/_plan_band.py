"""The error band of `plan --gpus`: each row's held-out error on published runs like it (the
lookup `estimate` uses: `costmodel/error_band.py`), and the one line saying when the answer's
predicted gain over its reference rows is within that error."""

from __future__ import annotations

from functools import cache

from octopipe.costmodel.error_band import ErrorBand
from octopipe.layouts import Job, LayoutReport, Row
from octopipe.layouts.estimate import band_of


@cache
def _is_moe(config: str) -> bool:
    from octopipe.costmodel.hf_config import load_architecture

    return load_architecture(config).moe is not None


def row_band(row: Row, job: Job) -> ErrorBand:
    """The held-out error of published runs like this row, as `estimate` gives it."""
    return band_of(job, row.layout, _is_moe(job.config))


def band_cell(band: ErrorBand) -> str:
    """The table's `error` column: the band's mean held-out error."""
    return f"±{band.mean:.0%}" if band.rows else "-"


def within_error_line(result: LayoutReport) -> str | None:
    """One line when the answer's predicted gain over best_standard or the recipe is within
    the model's mean held-out error on runs like the answer: the prediction cannot tell them
    apart, so both are worth a run; or when `--layout`'s answer is slower than them beyond it."""
    best, job = result.best, result.job
    band = row_band(best, job)
    if not band.rows or not best.sim.fits:
        return None
    close, faster = [], []
    for name, row in (("best_standard", result.best_standard), ("recipe", result.recipe)):
        if row is None or row is best or not row.sim.fits:
            continue
        if row.layout == best.layout and row.plan == best.plan and row.tail == best.tail:
            continue  # the answer itself, under another name
        gain = row.step_time / best.step_time - 1
        if abs(gain) < 0.0005:  # "by 0.0%": the same step, whatever the plans' names
            continue
        if gain < -band.mean:  # only `--layout`'s answer can be slower than a reference
            faster.append(f"{name} by {-gain:.1%}")
        elif gain < 0:
            close.append(f"is beaten by {name} by {-gain:.1%}")
        elif gain <= band.mean:
            close.append(f"beats {name} by {gain:.1%}")
    if faster:
        return f"beyond the model's error: the given layout is slower than {' and '.join(faster)}"
    if not close:
        return None
    return (
        f"within the model's error: try both (the answer {' and '.join(close)}; {band.describe()})"
    )
