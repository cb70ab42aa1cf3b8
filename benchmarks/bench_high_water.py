"""Each rank's high-water mark in `octopipe run`, from its tensors, beside the plan's peak for its
device (the simulator's: static memory plus the highest level of held activations).

    .venv/bin/python benchmarks/bench_high_water.py [--seq-len 128] [--mbs 2] [--write]

tiny-llama on gloo ranks for 2 steps of AdamW, each plan priced as the run holds it: FP32
weights, gradients and activations and 8 bytes of optimizer state a parameter, or, with
`--bf16` (autocast), BF16 activations over the same FP32 state. Measured: the weights,
gradients and optimizer state the rank holds at the end (its shards), plus the most it held for
backwards at once (`HeldTensors`: what autograd saved, the recomputed modules' inputs, W's
inputs and output gradients), counted once per storage. Rows: every schedule the planner
offers, recomputation, tensor parallelism (sequence parallel), ZeRO-1 and ZeRO-3 data
parallelism. Error = measured / predicted - 1, per rank; the table shows the worst rank.
`--write` keeps the rows in `src/octopipe/costmodel/measurements/high_water.json`, whence
`octopipe estimate` quotes the memory model's measured error (`costmodel/memory_band.py`).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

from octopipe import baseline, simulate
from octopipe.config import JobConfig
from octopipe.config.sources import from_keywords
from octopipe.costmodel.build import build_profile
from octopipe.costmodel.hardware import hardware_preset
from octopipe.costmodel.hf_config import load_architecture
from octopipe.costmodel.settings import Settings
from octopipe.runtime.job.run_config import Job
from octopipe.runtime.launch.launcher import launch
from octopipe.training import runtime_config

MODEL = "tiny-llama"
FP32_STATE = dict(weight_bytes=4, grad_bytes=4, optimizer_bytes=8)


def case(schedule, *, seq_len, mbs, bf16=False, recompute=None, tp=1, dp=1, zero=0, mb=4):
    """(label, job, nproc): a baseline plan of 2 devices priced as the run will hold it."""
    settings = Settings(
        seq_len=seq_len,
        micro_batch_size=mbs,
        activation_bytes=2 if bf16 else 4,
        tensor_parallel=tp,
        sequence_parallel=tp > 1,
        tp_keeps_gathered=True,  # torch's tensor parallelism, as octopipe run runs it
        weight_copies=bf16,  # autocast's BF16 copies of the FP32 weights, per microbatch
        **FP32_STATE,
    )
    profile = build_profile(load_architecture(MODEL), hardware_preset("h100"), settings)
    if zero:
        # Each replica holds 1/dp of the optimizer state; octopipe run's ZeRO-3 (FSDP2) also
        # holds a stage's gathered weights and gradients across the step, and is priced as
        # ZeRO-1 (engines/octopipe.py).
        per_param = sum(FP32_STATE.values())
        held = 4 + 4 + 8 / dp
        layers = [
            layer.model_copy(update={"param_bytes": round(layer.param_bytes * held / per_param)})
            for layer in profile.layers
        ]
        profile = profile.model_copy(update={"layers": tuple(layers)})
    plan = baseline(profile, schedule, "uniform", mb, 2)
    if recompute:
        plan = replace(plan, recompute=(recompute,) * plan.num_stages)
        plan = plan.with_predicted(simulate(profile, plan).predicted())
    options = dict(steps=2, seq_len=seq_len, micro_batch_size=mbs, tp=tp, dp=dp, zero=zero)
    job = from_keywords(JobConfig(), bf16=bf16, **options)
    label = " ".join(
        part
        for part in (
            schedule,
            "bf16" if bf16 else "fp32",
            f"recompute {recompute}" if recompute else "",
            f"TP {tp} (SP)" if tp > 1 else "",
            f"DP {dp} ZeRO-{zero}" if zero else "",
        )
        if part
    )
    return label, Job(plan, runtime_config(job, plan, MODEL)), 2 * tp * dp


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--mbs", type=int, default=2)
    parser.add_argument("--write", action="store_true", help="keep the rows for `estimate`")
    args = parser.parse_args()
    size = dict(seq_len=args.seq_len, mbs=args.mbs)
    cases = [case(s, **size) for s in ("gpipe", "1f1b", "i1f1b", "zbh1", "zbh2", "zbv")]
    cases += [case("dualpipev", **size)]
    cases += [case("1f1b", recompute=k, **size) for k in ("selective", "full")]
    cases += [case("zbh1", recompute="full", **size)]
    cases += [case("1f1b", bf16=True, **size), case("zbh1", bf16=True, **size)]
    cases += [case("1f1b", tp=2, **size)]
    cases += [case("1f1b", dp=2, zero=z, **size) for z in (1, 3)]
    start = time.perf_counter()
    rows = []
    for nproc in sorted({n for _, _, n in cases}):
        group = [(label, job) for label, job, n in cases if n == nproc]
        results = launch([job for _, job in group], nproc, "gloo", timeout_s=300)
        for (label, _job), result in zip(group, results):
            summary = result.summary()
            pairs = list(zip(summary["high_water_bytes"], summary["predicted_peak_bytes"]))
            errors = [held / peak - 1 for held, peak in pairs]
            worst = max(range(len(errors)), key=lambda r: abs(errors[r]))
            rows.append((label, nproc, *pairs[worst], errors[worst], max(map(abs, errors))))
    print(f"{MODEL}, seq_len {args.seq_len} x mbs {args.mbs}, 4 microbatches, 2 steps, gloo\n")
    print("| run | ranks | measured (worst rank) | predicted | error | max abs error |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, nproc, held, peak, error, worst in rows:
        print(f"| {label} | {nproc} | {held:,} | {peak:,.0f} | {error:+.2%} | {worst:.2%} |")
    print(f"\n{time.perf_counter() - start:.0f} s")
    if args.write:
        from octopipe.costmodel.memory_band import HIGH_WATER

        keys = ("run", "ranks", "measured", "predicted", "worst_rank_error", "max_abs_error")
        data = {
            "command": "benchmarks/bench_high_water.py --write",
            "model": MODEL,
            "seq_len": args.seq_len,
            "micro_batch_size": args.mbs,
            "rows": [dict(zip(keys, row)) for row in rows],
        }
        Path(HIGH_WATER).write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {HIGH_WATER}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
