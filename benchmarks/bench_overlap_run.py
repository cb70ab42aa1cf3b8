"""Overlapped steps in the executor: `run --overlap-steps` against synchronous steps, measured
beside the simulator's figures for the same plans.

    .venv/bin/python benchmarks/bench_overlap_run.py                 # about 5 minutes
    .venv/bin/python benchmarks/bench_overlap_run.py --repeats 4 --steps 10

On this machine, 2 processes with one thread each (gloo on loopback):

1. profile each model with `measure_profile(..., nproc=2, threads=1)` at its benchmark size
   (both processes time each layer at once, and the link is measured). The default model,
   `benchmarks/data/uniform-llama.json`, is 8 equal Llama blocks with a small vocabulary, so
   the blocks, not a heavy head, set the bubbles;
2. the plans: per model, `tune(profile, M, 2, overlap_steps=True)` (ranked by its steady step
   time with steps back to back) for each of CHUNKS, the one with the largest predicted gain,
   and on the first model a control, 1F1B over the balanced partition, where the simulator
   predicts that overlapping steps gains nothing;
3. the simulator's figures for each plan: one synchronous step (`iteration_time`) and the
   steady step time with steps overlapped (`Simulator.run(plan, overlap_steps=True)`);
4. every plan with and without `overlap_steps`, all in one process group (one `launch`): per
   repeat every plan once each way, the two variants taking turns at going first.

A run's time is the span of its action trace per step: (the latest action end over all ranks
in the last step - in step `skip - 1`) / (steps - skip). It times both variants the same way,
barriers and optimizer steps of a synchronous run included. Beside it, the runs' own step
times (`RunResult.step_times`, the slowest rank's, median after `skip`): a synchronous step
runs from its start barrier to the rank's optimizer step end, so it leaves out the wait at the
barrier, and an overlapped step runs from the end of the rank's previous step.

The gain compared is the median over repeats of each pair's ratio (the two variants of a
repeat ran one after the other, so they saw about the same load), with the middle half and the
whole range of those ratios beside it, and the ratio of each variant's fastest run (the least
disturbed). The control's ratios show the noise. The losses of the two variants of a plan are
printed side by side: overlapped steps must give the synchronous results. Prints Markdown on
stdout.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import octopipe as op
from octopipe.baselines import make_baseline
from octopipe.plan import JobShape, Plan
from octopipe.profile import Profile
from octopipe.runtime.job.result import RunResult
from octopipe.runtime.job.run_config import Job, RunConfig, Stepping
from octopipe.runtime.launch.launcher import launch
from octopipe.sim import Simulator

DEVICES = 2
UNIFORM = Path(__file__).parent / "data" / "uniform-llama.json"


@dataclass(frozen=True)
class Case:
    """A model at a size whose actions take milliseconds, and the plan's microbatches."""

    model: str
    seq_len: int
    micro_batch_size: int
    microbatches: int


# Few microbatches: with two devices the tuned synchronous plans of more microbatches are already
# within 1-3% of the physical limit, so steps back to back have little left to gain.
CASES = {
    "uniform-llama": Case(str(UNIFORM), 128, 2, 3),
    "tiny-llama": Case("tiny-llama", 128, 2, 4),
    "tiny-moe": Case("tiny-moe", 256, 2, 3),
}
CHUNKS = (1, 2, 4)  # the tuner's max_chunks tried; the plan with the largest predicted gain runs


@dataclass
class Row:
    label: str
    case: Case
    plan: Plan
    sim_sync: float  # Simulator.run(plan).iteration_time
    sim_overlap: float  # Simulator.run(plan, overlap_steps=True).steady.step_time
    sync: list[float] = field(default_factory=list)  # per repeat: median step after `skip`
    overlap: list[float] = field(default_factory=list)
    span_sync: list[float] = field(default_factory=list)  # per repeat: trace span per step
    span_overlap: list[float] = field(default_factory=list)
    losses: tuple[tuple[float, ...], tuple[float, ...]] | None = None  # sync, overlapped
    redone: int = 0

    def ratios(self, sync: list[float], overlap: list[float]) -> list[float]:
        return [s / o for s, o in zip(sync, overlap)]


