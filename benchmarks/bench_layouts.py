"""The layout `octopipe plan --gpus` chooses, against the published layout and Megatron-LM's.

    .venv/bin/python benchmarks/bench_layouts.py                        # every section
    .venv/bin/python benchmarks/bench_layouts.py --section published    # one of them
    .venv/bin/python benchmarks/bench_layouts.py --section models --gpus 64 --repeat 2
    .venv/bin/python benchmarks/bench_layouts.py --section targets --only 128K --only DeepSeek

Sections:

- **published**: every run of benchmarks/data/published_runs.csv (Narayanan et al. 2021's
  Table 1, MT-NLG), on its GPUs, global batch, sequence length and the stack settings it was run
  with. The chosen layout's step is set beside `octopipe estimate` of the published layout
  (its schedule, chunks, recomputation and microbatch size) and beside Megatron-LM's usual
  layout, all three under the same cost model.
- **models**: every shipped full-size model on --gpus H100s (nodes of 8), 8 samples of 4096
  tokens per GPU, OctoPipe's default stack, beside Megatron-LM's usual layout.
- **targets**: Llama-3-405B on 8,192 and 16,384 H100s at 8K tokens and on 16,384 at 128K (16M
  tokens a step, Llama 3's Table 4), set beside the published layouts; DeepSeek-V3 on 64, 256
  and 1,024 H100s.

Each search runs as the command does (its work counted in layouts and evaluations, a time cap
of 600 s). With --repeat 2 every case runs twice and the row says whether the two chosen
layouts and plans are identical. Markdown on stdout; simulated figures; the seconds depend on
the machine, nothing else does.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from octopipe.costmodel import shipped_models
from octopipe.layouts import Cluster, Job, JobShape, Row, parse_gpus, plan_cluster
from octopipe.layouts.estimate import Given, estimate
from octopipe.layouts.stack import Stack
from octopipe.units import GIB

DATA = Path(__file__).parent / "data" / "published_runs.csv"
SAMPLES_PER_GPU = 8
MB = 2**20
# Llama 3's Table 4 (Dubey et al. 2024): GPUs, TP, CP, PP, DP, sequence length, TFLOP/s per GPU.
LLAMA3_RUNS = ((8192, 8, 1, 16, 64, 8192, 430), (16384, 8, 1, 16, 128, 8192, 400),
               (16384, 8, 16, 16, 8, 131072, 380))  # fmt: skip
LLAMA3_TOKENS = 16 * 2**20  # 16M tokens a step in all three runs


def describe(lay: JobShape) -> str:
    parts = [f"{lay.tp}/{lay.pp}/{lay.dp}"]
    if lay.cp > 1:
        parts.append(f"CP{lay.cp}")
    if lay.ep > 1:
        parts.append(f"EP{lay.ep}")
    if lay.shards_optimizer:
        parts.append("Z1")
    if lay.recompute != "none":
        parts.append(lay.recompute[0])
    return " ".join(parts) + f", {lay.microbatch_size}x{lay.num_microbatches}"


def cell(row: Row | None) -> str:
    if row is None:
        return "-"
    text = f"{describe(row.layout)}: {row.step_time:.2f} s"
    return text if row.sim.fits else f"{text} (needs {row.peak_memory_bytes / GIB:.0f} GiB)"


def search(job: Job, repeat: int) -> tuple[object, float, str]:
    """The report of the case's search, its seconds, and whether repeats agree."""
    started = time.perf_counter()
    report = plan_cluster(job)
    seconds = time.perf_counter() - started
    same = "-"
    for _ in range(repeat - 1):
        again = plan_cluster(job)
        same = "yes" if _fingerprint(again) == _fingerprint(report) else "NO"
    return report, seconds, same


def _fingerprint(report) -> str:
    best = report.best
    return json.dumps([best.summary(), best.plan.to_dict()], sort_keys=True)


def wanted(label: str, only: list[str] | None) -> bool:
    """Whether the case named `label` runs: every case, or those naming one of `only`."""
    return not only or any(part.lower() in label.lower() for part in only)


@dataclass(frozen=True)
class Case:
    """One published job: its label, the job, and its published layout (None where unstated)."""

    label: str
    job: Job
    given: Given | None


def published_cases(folder: Path) -> Iterator[Case]:
    """benchmarks/data/published_runs.csv's runs, each model's config written into `folder`."""
    with DATA.open() as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    for r in rows:
        config = folder / f"{r['model'].replace(' ', '_')}.json"
        config.write_text(json.dumps({
            "model_type": "gpt2", "n_embd": int(r["hidden"]), "n_layer": int(r["layers"]),
            "n_head": int(r["heads"]), "n_inner": int(r["ffn"]),
            "vocab_size": int(r["vocab"]), "n_positions": int(r["seq_len"]),
        }))  # fmt: skip
        stack = Stack(
            attention=r["attention"],
            sequence_parallel=False,
            dropout=float(r["dropout"]),
            grad_dtype=r["grad_dtype"],
            grad_bucket_bytes=int(float(r["grad_bucket_mb"]) * MB) if r["grad_bucket_mb"] else None,
            reduce_at_end=r["reduce_at_end"] == "1",
            p2p=r["p2p"],
            scatter_gather=r["scatter_gather"] == "1",
        )
        cluster = Cluster(parse_gpus(r["gpus"], r["hardware"]), int(r["gpus_per_node"]))
        job = Job(str(config), cluster, int(r["global_batch"]), int(r["seq_len"]), stack)
        lay = JobShape(
            int(r["tp"]),
            int(r["pp"]),
            int(r["dp"]),
            int(r["micro_batch"]),
            1,
            zero=int(r["zero"] == "1"),
            cp=int(r["cp"]),
            recompute=r["recompute"],
        )
        chunks = int(r["chunks"]) if int(r["chunks"]) > 1 else None
        label = f"{r['model']} [{r['source']}] {r['gpus']}"
        yield Case(label, job, Given(lay, r["schedule"], chunks))


