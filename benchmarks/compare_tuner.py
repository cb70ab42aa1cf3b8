"""Tuned and best-baseline iteration times of this checkout beside another commit's, to six digits.

    .venv/bin/python benchmarks/compare_tuner.py 7e6885c            # every case, ~10 minutes
    .venv/bin/python benchmarks/compare_tuner.py 7e6885c --only zoo
    .venv/bin/python benchmarks/compare_tuner.py 7e6885c --balanced   # the balanced baselines
    .venv/bin/python benchmarks/compare_tuner.py REV --only zoo --overlap-steps --evaluations 900

For a change that must leave the tuner's results as they were (a refactor, a new partitioner):
the cases are `bench_tuner.py`'s zoo, its memory-tight case, its scaling cases and its shipped
full-size models, each tuned to convergence (no time budget) with every baseline, as
`octopipe plan` does. The other commit is checked out in a temporary worktree and each case runs
there (its own code and its own `bench_tuner.py` cases), then here. Simulated times only:
deterministic, whatever the machine's load. `--balanced` compares every balanced baseline of
the zoo and scaling cases instead (no tuning, seconds), listing those that changed.
`--overlap-steps` tunes for steps back to back (steady step times), each case bounded by
`--evaluations` (the tuner's `max_evaluations`: the same work on any machine, so the comparison
stays deterministic where the search would not converge in minutes).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]

# Runs inside one checkout (argv[1]); prints "label<TAB>tuned<TAB>best fitting baseline".
CHILD = """
import math, sys
tree, only, balanced = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
overlap, evaluations = sys.argv[4] == "1", int(sys.argv[5]) or None
sys.path[:0] = [tree + "/src", tree + "/benchmarks"]
import bench_tuner as bt
from octopipe.baselines import all_baselines
try:
    from octopipe.tuner import tune
except ImportError:  # before the tuner package was renamed
    from octopipe.tune import tune
groups = {
    "zoo": [*bt.ZOO, bt.NO_BASELINE_FITS],
    "scaling": list(bt.SCALING),
    "shipped": [c for c in bt.shipped_cases() if not c.model.startswith("tiny") and c.devices <= 8],
}
for name, cases in groups.items():
    if only not in ("all", name):
        continue
    for case in cases:
        profile = bt.profile_for(case)
        base = all_baselines(profile, case.devices, case.microbatches)
        if balanced:
            for label, plan in base:
                if label.endswith("/balanced") and name != "shipped":
                    fits = "fits" if plan.predicted["fits"] else "over memory"
                    t = plan.predicted["iteration_time"]
                    print(f"{case.label}: {label} ({fits})\t{t:.6f}\tnan", flush=True)
            continue
        M, P = case.microbatches, case.devices
        result = tune(
            profile, M, P, baselines=base, time_budget=math.inf, overlap_steps=overlap,
            max_evaluations=evaluations,
        )
        fitting = [b.sim.iteration_time for b in result.baselines if b.sim.fits]
        best = min(fitting) if fitting else float("nan")
        print(f"{case.label}\\t{result.best.sim.iteration_time:.6f}\\t{best:.6f}", flush=True)
"""


def times(
    tree: Path, only: str, balanced: bool, overlap: bool = False, evaluations: int = 0
) -> list[tuple[str, float, float]]:
    flags = ["1" if balanced else "0", "1" if overlap else "0", str(evaluations)]
    argv = [sys.executable, "-c", CHILD, str(tree), only, *flags]
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    rows = []
    for line in done.stdout.splitlines():
        label, tuned, best = line.split("\t")
        rows.append((label, float(tuned), float(best)))
    return rows


def change(before: float, after: float) -> str:
    if before != before or after != after:  # NaN: no baseline fits
        return "-"
    return "same" if after == before else f"{100 * (after / before - 1):+.2f}%"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rev", help="the commit to compare with")
    ap.add_argument("--only", choices=("all", "zoo", "scaling", "shipped"), default="all")
    ap.add_argument(
        "--balanced", action="store_true", help="every balanced baseline that changed, instead"
    )
    ap.add_argument("--overlap-steps", action="store_true", help="tune for steady step times")
    ap.add_argument(
        "--evaluations", type=int, default=0, help="the tuner's max_evaluations (0: no bound)"
    )
    args = ap.parse_args()
    tuning = (args.overlap_steps, args.evaluations)
    with tempfile.TemporaryDirectory() as tree:
        git = ["git", "-C", str(HERE), "worktree"]
        subprocess.run([*git, "add", "--detach", tree, args.rev], check=True, capture_output=True)
        try:
            before = times(Path(tree), args.only, args.balanced, *tuning)
        finally:
            subprocess.run([*git, "remove", "--force", tree], capture_output=True)
    after = {label: (t, b) for label, t, b in times(HERE, args.only, args.balanced, *tuning)}
    rev = args.rev
    if args.balanced:
        print(f"| baseline | simulated s: {rev} | now | change |")
        print("|---|---:|---:|---|")
        for label, t0, _ in before:
            t1 = after.get(label, (float("nan"),))[0]
            if t1 != t0:
                print(f"| {label} | {t0:.6f} | {t1:.6f} | {change(t0, t1)} |")
        return
    print(f"| case | tuned s: {rev} | now | change | best baseline s: {rev} | now | change |")
    print("|---|---:|---:|---|---:|---:|---|")
    for label, tuned, best in before:
        t, b = after.get(label, (float("nan"), float("nan")))
        print(
            f"| {label} | {tuned:.6f} | {t:.6f} | {change(tuned, t)} "
            f"| {best:.6f} | {b:.6f} | {change(best, b)} |"
        )


if __name__ == "__main__":
    main()
