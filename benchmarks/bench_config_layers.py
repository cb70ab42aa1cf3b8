"""`octopipe profile-arch` of configs declaring 256 to 4,096 layers (the cap,
`limits.MAX_CONFIG_LAYERS`), and the refusal of a million: how long each command takes.

    .venv/bin/python benchmarks/bench_config_layers.py
    .venv/bin/python benchmarks/bench_config_layers.py --layers 1024 4096 --models tiny-llama

Each config is a shipped one (tiny-llama: dense; deepseek-v3: MLA and MoE layers) with its
`num_hidden_layers` changed, written to a temporary folder; each command runs as its own
process, so the figures hold its start-up, the estimate, writing the profile and the summary.
On a shared machine wall time is noisy; CPU time is the steadier figure.
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
CONFIGS = HERE / "src" / "octopipe" / "costmodel" / "configs"


def profile_arch_seconds(config: Path, out: Path) -> tuple[float, float, int]:
    """Wall and CPU seconds and the exit status of one `octopipe profile-arch` process."""
    argv = [sys.executable, "-m", "octopipe", "profile-arch", str(config), "-o", str(out)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, cwd=HERE)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[256, 1024, 4096, 1_000_000])
    parser.add_argument("--models", nargs="+", default=["tiny-llama", "deepseek-v3"])
    args = parser.parse_args()
    print("| config | layers | exit | wall s | CPU s |")
    print("|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models:
            for layers in args.layers:
                config = json.loads((CONFIGS / f"{model}.json").read_text())
                config["num_hidden_layers"] = layers
                path = Path(tmp) / f"{model}-{layers}.json"
                path.write_text(json.dumps(config))
                wall, cpu, code = profile_arch_seconds(path, Path(tmp) / "profile.json")
                print(f"| {model} | {layers:,} | {code} | {wall:.1f} | {cpu:.1f} |")


if __name__ == "__main__":
    main()
