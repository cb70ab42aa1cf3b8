"""Start-up cost of the light commands: whole processes, and which heavy modules they load.

    .venv/bin/python benchmarks/bench_startup.py                     # this checkout
    .venv/bin/python benchmarks/bench_startup.py --against 7e6885c   # beside an older commit

Each command runs as its own `python -m octopipe ...` process on small inputs written to a
temporary folder (a two-device profile of tiny-llama from the cost model and a 1F1B plan). The
table gives the fastest and the median wall time of `--runs` runs and whether torch or
matplotlib was imported (read from `python -X importtime`, a separate run). With `--against`,
that commit is checked out in a temporary worktree and each command runs there and here in
turn, so both columns see the same machine load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEAVY = ("torch", "matplotlib")
HERE = Path(__file__).resolve().parents[1]


def commands(tmp: Path) -> list[tuple[str, list[str]]]:
    profile, plan = str(tmp / "p.json"), str(tmp / "b.json")
    plan_args = ["plan", "--profile", profile, "--microbatches", "4", "--time-budget", "1"]
    return [
        ("--help", ["--help"]),
        ("profile-arch", ["profile-arch", "tiny-llama", "--devices", "2", "-o", profile]),
        (
            "baseline",
            ["baseline", "--profile", profile, "--schedule", "1f1b", "--partition", "uniform"]
            + ["--microbatches", "4", "-o", plan],
        ),
        ("simulate", ["simulate", "--profile", profile, "--plan", plan, "--json"]),
        ("plan (pictures)", [*plan_args, "--quiet", "-o", str(tmp / "out")]),
        ("plan --no-png", [*plan_args, "--quiet", "--no-png", "-o", str(tmp / "out2")]),
    ]


def _env(src: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(src)}


def heavy_imports(argv: list[str], src: Path) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "octopipe", *argv],
        capture_output=True,
        text=True,
        env=_env(src),
    )
    loaded = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if "|" in line}
    return [m for m in HEAVY if m in loaded]


def wall_time(argv: list[str], src: Path) -> float | None:
    """Seconds of one run; None when this checkout does not know the command."""
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "octopipe", *argv], capture_output=True, env=_env(src)
    )
    return time.perf_counter() - t0 if done.returncode == 0 else None


def measure(sources: list[Path], runs: int) -> list[tuple[str, list[tuple | None]]]:
    """Per command, per source: (fastest, median, heavy modules), or None where it fails."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, argv in commands(Path(tmp)):
            times: list[list[float | None]] = [[] for _ in sources]
            for _ in range(runs):
                for i, src in enumerate(sources):  # alternate: both see the same load
                    times[i].append(wall_time(argv, src))
            cells = []
            for src, ts in zip(sources, times):
                if None in ts:
                    cells.append(None)
                    continue
                cells.append((min(ts), statistics.median(ts), heavy_imports(argv, src)))
            rows.append((label, cells))
    return rows


def _cell(cell: tuple | None) -> list[str]:
    if cell is None:
        return ["-", "-", "(no such command)"]
    fastest, median, heavy = cell
    return [f"{fastest:.2f}", f"{median:.2f}", ", ".join(heavy) or "neither"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="runs per command (default 5)")
    ap.add_argument("--against", metavar="REV", help="also time this commit, side by side")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tree:
        sources = [HERE / "src"]
        heads = ["fastest s", "median s", "torch / matplotlib"]
        if args.against:
            subprocess.run(
                ["git", "-C", str(HERE), "worktree", "add", "--detach", tree, args.against],
                check=True,
                capture_output=True,
            )
            sources.insert(0, Path(tree) / "src")
        try:
            rows = measure(sources, args.runs)
        finally:
            if args.against:
                subprocess.run(
                    ["git", "-C", str(HERE), "worktree", "remove", "--force", tree],
                    capture_output=True,
                )
    if args.against:
        header = [f"{args.against}: {h}" for h in heads] + [f"now: {h}" for h in heads]
    else:
        header = heads
    print(f"| command ({args.runs} runs each) | " + " | ".join(header) + " |")
    print("|---|" + "---:|---:|---|" * len(sources))
    for label, cells in rows:
        print(f"| `octopipe {label}` | " + " | ".join(c for x in cells for c in _cell(x)) + " |")


if __name__ == "__main__":
    main()
