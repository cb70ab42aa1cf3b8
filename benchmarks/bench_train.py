"""Training benchmark: a Hugging Face Llama-style byte model learning real text through a tuned
plan, and its step time with data parallelism.

    .venv/bin/python benchmarks/bench_train.py --png out/bench_train_loss.png   # about 2.5 minutes
    .venv/bin/python benchmarks/bench_train.py --steps 50 --repeats 2   # under a minute

1. **Loss.** The tokens are the bytes of a text file an installed package ships (by default
   torch's `_torch_docs.py`, read at run time; `--text` picks another), written as a uint16
   token file (vocabulary 256). A small `hf:` Llama config (random init) is planned as
   `octopipe plan` would: `profile_from_config(..., layer_names="hf")` on 2 devices, then
   `tune`. The plan trains `--steps` steps on 2 processes with
   `octopipe.run(..., data=<token file>, optimizer="adamw")`; the loss at a few steps is the
   mean of the 5 steps centred on it (3 at the ends). Uniform guessing is ln 256 = 5.55.
2. **Step time with data parallelism.** The same plan at D = 1 (2 processes) and D = 2
   (4 processes: two replicas of the 2-device pipeline), and at D = 2 with every gradient
   all-reduce held back to the step's end (`RunConfig.reduce_at_end`) against the default,
   where each stage's all-reduce starts after its last backward and overlaps the compute left.
   All runs are jobs of one launch on 4 processes (D = 1 leaves ranks 2 and 3 idle), taking
   turns in a rotating order, `--repeats` runs each; a run's time is its median step after the
   first. Each replica takes M x b sequences, so a D = 2 step trains twice the sequences.

The simulator's D = 2 / D = 1 prediction is printed too, for a profile of the model measured
here (`measure_profile`, 2 processes) with each layer's fp32 gradient and the measured link for
the all-reduce. The simulator gives every rank a device of its own; it does not model 4
processes sharing 2 cores.
Prints Markdown on stdout.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

import octopipe as op
from octopipe.plan import JobShape
from octopipe.profile import DataParallel
from octopipe.runtime.data.batches import TokenFile
from octopipe.runtime.job.run_config import Job, RunConfig, Stepping
from octopipe.runtime.launch.launcher import launch
from octopipe.runtime.step.worker import OptimizerConfig

DEVICES = 2
SEQ_LEN, MICRO_BATCH, MICROBATCHES = 64, 4, 4
LR = 3e-3
CONFIG = {  # Llama-style, byte vocabulary
    "model_type": "llama",
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 172,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": SEQ_LEN,
    "tie_word_embeddings": False,
}
REPORTED_STEPS = (0, 50, 100, 150, 199)
# (label, replicas, all-reduces at the step's end)
VARIANTS = (("D=1", 1, False), ("D=2, overlapped all-reduce", 2, False), ("D=2, at end", 2, True))


def default_text() -> Path:
    return Path(torch.__file__).parent / "_torch_docs.py"


def write_tokens(text: Path, folder: Path) -> tuple[Path, int]:
    """The file's bytes as little-endian uint16 token ids; the path and the token count."""
    tokens = np.frombuffer(text.read_bytes(), dtype=np.uint8).astype("<u2")
    path = folder / "tokens.u16"
    path.write_bytes(tokens.tobytes())
    return path, len(tokens)


def optimizer_name() -> str:
    return "adamw" if hasattr(torch.optim, "AdamW") else "adam"


def window_mean(losses: Sequence[float], k: int, half: int = 2) -> float:
    return statistics.fmean(losses[max(0, k - half) : k + half + 1])


def loss_section(losses: Sequence[float], run_s: float, step_s: float) -> list[str]:
    steps = [k for k in REPORTED_STEPS if k < len(losses)]
    if len(losses) - 1 not in steps:
        steps.append(len(losses) - 1)
    rows = ["| step | " + " | ".join(str(k) for k in steps) + " |"]
    rows.append("|---|" + "---:|" * len(steps))
    rows.append(
        "| loss (mean of 5 steps around) | "
        + " | ".join(f"{window_mean(losses, k):.3f}" for k in steps)
        + " |"
    )
    rows.append("| loss (that step) | " + " | ".join(f"{losses[k]:.3f}" for k in steps) + " |")
    last = window_mean(losses, len(losses) - 1)
    return [
        *rows,
        "",
        f"- ln 256 = {math.log(256):.3f}; last loss {last:.3f} = {last / math.log(256):.2f} x "
        f"ln 256 ({last / math.log(2):.2f} bits per byte)",
        f"- {len(losses)} steps in {run_s:.1f} s wall (with process start-up); median step "
        f"{step_s * 1e3:.1f} ms",
    ]


