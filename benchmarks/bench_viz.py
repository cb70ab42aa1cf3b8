"""Drawing time of timeline pictures for big plans: a markdown table of case, actions, seconds
and pixel size.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_viz.py            # default cases
    PYTHONPATH=src .venv/bin/python benchmarks/bench_viz.py --case zbv:32:256

A case is `schedule:devices:microbatches` on a profile of uniform layers (two per stage). The
pictures go to a temporary folder; seconds are one wall-clock run of `save_timeline` (and of
the HTML timeline where the code has one), the simulation excluded.
"""

from __future__ import annotations

import argparse
import struct
import tempfile
import time
from pathlib import Path

from octopipe.baselines import make_baseline
from octopipe.profile import Device, LayerCost, Profile
from octopipe.schedules import DEFAULT_CHUNKS
from octopipe.sim import Simulator

CASES = ("1f1b:4:64", "i1f1b:32:256", "zbv:32:256")


def profile_for(stages: int, devices: int) -> Profile:
    layers = tuple(
        LayerCost(
            name=f"layers.{i}",
            f=1e-3,
            b=1e-3,
            w=1e-3,
            act_bytes=1 << 20,
            wact_bytes=1 << 19,
            param_bytes=1 << 20,
            out_bytes=1 << 16,
        )
        for i in range(2 * stages)
    )
    return Profile(name="bench", layers=layers, devices=tuple(Device() for _ in range(devices)))


def png_size(path: Path) -> tuple[int, int]:
    return struct.unpack(">II", path.read_bytes()[16:24])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", action="append", help="schedule:devices:microbatches (repeatable)")
    args = ap.parse_args()
    from octopipe import viz

    html = getattr(viz, "save_html_timeline", None) if hasattr(viz, "__getattr__") else None
    print("| case | actions | PNG seconds | PNG pixels | HTML seconds | HTML MiB |")
    print("|---|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for case in args.case or CASES:
            name, p, m = case.split(":")
            P, M = int(p), int(m)
            profile = profile_for(P * DEFAULT_CHUNKS[name], P)
            plan = make_baseline(profile, name, "uniform", P, M)
            result = Simulator(profile).run(plan)
            png = Path(tmp) / f"{name}.png"
            t0 = time.perf_counter()
            viz.save_timeline(result, png, title=case)
            png_s = time.perf_counter() - t0
            w, h = png_size(png)
            html_s, html_mib = "-", "-"
            if html is not None:
                page = Path(tmp) / f"{name}.html"
                t0 = time.perf_counter()
                html(result, page, title=case)
                html_s = f"{time.perf_counter() - t0:.2f}"
                html_mib = f"{page.stat().st_size / 2**20:.1f}"
            print(
                f"| {case} | {len(result.events)} | {png_s:.2f} | {w} x {h} | {html_s} | "
                f"{html_mib} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
