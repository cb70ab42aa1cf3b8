"""The model's error on published runs like a given one: the held-out predicted / published
ratios of the H100 record (`measurements/fidelity.json`, written by
`benchmarks/bench_fidelity.py --record --write-band`: each row predicted with the constants
fitted without its source).

    band = error_band("h100", "fp8", {"tp", "pp"}, moe=False)
    band.describe()     # 'within 9.1% (worst 17.0%) on 6 held-out published runs like it ...'

"Like it": the same model kind (dense or MoE) first, on the same GPU (on every GPU where that
has too few), then the same precision, then the most parallelism kinds in common (TP, CP, PP,
EP, FSDP); at least `MIN_ROWS` rows are taken at each narrowing. Both `octopipe estimate` and
the layout search can attach it to a prediction.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

FIDELITY = Path(__file__).parent / "measurements" / "fidelity.json"
MIN_ROWS = 3
KINDS = ("tp", "cp", "pp", "ep", "fsdp")


@dataclass(frozen=True)
class ErrorBand:
    rows: int
    mean: float
    """Mean |predicted / published - 1| of the rows."""
    worst: float
    like: str
    """What the rows share with the prediction."""
    worst_run: str = ""
    """The row of the worst error: its run, source and predicted / published ratio."""

    def describe(self) -> str:
        if not self.rows:
            return f"no held-out published runs, {self.like}"
        worst = f": {self.worst_run}" if self.worst_run else ""
        return (
            f"within {self.mean:.1%} on average (worst {self.worst:.1%}{worst}) on "
            f"{self.rows} held-out published runs, {self.like}"
        )

    def summary(self) -> dict:
        return {"rows": self.rows, "mean_abs_error": self.mean, "worst_abs_error": self.worst}


@cache
def _rows(path: Path = FIDELITY) -> tuple[dict, ...]:
    if not path.is_file():
        return ()
    return tuple(json.loads(path.read_text())["rows"])


def layout_kinds(tp: int, cp: int, pp: int, ep: int, zero: int) -> frozenset[str]:
    """The parallelism kinds a layout uses, as the record's rows name them."""
    used = {"tp": tp > 1, "cp": cp > 1, "pp": pp > 1, "ep": ep > 1, "fsdp": zero == 3}
    return frozenset(k for k, on in used.items() if on)


def error_band(hardware: str, precision: str, kinds: frozenset[str], moe: bool) -> ErrorBand:
    """The held-out error of published runs like a prediction's: of its model kind (dense or
    MoE: their errors differ several times over) on its GPU, or on every GPU where its GPU has
    too few; then of its precision and the most parallelism kinds in common, where enough
    rows remain."""
    rows = [r for r in _rows() if not r.get("variant")]
    kind = "MoE" if moe else "dense"
    chosen = [r for r in rows if r["moe"] == moe]
    same_gpu = [r for r in chosen if r["hardware"] == hardware]
    if len(same_gpu) >= MIN_ROWS:
        chosen, like = same_gpu, f"{kind} on {hardware}"
    elif len(chosen) >= MIN_ROWS:
        like = f"{kind} on any GPU ({len(same_gpu)} on {hardware})"
    else:
        return ErrorBand(0, 0.0, 0.0, f"{kind} on {hardware}")
    subset = [r for r in chosen if r["precision"] == precision]
    if len(subset) >= MIN_ROWS:
        chosen, like = subset, f"{like}, {precision}"
    shared = sorted(chosen, key=lambda r: -len(kinds & set(r["kinds"])))
    best = len(kinds & set(shared[0]["kinds"])) if shared else 0
    closest = [r for r in shared if len(kinds & set(r["kinds"])) == best]
    if len(closest) >= MIN_ROWS and best:
        chosen = closest
        like += f", sharing {best} of its parallelism kinds"
    errors = [abs(r["ratio"] - 1) for r in chosen]
    worst = max(chosen, key=lambda r: abs(r["ratio"] - 1))
    worst_run = f"{worst['run']} ({worst['source']}), predicted {worst['ratio']:.2f}x published"
    return ErrorBand(len(errors), sum(errors) / len(errors), max(errors), like, worst_run)