def save_loss_png(losses: Sequence[float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    steps = range(len(losses))
    ax.plot(steps, losses, lw=0.8, alpha=0.5, label="loss per step")
    ax.plot(steps, [window_mean(losses, k) for k in steps], lw=1.6, label="mean of 5 steps")
    ax.axhline(math.log(256), ls="--", color="grey", lw=1, label="ln 256 (uniform)")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats per byte)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def predictions(model: str, plan) -> dict[int, float]:
    """The simulator's step time of `plan` at D = 1 and D = 2 on a profile measured here (2
    processes at once, the link between them measured too), each layer's gradient its fp32
    parameters, the all-reduce over the measured link."""
    from octopipe.runtime.model.load import load_recipe
    from octopipe.runtime.model.split import parameter_bytes

    measured = op.measure_profile(
        model,
        nproc=DEVICES,
        seq_len=SEQ_LEN,
        micro_batch_size=MICRO_BATCH,
        repeats=10,
        progress=False,
    )
    meta = load_recipe(model).meta_model
    layers = tuple(
        layer.model_copy(update={"grad_bytes": parameter_bytes(meta.get_submodule(layer.name))})
        for layer in measured.layers
    )
    link = measured.link
    return {
        d: op.simulate(
            measured.model_copy(
                update={
                    "layers": layers,
                    "data_parallel": DataParallel(
                        degree=d, bandwidth=link.bandwidth, latency=link.latency
                    ),
                }
            ),
            plan,
        ).iteration_time
        for d in (1, 2)
    }


def timing_jobs(plan, model: str, data: TokenFile, steps: int, repeats: int) -> list[Job]:
    """Every variant `repeats` times, the order rotated each round."""
    jobs = []
    for r in range(repeats):
        for i in range(len(VARIANTS)):
            _, dp, at_end = VARIANTS[(i + r) % len(VARIANTS)]
            config = RunConfig(
                model,
                steps=steps,
                optimizer=OptimizerConfig(optimizer_name(), LR),
                seq_len=SEQ_LEN,
                data=data,
                shape=JobShape(tp=1, pp=1, dp=dp, microbatch_size=MICRO_BATCH),
                stepping=Stepping(reduce_at_end=at_end),
            )
            jobs.append(Job(plan, config))
    return jobs


def variant_of(job: Job) -> str:
    return next(
        label
        for label, dp, at_end in VARIANTS
        if (dp, at_end) == (job.config.shape.dp, job.config.stepping.reduce_at_end)
    )


def timing_section(times: dict[str, list[float]], simulated: dict[int, float]) -> list[str]:
    rows = [
        "| variant | processes | sequences per step | step ms: fastest run | median | slowest | "
        "sequences/s: fastest run | median |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    medians = {label: statistics.median(t) for label, t in times.items()}
    for label, dp, _ in VARIANTS:
        t = times[label]
        sequences = dp * MICROBATCHES * MICRO_BATCH
        rows.append(
            f"| {label} | {dp * DEVICES} | {sequences} | {min(t) * 1e3:.1f} | "
            f"{medians[label] * 1e3:.1f} | {max(t) * 1e3:.1f} | {sequences / min(t):.0f} | "
            f"{sequences / medians[label]:.0f} |"
        )
    d1, d2, end = (medians[label] for label, _, _ in VARIANTS)
    fast1, fast2, fast_end = (min(times[label]) for label, _, _ in VARIANTS)
    one, two, at_end = (times[label] for label, _, _ in VARIANTS)  # index = round

    def paired(a: list[float], b: list[float]) -> str:
        ratios = sorted(x / y for x, y in zip(a, b))
        return f"{statistics.median(ratios):.3f}x ({ratios[0]:.3f}-{ratios[-1]:.3f})"

    return [
        *rows,
        "",
        f"- D=2 / D=1 step time: {fast2 / fast1:.2f}x (fastest runs), {d2 / d1:.2f}x (medians), "
        f"{paired(two, one)} (each round's ratio: median, range); sequences/s "
        f"{2 * fast1 / fast2:.2f}x (fastest runs)",
        f"- D=2, all-reduces at the step's end / overlapped: {fast_end / fast2:.3f}x (fastest "
        f"runs), {end / d2:.3f}x (medians), {paired(at_end, two)} (rounds)",
        f"- simulator, on a profile measured here (which assumes a core per rank): "
        f"D=1 {simulated[1] * 1e3:.1f} ms, D=2 {simulated[2] * 1e3:.1f} ms, "
        f"{simulated[2] / simulated[1]:.2f}x",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text", type=Path, default=default_text(), help="the training text")
    parser.add_argument("--steps", type=int, default=200, help="training steps of the loss run")
    parser.add_argument("--repeats", type=int, default=9, help="timed runs of each variant")
    parser.add_argument("--timed-steps", type=int, default=20, help="steps per timed run")
    parser.add_argument("--plan-budget", type=float, default=5.0, help="seconds of tuning")
    parser.add_argument("--png", type=Path, help="draw the loss curve here")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        folder = Path(tmp)
        tokens, count = write_tokens(args.text, folder)
        config_path = folder / "config.json"
        config_path.write_text(json.dumps(CONFIG))
        model = f"hf:{config_path}"

        profile = op.profile_from_config(
            config_path,
            devices=DEVICES,
            seq_len=SEQ_LEN,
            micro_batch_size=MICRO_BATCH,
            layer_names="hf",
        )
        plan = op.tune(profile, MICROBATCHES, time_budget=args.plan_budget).best.plan
        stages = ", ".join(
            f"{plan.layer_names[s.start]}..{plan.layer_names[s.end - 1]} on {s.device}"
            if plan.layer_names
            else f"[{s.start}, {s.end}) on {s.device}"
            for s in plan.stages
        )
        started = time.perf_counter()
        result = op.run(
            plan,
            model,
            steps=args.steps,
            optimizer=optimizer_name(),
            lr=LR,
            data=tokens,
            seq_len=SEQ_LEN,
            micro_batch_size=MICRO_BATCH,
        )
        loss_s = time.perf_counter() - started
        assert result is not None
        if args.png:
            save_loss_png(result.losses, args.png)

        simulated = predictions(model, plan)
        jobs = timing_jobs(
            plan, model, TokenFile(tokens, SEQ_LEN, 0), args.timed_steps, args.repeats
        )
        started = time.perf_counter()
        timed = launch(jobs, 2 * DEVICES, "gloo")
        timing_s = time.perf_counter() - started
    times: dict[str, list[float]] = {label: [] for label, _, _ in VARIANTS}
    for job, run in zip(jobs, timed):
        times[variant_of(job)].append(run.iteration_time)
    print(  # each round's runs in the order they ran, for a look at the noise
        "\n".join(
            " | ".join(
                f"{variant_of(job)} {run.iteration_time * 1e3:.1f} ms"
                for job, run in zip(jobs[i : i + len(VARIANTS)], timed[i : i + len(VARIANTS)])
            )
            for i in range(0, len(jobs), len(VARIANTS))
        ),
        file=sys.stderr,
    )

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    out = [
        "## Training: a byte-level hf: Llama learns real text; data-parallel step time",
        "",
        f"Command: `{' '.join(['.venv/bin/python benchmarks/bench_train.py', *sys.argv[1:]])}`",
        "",
        f"Text: `{args.text}` ({count:,} bytes = tokens). Model: hf llama, hidden "
        f"{CONFIG['hidden_size']}, {CONFIG['num_hidden_layers']} layers, vocabulary 256, "
        f"random init; seq-len {SEQ_LEN}, micro-batch {MICRO_BATCH}, {MICROBATCHES} microbatches "
        f"({MICROBATCHES * MICRO_BATCH * SEQ_LEN:,} tokens per replica per step), "
        f"{optimizer_name()} lr {LR}. Tuned plan: {stages}.",
        "",
        f"### Loss over {args.steps} steps (D=1, 2 processes)",
        "",
        *loss_section(result.losses, loss_s, result.iteration_time),
        *([f"- loss curve: `{args.png}`"] if args.png else []),
        "",
        f"### Step time: {args.repeats} runs of {args.timed_steps} steps per variant, taking turns",
        "",
        *timing_section(times, simulated),
        f"- timed runs: {timing_s:.0f} s wall in one launch of 4 processes",
        "",
        f"Benchmark wall time: {time.perf_counter() - began:.0f} s; {cores} cores; load average "
        f"at the end (1, 5, 15 min): {', '.join(f'{x:.1f}' for x in os.getloadavg())}.",
    ]
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
