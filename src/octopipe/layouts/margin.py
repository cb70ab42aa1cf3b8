"""The margin's choice of the answer (docs/LAYOUTS.md, "The margin"): a plan faster by less than
the model's own error is no reason to ride the memory cap. `ClusterSearch.report` asks it once,
with the rows best first; nothing here searches or prices.
"""

from __future__ import annotations

from octopipe.layouts.estimate import band_of
from octopipe.layouts.layout import Job
from octopipe.layouts.planner import Row


def leaner_within_error(
    rows: list[Row], standard: Row | None, job: Job, moe: bool, best_standard: Row | None = None
) -> tuple[list[Row], str | None]:
    """The rows with the answer first: the fastest, unless `standard`, the best standard
    schedule of the same layout, is slower by less than the model's held-out error on runs like
    it and keeps more memory free; then `standard`, or `best_standard` where that is faster
    still and also leaner than the fastest (the answer is then never slower than it), and why
    (docs/LAYOUTS.md, "The margin"). The same layout: the band measures the model's error on a
    run, much of it shared by plans of one layout, and the layout (degrees, order) is what the
    search is for."""
    if not rows or standard is None or not rows[0].sim.fits or not standard.sim.fits:
        return rows, None
    fastest = rows[0]
    if standard is fastest or standard.peak_memory_bytes >= fastest.peak_memory_bytes:
        return rows, None
    band = band_of(job, fastest.layout, moe)
    if not band.rows or standard.step_time / fastest.step_time - 1 > band.mean:
        return rows, None
    chosen = standard
    if (
        best_standard is not None
        and best_standard.sim.fits
        and best_standard.step_time < standard.step_time
        and best_standard.peak_memory_bytes < fastest.peak_memory_bytes
    ):
        chosen = best_standard
    gain = chosen.step_time / fastest.step_time - 1
    freed = (fastest.peak_memory_bytes - chosen.peak_memory_bytes) / 2**30
    why = (
        f"chose {chosen.label} ({chosen.layout.describe()}) over the {fastest.label} plan of "
        f"{fastest.layout.describe()}: that is {gain:.1%} faster, within the model's error on "
        f"runs like it ({band.mean:.1%}), and needs {freed:.1f} GiB more a GPU"
    )
    return [chosen, *(r for r in rows if r is not chosen)], why
