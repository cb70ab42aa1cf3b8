"""`octopipe estimate` against published training runs with exact layouts.

    .venv/bin/python benchmarks/bench_fidelity.py                 # every row of the yardstick
    .venv/bin/python benchmarks/bench_fidelity.py --rows 0,4,9    # some rows
    .venv/bin/python benchmarks/bench_fidelity.py --fit a100      # re-derive the preset's two
                                                                   # efficiencies, leave-one-out
    .venv/bin/python benchmarks/bench_fidelity.py --record        # the H100 record, each
                                                                   # source held out in turn

`--record`: the rows of benchmarks/data/h100_record.csv (`record.py`), each predicted with the
H100 preset's fitted constants (`record_fit.py`) fitted on the other sources' rows only.

Each row of benchmarks/data/published_runs.csv (Narayanan et al. 2021's Table 1, and the runs
added with their sources) is rebuilt as a GPT-2 style config.json and predicted by the
`octopipe estimate` command with the row's published layout and stack settings. Published and
predicted TFLOP/s per GPU both come from the sources' own formula (Megatron's Eq. 3) over
the published and the predicted step time, so the ratio is that of the step times. Prints a
markdown table for BENCHMARKS.md.

`--fit PRESET` searches the preset's `matmul_efficiency` and `memory_efficiency` (its only
two constants not taken from a datasheet) for the least mean squared log error over the
Narayanan rows, and reports each of those rows predicted with the pair fitted on the others
(leave one out), so the table's figures can be checked against held-out predictions.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import io
import json
import math
import sys
import tempfile
import time
from pathlib import Path

from octopipe.cli import main as octopipe
from octopipe.costmodel import hardware

DATA = Path(__file__).parent / "data" / "published_runs.csv"
FIT_SOURCE = "narayanan2021"  # the rows the preset's efficiencies are fitted on


def read_rows(path: Path = DATA) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def megatron_flops(row: dict[str, str]) -> float:
    """Megatron's Eq. 3: FLOPs of one iteration, with the recomputed forward."""
    B, s, l, h, V = (int(row[k]) for k in ("global_batch", "seq_len", "layers", "hidden", "vocab"))
    return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))


def config(row: dict[str, str]) -> dict:
    """The row's model as a Hugging Face GPT-2 config (learned positions, tied embeddings)."""
    return {
        "model_type": "gpt2",
        "n_embd": int(row["hidden"]),
        "n_layer": int(row["layers"]),
        "n_head": int(row["heads"]),
        "n_inner": int(row["ffn"]),
        "vocab_size": int(row["vocab"]),
        "n_positions": int(row["seq_len"]),
    }


def estimate_argv(row: dict[str, str], config_path: Path) -> list[str]:
    argv = ["estimate", "--model", str(config_path), "--hardware", row["hardware"]]
    argv += ["--gpus", row["gpus"], "--gpus-per-node", row["gpus_per_node"]]
    for flag in ("tp", "cp", "pp", "dp"):
        argv += [f"--{flag}", row[flag]]
    argv += ["--micro-batch-size", row["micro_batch"], "--global-batch", row["global_batch"]]
    argv += ["--seq-len", row["seq_len"], "--schedule", row["schedule"]]
    if int(row["chunks"]) > 1:
        argv += ["--chunks", row["chunks"]]
    argv += ["--recompute", row["recompute"], "--attention", row["attention"]]
    argv += ["--dropout", row["dropout"], "--grad-dtype", row["grad_dtype"], "--zero", row["zero"]]
    argv += ["--p2p", row["p2p"], "--no-sequence-parallel"]
    argv += ["--scatter-gather" if row["scatter_gather"] == "1" else "--no-scatter-gather"]
    if row["grad_bucket_mb"]:
        argv += ["--grad-bucket-mb", row["grad_bucket_mb"]]
    if row["reduce_at_end"] == "1":
        argv += ["--reduce-at-end"]
    return [*argv, "--json"]


def predict(row: dict[str, str], folder: Path) -> dict:
    """`octopipe estimate --json` of the row: its summary, and the predicted TFLOP/s."""
    path = folder / f"{row['model'].replace(' ', '_')}-{row['gpus']}.json"
    path.write_text(json.dumps(config(row)))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = octopipe(estimate_argv(row, path))
    if code:
        raise SystemExit(f"octopipe estimate failed on {row['model']} ({code})")
    summary = json.loads(out.getvalue().strip().splitlines()[-1])
    tflops = megatron_flops(row) / summary["step_time"] / int(row["gpus"]) / 1e12
    return {**summary, "pred_tflops": tflops}