def profile_of(case: Case, repeats: int) -> Profile:
    profile = op.measure_profile(
        case.model,
        nproc=DEVICES,
        seq_len=case.seq_len,
        micro_batch_size=case.micro_batch_size,
        repeats=repeats,
        threads=1,
        progress=False,
    )
    return profile.with_devices(profile.device_list(DEVICES))


def simulated(sim: Simulator, plan: Plan) -> tuple[float, float]:
    return sim.run(plan).iteration_time, sim.run(plan, overlap_steps=True).steady.step_time


def trace_span(result: RunResult, skip: int) -> float:
    """Seconds per step between the ends of step `skip - 1` and of the last step, each step's end
    the latest action end over all ranks."""
    ends: dict[int, float] = {}
    for records in result.records:
        for r in records:
            ends[r.step] = max(ends.get(r.step, 0.0), r.end)
    last = max(ends)
    return (ends[last] - ends[skip - 1]) / (last - skip + 1)


def step_time(result: RunResult, skip: int) -> float:
    return statistics.median(result.step_times[skip:])


def job(row: Row, steps: int, overlap: bool) -> Job:
    c = row.case
    config = RunConfig(
        c.model,
        steps=steps,
        seq_len=c.seq_len,
        shape=JobShape(tp=1, pp=1, dp=1, microbatch_size=c.micro_batch_size),
        stepping=Stepping(overlap_steps=overlap),
    )
    return Job(row.plan, config)


def measure(rows: list[Row], steps: int, repeats: int, skip: int) -> None:
    """Every plan both ways, `repeats` times, in one process group; the variants take turns at
    going first."""
    jobs, where = [], []
    for k in range(repeats):
        for i, row in enumerate(rows):
            order = (True, False) if (k + i) % 2 == 0 else (False, True)
            for flag in order:
                jobs.append(job(row, steps, flag))
                where.append((i, flag))
    results = launch(jobs, DEVICES, "gloo")
    runs: dict[int, dict[bool, list[RunResult]]] = {
        i: {True: [], False: []} for i in range(len(rows))
    }
    for (i, flag), result in zip(where, results):
        runs[i][flag].append(result)
    for i, row in enumerate(rows):
        for result in runs[i][False]:
            row.sync.append(step_time(result, skip))
            row.span_sync.append(trace_span(result, skip))
        for result in runs[i][True]:
            row.overlap.append(step_time(result, skip))
            row.span_overlap.append(trace_span(result, skip))
            row.redone = max(row.redone, result.redone_steps)
        row.losses = (runs[i][False][0].losses, runs[i][True][0].losses)
        assert all(r.losses == row.losses[0] for r in runs[i][False]), "sync runs differ"
        assert all(r.losses == row.losses[1] for r in runs[i][True]), "overlapped runs differ"


def ms(x: float) -> str:
    return f"{x * 1e3:.1f}"


def spread(values: list[float]) -> str:
    """The middle half of the values, and all of them."""
    if len(values) < 4:
        return f"{min(values):.3f}-{max(values):.3f}"
    q1, _, q3 = statistics.quantiles(values, n=4)
    return f"{q1:.3f}-{q3:.3f}; {min(values):.3f}-{max(values):.3f}"


