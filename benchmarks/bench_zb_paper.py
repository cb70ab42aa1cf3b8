"""The zero-bubble paper's bubble rates beside ours, with steps overlapped.

    .venv/bin/python benchmarks/bench_zb_paper.py                # every row, ~10 minutes
    .venv/bin/python benchmarks/bench_zb_paper.py --budget 20

Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024), Tables 5 and 9
(`benchmarks/data/zb_paper_bubble_rates.csv`): profiled T_F, T_B, T_W and T_comm, one stage
per device, bubble rate = 1 - m (T_F + T_B + T_W) / step time. For each row:

- the paper's 1F1B, ZB-H1 and ZB-H2 beside our simulator's. 1F1B and ZB-H1 do not overlap
  their steps. ZB-H2 is simulated with steps overlapped (`--overlap-steps`);
- the paper's ZB-1p and ZB-2p beside our tuner with steps overlapped, under ZB-1p's and
  ZB-2p's memory: p and 2p microbatches of activations per device (a W holds half a
  microbatch's), `max_chunks=1` as the paper's schedules, and the search's seconds.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from octopipe.api import baseline, tune
from octopipe.profile import Device, LayerCost, Link, Profile
from octopipe.sim import Simulator

DATA = Path(__file__).parent / "data" / "zb_paper_bubble_rates.csv"
ACT, WACT = 2, 1  # bytes per microbatch of a stage's activations, and what W holds of them


def rows() -> list[dict[str, str]]:
    lines = [line for line in DATA.read_text().splitlines() if not line.startswith("#")]
    return list(csv.DictReader(lines))


def profile_of(row: dict[str, str], microbatches_of_memory: int | None = None) -> Profile:
    p = int(row["p"])
    f, b, w, comm = (float(row[k]) / 1000 for k in ("T_F", "T_B", "T_W", "T_comm"))
    layers = tuple(
        LayerCost(
            name=f"layers.{i}",
            f=f,
            b=b,
            w=w,
            act_bytes=ACT,
            wact_bytes=WACT,
            param_bytes=0,
            out_bytes=0,
        )
        for i in range(p)
    )
    memory = float("inf") if microbatches_of_memory is None else microbatches_of_memory * ACT
    devices = tuple(Device(memory_bytes=memory) for _ in range(p))
    return Profile(
        name=f"zb-{row['model']}", layers=layers, devices=devices, link=Link(latency=comm)
    )


def named(profile: Profile, schedule: str, m: int, overlap: bool) -> float:
    """A named schedule's bubble rate over a uniform partition."""
    plan = baseline(profile, schedule, "uniform", num_microbatches=m)
    return Simulator(profile).run(plan, detail=False, overlap_steps=overlap).bubble_ratio


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--budget", type=float, default=60.0, help="seconds per tuned case")
    args = parser.parse_args()
    print(
        "| model | p | m | 1F1B paper / ours | ZB-H1 paper / ours "
        "| ZB-H2 paper / ours (overlapped) | ZB-1p paper / tuned, p mbs of memory "
        "| ZB-2p paper / tuned, 2p mbs of memory | search s (1p, 2p) |"
    )
    print("|---|---:|---:|---|---|---|---|---|---|")
    for row in rows():
        p, m = int(row["p"]), int(row["m"])
        free = profile_of(row)

        tuned, seconds = [], []
        for memory in (p, 2 * p):
            result = tune(
                profile_of(row, memory),
                m,
                max_chunks=1,
                time_budget=args.budget,
                overlap_steps=True,
            )
            assert result.best.sim.fits
            tuned.append(result.best.sim.bubble_ratio)
            seconds.append(f"{result.seconds:.0f}{'' if result.converged else '*'}")
        one_f_one_b, zbh1 = named(free, "1f1b", m, False), named(free, "zbh1", m, False)
        zbh2 = named(free, "zbh2", m, True)
        print(
            f"| {row['model']} | {p} | {m} | {row['1F1B']} / {one_f_one_b:.4f} "
            f"| {row['ZB-H1']} / {zbh1:.4f} | {row['ZB-H2']} / {zbh2:.4f} "
            f"| {row['ZB-1p']} / {tuned[0]:.4f} | {row['ZB-2p']} / {tuned[1]:.4f} "
            f"| {', '.join(seconds)} |",
            flush=True,
        )
    print("\n*: the time budget ended the search (the others converged)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