def ratios(rows: list[dict[str, str]], folder: Path) -> list[float]:
    return [predict(r, folder)["pred_tflops"] / float(r["pub_tflops"]) for r in rows]


@contextlib.contextmanager
def preset(name: str, **changes: float):
    """The hardware preset `name` with `changes`, for the code that reads PRESETS."""
    saved = hardware.PRESETS[name]
    hardware.PRESETS[name] = dataclasses.replace(saved, **changes)
    try:
        yield
    finally:
        hardware.PRESETS[name] = saved


def table(rows: list[dict[str, str]], folder: Path) -> list[float]:
    print("| run | GPUs | TP/PP/DP, b, schedule | published | predicted | ratio | peak GiB | s |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    out = []
    for r in rows:
        started = time.perf_counter()
        p = predict(r, folder)
        ratio = p["pred_tflops"] / float(r["pub_tflops"])
        out.append(ratio)
        lay = p["layout"]
        chunks = f" x{lay['chunks']}" if lay["chunks"] > 1 else ""
        zero = ", ZeRO-1" if lay["zero"] else ""
        print(
            f"| {r['model']} [{r['source']}] | {r['gpus']} | {lay['tp']}/{lay['pp']}/{lay['dp']},"
            f" {lay['microbatch_size']}, {lay['schedule']}{chunks}{zero} | {r['pub_tflops']} | "
            f"{p['pred_tflops']:.1f} | {ratio:.3f} | {p['peak_memory_bytes'] / 2**30:.1f} | "
            f"{time.perf_counter() - started:.1f} |"
        )
    return out


def report(name: str, values: list[float]) -> None:
    errors = [abs(v - 1) for v in values]
    print(
        f"\n{name}: {len(values)} rows, mean |error| {sum(errors) / len(errors):.1%}, "
        f"worst {max(errors):.1%}, within 10 %: {sum(e <= 0.10 for e in errors)}/{len(values)}"
    )


def fit(name: str, rows: list[dict[str, str]], folder: Path) -> None:
    """Least mean squared log error over a grid of the two efficiencies; leave one out."""
    grid = [(mm / 100, me / 100) for mm in range(60, 81) for me in range(55, 91, 5)]
    logs: dict[tuple[float, float], list[float]] = {}
    for i, (mm, me) in enumerate(grid):
        with preset(name, matmul_efficiency=mm, memory_efficiency=me):
            logs[(mm, me)] = [math.log(x) for x in ratios(rows, folder)]
        print(f"\rgrid {i + 1}/{len(grid)}", end="", file=sys.stderr)
    print(file=sys.stderr)

    def best(without: int | None = None) -> tuple[float, float]:
        def loss(key):
            return sum(v * v for j, v in enumerate(logs[key]) if j != without)

        return min(logs, key=loss)

    mm, me = best()
    print(f"fitted on all {len(rows)} rows: matmul_efficiency {mm}, memory_efficiency {me}")
    held_out = []
    for j, r in enumerate(rows):
        key = best(without=j)
        held_out.append(math.exp(logs[key][j]))
        print(f"  {r['model']}: fitted on the others {key}, held-out ratio {held_out[-1]:.3f}")
    report("leave-one-out", held_out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", help="comma-separated row indices (default: all)")
    p.add_argument("--fit", metavar="PRESET", help="re-derive PRESET's efficiencies, held out")
    p.add_argument("--record", action="store_true", help="the H100 record, sources held out")
    p.add_argument(
        "--fit-matmul", action="store_true", help="with --record: fit the BF16 GEMM one too"
    )
    p.add_argument(
        "--write-band",
        action="store_true",
        help="with --record: write the held-out ratios estimate's error band reads",
    )
    args = p.parse_args()
    if args.record:
        from record_fit import main as record_main

        record_main(args.fit_matmul, args.write_band)
        return
    rows = read_rows()
    if args.rows:
        rows = [rows[int(i)] for i in args.rows.split(",")]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if args.fit:
            fit(args.fit, [r for r in rows if r["source"] == FIT_SOURCE], folder)
            return
        values = table(rows, folder)
    for source in dict.fromkeys(r["source"] for r in rows):
        report(source, [v for v, r in zip(values, rows) if r["source"] == source])
    report("all", values)
    print(f"\n{time.perf_counter() - started:.0f} s in all")


if __name__ == "__main__":
    main()
