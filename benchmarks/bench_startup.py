"""Start-up cost of the light commands: whole processes, and which heavy modules they load.

    .venv/bin/python benchmarks/bench_startup.py            # markdown table on stdout
    .venv/bin/python benchmarks/bench_startup.py --runs 9

Each command runs as its own `python -m octopipe ...` process on small inputs written to a
temporary folder (a two-device profile of tiny-llama from the cost model and a 1F1B plan). The
table gives the fastest and the median wall time of `--runs` runs and whether torch or
matplotlib was imported (read from `python -X importtime`, a separate run).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEAVY = ("torch", "matplotlib")


def commands(tmp: Path, extra_plan_flags: list[str]) -> list[tuple[str, list[str]]]:
    profile, plan = str(tmp / "p.json"), str(tmp / "b.json")
    return [
        ("--help", ["--help"]),
        (
            "profile-arch",
            ["profile-arch", "tiny-llama", "--hardware", "h100", "--devices", "2", "-o", profile],
        ),
        (
            "baseline",
            [
                "baseline",
                "--profile",
                profile,
                "--schedule",
                "1f1b",
                "--partition",
                "uniform",
                "--microbatches",
                "4",
                "-o",
                plan,
            ],
        ),
        ("simulate", ["simulate", "--profile", profile, "--plan", plan, "--json"]),
        (
            "plan (1 s budget)",
            [
                "plan",
                "--profile",
                profile,
                "--microbatches",
                "4",
                "--time-budget",
                "1",
                "--quiet",
                "-o",
                str(tmp / "out"),
                *extra_plan_flags,
            ],
        ),
    ]


def heavy_imports(argv: list[str]) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "octopipe", *argv],
        capture_output=True,
        text=True,
    )
    loaded = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if "|" in line}
    return [m for m in HEAVY if m in loaded]


def wall_times(argv: list[str], runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "octopipe", *argv], check=True, capture_output=True)
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="runs per command (default 5)")
    ap.add_argument(
        "--plan-flag", action="append", default=[], help="extra flag for `plan` (e.g. --no-png)"
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = []
        for label, argv in commands(Path(tmp), args.plan_flag):
            times = wall_times(argv, args.runs)
            rows.append((label, min(times), statistics.median(times), heavy_imports(argv)))
    print(f"| command | fastest s | median s | imports ({args.runs} runs) |")
    print("|---|---:|---:|---|")
    for label, fastest, median, heavy in rows:
        print(f"| `octopipe {label}` | {fastest:.2f} | {median:.2f} | {', '.join(heavy) or '-'} |")


if __name__ == "__main__":
    main()
