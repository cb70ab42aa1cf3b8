"""The layout `octopipe plan --gpus` chooses against Megatron-LM's usual one, per shipped model.

    .venv/bin/python benchmarks/bench_layouts.py                       # 16, 64, 256 GPUs
    .venv/bin/python benchmarks/bench_layouts.py --gpus 16 --models llama3-8b --budget 30

For every shipped full-size model and GPU count (nodes of 8 H100s, global batch 8 samples of
4096 tokens per GPU) the search runs as the command does, under one time budget, and prints a
markdown row: the chosen layout and its tokens/s per GPU, Megatron-LM's usual layout (TP = a
node, interleaved 1F1B, uniform partition, the smallest PP that fits) simulated the same way,
their ratio, how many layouts were screened and tuned, and the seconds the search took.
Simulated figures; the seconds depend on the machine.
"""

from __future__ import annotations

import argparse
import sys
import time

from octopipe.costmodel import shipped_models
from octopipe.layouts import Job, Row, plan_cluster
from octopipe.layouts.cluster import Cluster, parse_gpus
from octopipe.units import GIB

SAMPLES_PER_GPU = 8


def describe(row: Row | None) -> str:
    if row is None:
        return "-"
    lay = row.layout
    zero = " Z1" if lay.zero1 else ""
    return f"{lay.tp}/{lay.pp}/{lay.dp}{zero}, {lay.microbatch_size}x{lay.num_microbatches}"


def throughput(row: Row | None, job: Job) -> str:
    if row is None:
        return "-"
    text = f"{row.tokens_per_gpu(job):,.0f}"
    return (
        text if row.sim.fits else f"{text} (needs {max(row.sim.peak_memory_bytes) / GIB:.0f} GiB)"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--gpus", default="16,64,256", help="GPU counts, comma-separated")
    p.add_argument("--models", help="comma-separated (default: every shipped full-size model)")
    p.add_argument("--budget", type=float, default=60.0, help="seconds per search")
    p.add_argument("--gpus-per-node", type=int, default=8)
    args = p.parse_args()
    models = (
        args.models.split(",")
        if args.models
        else [m for m in shipped_models() if not m.startswith("tiny")]
    )
    print(
        "| model | GPUs | chosen TP/PP/DP, b x M | tokens/s/GPU | Megatron-LM TP/PP/DP, b x M "
        "| tokens/s/GPU | chosen / Megatron | screened / tuned of | search s |"
    )
    print("|---|---:|---|---:|---|---:|---:|---|---:|")
    for model in models:
        for n in (int(x) for x in args.gpus.split(",")):
            job = Job(model, Cluster(parse_gpus(str(n)), args.gpus_per_node), SAMPLES_PER_GPU * n)
            started = time.perf_counter()
            report = plan_cluster(job, time_budget=args.budget)
            seconds = time.perf_counter() - started
            best, ref = report.best, report.reference
            ratio = "-"
            if ref is not None and best.sim.fits and ref.sim.fits:
                ratio = f"{best.tokens_per_gpu(job) / ref.tokens_per_gpu(job):.2f}x"
            print(
                f"| {model} | {n} | {describe(best)} | {throughput(best, job)} | {describe(ref)} "
                f"| {throughput(ref, job)} | {ratio} | {report.screened} / {report.tuned} of "
                f"{report.candidates} | {seconds:.0f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
