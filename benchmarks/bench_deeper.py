"""`--max-chunks auto` against the default cap of 4 stages per device, on bench_tuner.py's zoo.

    .venv/bin/python benchmarks/bench_deeper.py          # about 2 minutes

Each case tuned to convergence (no time budget) with every baseline, once capped at 4 chunks
and once as deep as it pays; simulated times are deterministic, the seconds are this machine's.
"""

from __future__ import annotations

import math
import time

import bench_tuner as bt

from octopipe.baselines import all_baselines
from octopipe.tuner import tune
from octopipe.tuner.search import chunk_count


def main() -> None:
    print("| case | capped at 4: s/iteration (chunks, search s) | auto | change |")
    print("|---|---|---|---:|")
    for case in bt.ZOO:
        profile = bt.profile_for(case)
        base = all_baselines(profile, case.devices, case.microbatches)
        cells = []
        for max_chunks in (4, None):
            started = time.perf_counter()
            best = tune(
                profile,
                case.microbatches,
                case.devices,
                baselines=base,
                time_budget=math.inf,
                max_chunks=max_chunks,
            ).best
            seconds = time.perf_counter() - started
            cells.append((best.sim.iteration_time, chunk_count(best.plan.placement), seconds))
        (capped, c1, s1), (auto, c2, s2) = cells
        print(
            f"| {case.label} | {capped:.6f} ({c1}, {s1:.1f} s) | {auto:.6f} ({c2}, {s2:.1f} s) "
            f"| {auto / capped - 1:+.2%} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
