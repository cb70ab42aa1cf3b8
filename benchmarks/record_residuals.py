"""What the dense H100 rows' errors track: each row's ratio at the preset's constants beside
the physical quantities it could depend on, and the share of its step each constant governs.

    .venv/bin/python benchmarks/record_residuals.py

Shares are elasticities: d log(step) / d log(1 / constant), from predictions with the
constant 10% higher (`record_fit.predict`). A residual that follows a column is an effect the
model misses; one that follows only the source is the source's (its release, its recipe's
unstated settings), which no global constant fitted on the other sources can learn.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import fields

from record import estimate_argv, published_tokens, read_record
from record_fit import _is_moe, predict

from octopipe.costmodel import hardware

SHARES = ("matmul_efficiency", "fp8_matmul_efficiency", "attention_efficiency", "memory_efficiency")


def share(row: dict[str, str], name: str, base: float) -> float:
    preset = hardware.PRESETS[row["hardware"]]
    value = {f.name: getattr(preset, f.name) for f in fields(preset)}[name]
    step = 1 / predict(row, {name: min(1.0, value * 1.1)})["tokens_per_gpu"]
    return -math.log(step / base) / math.log(min(1.0, value * 1.1) / value)


def main() -> None:
    rows = [
        r
        for r in read_record()
        if r["hardware"] == "h100" and not r["variant"] and estimate_argv(r) and not _is_moe(r)
    ]
    print(
        "| source | run | seq | q/rank | TP/CP/PP/DP | precision | ratio | GEMM bf16 | GEMM fp8 "
        "| attention | memory | bubble | TP+DP exposed |"
    )
    print(
        "| --- | --- | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    )
    by_source: dict[str, list[float]] = {}
    for r in rows:
        s = predict(r, {})
        ratio = s["tokens_per_gpu"] / published_tokens(r)
        by_source.setdefault(r["source"], []).append(ratio)
        base = 1 / s["tokens_per_gpu"]
        shares = [share(r, n, base) for n in SHARES]
        b, step = s["breakdown"], s["step_time"]
        exposed = (b["tp_comm"] + b["dp_exposed"] + b["fsdp_comm"] + b["cp_comm"]) / step
        seq, cp = int(r["seq_len"]), int(r["cp"])
        print(
            f"| {r['source']} | {r['model']} | {seq} | {seq // cp} | {r['tp']}/{r['cp']}/"
            f"{r['pp']}/{r['dp']} | {r['precision']}-{r['fp8_scaling']} | {ratio:.3f} | "
            + " | ".join(f"{x:.2f}" for x in shares)
            + f" | {b['bubble'] / step:.2f} | {exposed:.2f} |"
        )
    print("\n| source | rows | mean ratio | spread (sd) |")
    print("| --- | ---: | ---: | ---: |")
    for source, ratios in by_source.items():
        spread = statistics.pstdev(ratios) if len(ratios) > 1 else 0.0
        print(f"| {source} | {len(ratios)} | {statistics.mean(ratios):.3f} | {spread:.3f} |")


if __name__ == "__main__":
    main()