def target_cases(deepseek_gpus: tuple[int, ...] = (64, 256, 1024)) -> Iterator[Case]:
    """Llama-3-405B at Llama 3's Table 4 layouts, then DeepSeek-V3 on `deepseek_gpus` H100s."""
    for gpus, tp, cp, pp, dp, seq, _ in LLAMA3_RUNS:
        job = Job("llama3-405b", Cluster(parse_gpus(str(gpus)), 8), LLAMA3_TOKENS // seq, seq)
        lay = JobShape(tp, pp, dp, 1, 1, zero=1, cp=cp)
        yield Case(f"Llama-3-405B, {gpus} H100, {seq // 1024}K tokens", job, Given(lay, "i1f1b", 2))
    for gpus in deepseek_gpus:
        job = Job("deepseek-v3", Cluster(parse_gpus(str(gpus)), 8), 4 * gpus, 4096)
        yield Case(f"DeepSeek-V3, {gpus} H100, 4 samples of 4K a GPU", job, None)


def published_section(repeat: int, only: list[str] | None) -> None:
    print(
        "| run | GPUs | published layout: estimate | Megatron-LM | chosen | chosen / "
        "published | chosen / Megatron | screened / tuned of | evaluations | s | same |"
    )
    print("|---|---:|---|---|---|---:|---:|---|---:|---:|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for case in published_cases(Path(tmp)):
            if not wanted(case.label, only):
                continue
            job = case.job
            given = estimate(job, case.given)
            report, seconds, same = search(job, repeat)
            best, ref = report.best, report.reference
            model, gpus = case.label.rsplit(" ", 1)
            print(
                f"| {model} | {gpus} | "
                f"{describe(given.given.layout)}: {given.step_time:.2f} s | {cell(ref)} | "
                f"{cell(best)} | {given.step_time / best.step_time:.2f}x faster | "
                f"{ref.step_time / best.step_time:.2f}x | {report.screened} / {report.tuned} of "
                f"{report.candidates} | {report.evaluations:,} | {seconds:.0f} | {same} |",
                flush=True,
            )


def models_section(gpu_counts: list[int], repeat: int, only: list[str] | None) -> None:
    print(
        "| model | GPUs | Megatron-LM | chosen | chosen / Megatron | screened / tuned of "
        "| evaluations | s | same |"
    )
    print("|---|---:|---|---|---:|---|---:|---:|---|")
    for model in [m for m in shipped_models() if not m.startswith("tiny")]:
        for n in gpu_counts:
            if not wanted(f"{model} {n}", only):
                continue
            job = Job(model, Cluster(parse_gpus(str(n)), 8), SAMPLES_PER_GPU * n, 4096)
            report, seconds, same = search(job, repeat)
            best, ref = report.best, report.reference
            ratio = (
                f"{ref.step_time / best.step_time:.2f}x" if best.sim.fits and ref.sim.fits else "-"
            )
            print(
                f"| {model} | {n} | {cell(ref)} | {cell(best)} | {ratio} | {report.screened} / "
                f"{report.tuned} of {report.candidates} | {report.evaluations:,} | {seconds:.0f} "
                f"| {same} |",
                flush=True,
            )


def targets_section(repeat: int, only: list[str] | None) -> None:
    print(
        "| case | published layout: estimate | Megatron-LM | chosen | fits | chosen / "
        "published | s | same |"
    )
    print("|---|---|---|---|---|---:|---:|---|")
    for case in target_cases():
        if not wanted(case.label, only):
            continue
        report, seconds, same = search(case.job, repeat)
        best = report.best
        lacking = f" (lacks {best.memory_lacking_bytes / GIB:.0f} GiB)" if not best.sim.fits else ""
        published, ratio = "-", "-"
        if case.given is not None:
            given = estimate(case.job, case.given)
            published = f"{describe(given.given.layout)}: {given.step_time:.2f} s"
            ratio = f"{given.step_time / best.step_time:.2f}x"
        print(
            f"| {case.label} | {published} | {cell(report.reference)} | {cell(best)} | "
            f"{'yes' if best.sim.fits else 'no'}{lacking} | {ratio} | {seconds:.0f} | {same} |",
            flush=True,
        )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--section", choices=("published", "models", "targets"), action="append")
    p.add_argument("--gpus", default="16,256", help="GPU counts of the models section")
    p.add_argument("--repeat", type=int, default=1, help="run each case this many times")
    p.add_argument("--only", action="append", help="only the cases whose name holds this text")
    args = p.parse_args()
    sections = args.section or ["published", "targets", "models"]
    started = time.perf_counter()
    for section in sections:
        print(f"\n### {section}\n")
        if section == "published":
            published_section(args.repeat, args.only)
        elif section == "models":
            models_section([int(x) for x in args.gpus.split(",")], args.repeat, args.only)
        else:
            targets_section(args.repeat, args.only)
    print(f"\n{time.perf_counter() - started:.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
