"""`octopipe plan --profile P --time-budget B` on profiles of 10^3 to 10^6 layers: how long the
whole command takes beside its budget, and how much of it is reading the profile.

    .venv/bin/python benchmarks/bench_budget.py                  # 1e3, 1e4, 1e5, 1e6 layers
    .venv/bin/python benchmarks/bench_budget.py --layers 1000000 --budget 5

Each profile is a uniform stack written to a temporary folder, planned on 4 devices with the
default microbatches and pictures. Each command runs as its own process, so the figures hold
its start-up and its reading of the file. The table gives wall and CPU seconds of the command,
the CPU seconds of reading the profile alone (`load_profile` in the same process before the
command, so it is measured side by side on the same load), and the command's wall time over
the budget. On a shared machine wall time is noisy; CPU time is the steadier figure.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def write_profile(path: Path, num_layers: int) -> None:
    layer = {"kind": "decoder", "f": 1e-3, "b": 1e-3, "w": 1e-3, "act_bytes": 100}
    layer.update(wact_bytes=50, param_bytes=1000, out_bytes=10)
    layers = [{"name": f"layers.{i}", **layer} for i in range(num_layers)]
    devices = [{"speed": 1.0}] * 4
    data = {"format": "octopipe.profile/1", "name": f"stack{num_layers}", "layers": layers}
    path.write_text(json.dumps({**data, "devices": devices}))


def reading_cpu(path: Path) -> float:
    code = (
        "import time; from octopipe.profile import load_profile; t = time.process_time(); "
        f"load_profile({str(path)!r}); print(time.process_time() - t)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout)


def plan_seconds(path: Path, out: Path, budget: float) -> tuple[float, float]:
    """Wall and CPU seconds of one `octopipe plan` process."""
    argv = [sys.executable, "-m", "octopipe", "plan", "--profile", str(path), "--quiet"]
    argv += ["--time-budget", str(budget), "-o", str(out)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(argv, capture_output=True, check=True, cwd=HERE)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[10**3, 10**4, 10**5, 10**6])
    parser.add_argument("--budget", type=float, default=5.0)
    args = parser.parse_args()
    print("| layers | budget s | wall s | CPU s | reading CPU s | wall / budget |")
    print("|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.layers:
            path = Path(tmp) / f"p{n}.json"
            write_profile(path, n)
            read = reading_cpu(path)
            wall, cpu = plan_seconds(path, Path(tmp) / f"out{n}", args.budget)
            print(
                f"| {n:,} | {args.budget:g} | {wall:.1f} | {cpu:.1f} | {read:.1f} | "
                f"{wall / args.budget:.2f}x |"
            )


if __name__ == "__main__":
    main()
