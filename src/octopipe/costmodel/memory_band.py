"""The memory model's measured error: each rank's high-water mark in `octopipe run`, counted
from its tensors, against the plan's peak for its device (`measurements/high_water.json`,
written by `benchmarks/bench_high_water.py --write`: every schedule, recomputation, `--bf16`,
TP and ZeRO).

    band = memory_band()
    band.describe()   # "each rank's measured high-water mark within X% ... over N runs ..."

`octopipe estimate` prints it under its memory; the margin a plan keeps free is
`--memory-headroom` (5% by default), which the runs that meet the model stay within.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

HIGH_WATER = Path(__file__).parent / "measurements" / "high_water.json"


@dataclass(frozen=True)
class MemoryBand:
    rows: int
    mean: float  # mean |measured / predicted - 1| of the runs' worst ranks
    worst: float
    worst_run: str
    beyond: tuple[str, ...]  # the runs whose worst rank is off by more than `limit`
    limit: float

    def describe(self) -> str:
        if not self.rows:
            return "not measured yet (benchmarks/bench_high_water.py --write)"
        text = (
            f"each rank's measured high-water mark within {self.mean:.1%} of the plan's peak on "
            f"average (worst {self.worst:.1%}: {self.worst_run}) over {self.rows} runs of "
            "octopipe run"
        )
        if self.beyond:
            text += f"; beyond {self.limit:.0%}: {', '.join(self.beyond)}"
        return text

    def summary(self) -> dict:
        return {
            "runs": self.rows,
            "mean_abs_error": self.mean,
            "worst_abs_error": self.worst,
            "beyond": list(self.beyond),
        }


@cache
def memory_band(path: Path = HIGH_WATER, limit: float = 0.05) -> MemoryBand:
    rows = json.loads(path.read_text())["rows"] if path.is_file() else []
    if not rows:
        return MemoryBand(0, 0.0, 0.0, "", (), limit)
    errors = [abs(r["worst_rank_error"]) for r in rows]
    worst = max(range(len(rows)), key=errors.__getitem__)
    beyond = tuple(r["run"] for r, e in zip(rows, errors) if e > limit)
    mean = sum(errors) / len(errors)
    return MemoryBand(len(rows), mean, errors[worst], rows[worst]["run"], beyond, limit)