def report(rows: list[Row], steps: int, repeats: int, skip: int) -> list[str]:
    lines = [
        f"2 ranks x 1 thread, gloo; {steps} steps per run, {repeats} runs of each variant per "
        f"plan, the variants taking turns; a run's time: its trace span per step after the first "
        f"{skip} steps. *gain*: synchronous time / overlapped time.",
        "",
        "| plan | simulated ms: synchronous | overlapped | predicted gain | measured ms: "
        "synchronous, fastest run (median) | overlapped, fastest run (median) | measured gain: "
        "median of pairs (middle half; all) | fastest runs | gain by the runs' step times: "
        "median of pairs | measured / simulated, medians: sync | overlapped |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        gains = row.ratios(row.span_sync, row.span_overlap)
        sync, overlap = statistics.median(row.span_sync), statistics.median(row.span_overlap)
        lines.append(
            f"| {row.label} | {ms(row.sim_sync)} | {ms(row.sim_overlap)} | "
            f"{row.sim_sync / row.sim_overlap:.3f}x | "
            f"{ms(min(row.span_sync))} ({ms(sync)}) | "
            f"{ms(min(row.span_overlap))} ({ms(overlap)}) | "
            f"{statistics.median(gains):.3f}x ({spread(gains)}) | "
            f"{min(row.span_sync) / min(row.span_overlap):.3f}x | "
            f"{statistics.median(row.ratios(row.sync, row.overlap)):.3f}x | "
            f"{sync / row.sim_sync:.3f} | {overlap / row.sim_overlap:.3f} |"
        )
    lines += ["", "Losses per step (first run of each variant), and steps redone:", ""]
    for row in rows:
        assert row.losses is not None
        sync, overlap = row.losses
        diff = max(abs(a - b) / max(abs(a), 1e-30) for a, b in zip(sync, overlap))
        same = "identical" if sync == overlap else f"max relative difference {diff:.1e}"
        lines.append(
            f"- {row.label}: synchronous {[round(x, 6) for x in sync]}; overlapped "
            f"{[round(x, 6) for x in overlap]} ({same}); overlapped steps redone: {row.redone}"
        )
    lines += ["", "Per-run trace spans (ms per step), synchronous / overlapped, launch order:", ""]
    for row in rows:
        pairs = ", ".join(f"{ms(s)}/{ms(o)}" for s, o in zip(row.span_sync, row.span_overlap))
        lines.append(f"- {row.label}: {pairs}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["uniform-llama"], choices=list(CASES))
    parser.add_argument("--steps", type=int, default=20, help="training steps per run")
    parser.add_argument("--skip", type=int, default=4, help="first steps left out of a run")
    parser.add_argument("--repeats", type=int, default=15, help="runs of each variant per plan")
    parser.add_argument(
        "--profile-repeats", type=int, default=10, help="timed runs per layer when profiling"
    )
    parser.add_argument(
        "--plan-budget", type=float, default=4.0, help="seconds of tuner search per plan"
    )
    args = parser.parse_args(argv)
    if not 1 <= args.skip < args.steps:
        parser.error("--skip must be at least 1 and less than --steps")
    began = time.perf_counter()
    rows: list[Row] = []
    for name in args.models:
        case = CASES[name]
        profile = profile_of(case, args.profile_repeats)
        sim = Simulator(profile)
        M = case.microbatches
        tuned = []
        for chunks in CHUNKS:
            plan = op.tune(
                profile,
                M,
                DEVICES,
                time_budget=args.plan_budget,
                overlap_steps=True,
                max_chunks=chunks,
            ).best.plan
            devices = [st.device for st in plan.stages]
            label = (
                f"{name} M={M}: tuned, overlap_steps=True, max_chunks={chunks} "
                f"({len(devices)} stages on devices {devices})"
            )
            tuned.append(Row(label, case, plan, *simulated(sim, plan)))
        rows.append(max(tuned, key=lambda r: r.sim_sync / r.sim_overlap))
        if name == args.models[0]:
            control = make_baseline(profile, "1f1b", "balanced", DEVICES, M, simulator=sim)
            label = f"{name} M={M}: 1f1b/balanced (control)"
            rows.append(Row(label, case, control, *simulated(sim, control)))
        print(f"profiled and planned {name}: {time.perf_counter() - began:.0f} s", file=sys.stderr)
    measure(rows, args.steps, args.repeats, args.skip)
    command = " ".join([".venv/bin/python benchmarks/bench_overlap_run.py", *sys.argv[1:]])
    lines = ["## Overlapped steps in the executor", "", f"Command: `{command}`", ""]
    for name in args.models:
        c = CASES[name]
        lines.append(
            f"- {name}: seq-len {c.seq_len}, micro-batch-size {c.micro_batch_size}, "
            f"{c.microbatches} microbatches"
        )
    lines += ["", *report(rows, args.steps, args.repeats, args.skip), ""]
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    lines.append(
        f"Benchmark wall time: {time.perf_counter() - began:.0f} s; load average at the end "
        f"(1, 5, 15 min): {load} on {os.cpu_count()} cores (other jobs share this machine)."
    )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
