"""Executor benchmark (issue 4, item 6): measured against the simulator and against PyTorch.

    .venv/bin/python benchmarks/bench_executor.py                 # both models, about 3 minutes
    .venv/bin/python benchmarks/bench_executor.py --models tiny-hybrid --repeats 2

On this machine, 2 processes with one thread each (gloo on loopback), for each model:

1. profile it with `octopipe profile --threads 1 --nproc 2` at the run's sequence length and
   microbatch size (both processes time each layer at once, and the link is measured), and
   plan it with `octopipe plan --devices 2` (the tuned plan and its prediction);
2. run the tuned plan with our executor and through PyTorch's `_PipelineScheduleRuntime` loaded
   from the same schedule.csv;
3. run PyTorch's Schedule1F1B, ScheduleInterleaved1F1B and ScheduleZBVZeroBubble over the stages
   of the balanced partition for their placements, and our executor on those same plans;
4. read our executor's per-action trace: in-run op durations against the profile's, waits,
   gaps between actions, and the time outside actions (optimizer step, pending sends); feed the
   in-run op durations to the simulator, to tell the cost model's error from the runtime's;
5. fit `in run = scale x profile + overhead` to the tuned plan's fastest run (as `octopipe
   calibrate` does), plan again on the profile x scale with `--action-overhead`, and run that
   plan taking turns with the fastest PyTorch schedule of step 3;
6. time one layer of each kind in one process: F, full B, I, W as our executor runs them, and
   b, w as the profiler measures them.

Each run trains `--steps` steps; a run's time is its median step after the first. Every plan runs
`--repeats` times under each runner, our executor and PyTorch's taking turns on the same two
processes. Other jobs on a shared machine only ever add time, so the fastest run is the figure
compared (the median and the slowest are shown beside it). Prints Markdown on stdout.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import torch

from octopipe.actions import Action
from octopipe.baselines import make_baseline
from octopipe.calibrate import (
    RunFit,
    collect_durations,
    fit_run,
    profiled_duration,
    scaled,
    stage_scaled,
)
from octopipe.models import build_model
from octopipe.models.base import PipelineModel
from octopipe.plan import Plan, load_plan
from octopipe.profile import Profile, load_profile, save_profile
from octopipe.runtime import Job, RunConfig, RunResult
from octopipe.runtime.profiler import time_layer
from octopipe.runtime.stage import StageCompute, as_leaves
from octopipe.runtime.torch_pipelining import CSV_RUNTIME, TorchJob, TorchResult, launch_torch
from octopipe.runtime.worker import ActionRecord
from octopipe.sim import Simulator

DEVICES = 2


@dataclass(frozen=True)
class ModelSize:
    """Big enough that a stage's actions take milliseconds (per-action overheads of ~0.1 ms stay
    small), small enough that a run of every plan fits in a minute on 2 cores."""

    seq_len: int
    micro_batch_size: int


# Mamba/attention/MLP hybrid (uneven layers), and MoE layers with a heavy weight-gradient part.
MODELS = {"tiny-hybrid": ModelSize(128, 2), "tiny-moe": ModelSize(256, 2)}


def sized_model(name: str, seed: int) -> PipelineModel:
    size = MODELS[name]
    return build_model(name, seed, seq_len=size.seq_len, micro_batch_size=size.micro_batch_size)


def tiny_hybrid(seed: int) -> PipelineModel:
    return sized_model("tiny-hybrid", seed)


def tiny_moe(seed: int) -> PipelineModel:
    return sized_model("tiny-moe", seed)


# `module:factory` specs the ranks import (spawned ranks inherit this script's sys.path).
FACTORIES = {"tiny-hybrid": "bench_executor:tiny_hybrid", "tiny-moe": "bench_executor:tiny_moe"}

# PyTorch's schedule class, and our schedule of the same order and placement.
TORCH_BASELINES = (
    ("Schedule1F1B", "1f1b"),
    ("ScheduleInterleaved1F1B", "i1f1b"),
    ("ScheduleZBVZeroBubble", "zbv"),
)
OURS = "octopipe executor"
CSV_LABEL = "PyTorch _PipelineScheduleRuntime (our CSV)"


@dataclass
class Row:
    plan_label: str
    runner: str
    simulated: float
    times: list[float]  # per run: median step time after the first
    plan: Plan | None = None
    records: tuple[tuple[ActionRecord, ...], ...] = ()  # our executor's trace of the fastest run
    step_times: tuple[float, ...] = ()  # and its steps

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def fastest(self) -> float:
        """The least disturbed run: other jobs on the machine only ever add time."""
        return min(self.times)

    @property
    def slowest(self) -> float:
        return max(self.times)


# --- profile and plan with the CLI, as a user would --------------------------------------------


def octopipe_cli(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "octopipe", *args], check=True, stdout=subprocess.DEVNULL)


def plan_cli(
    profile_path: Path, microbatches: int, budget: float, plan_dir: Path, *extra: str
) -> Plan:
    """`octopipe plan` for the benchmark's devices, as a user would run it; the plan it wrote."""
    octopipe_cli(
        "plan",
        "--profile",
        str(profile_path),
        "--devices",
        str(DEVICES),
        "--microbatches",
        str(microbatches),
        "--time-budget",
        str(budget),
        "--quiet",
        *extra,
        "-o",
        str(plan_dir),
    )
    return load_plan(plan_dir / "plan.json")


def profile_and_plan(
    model: str, microbatches: int, repeats: int, budget: float, out: Path
) -> tuple[Profile, Plan, Path]:
    """The measured profile, the tuned plan, and the schedule.csv `octopipe plan` wrote."""
    size = MODELS[model]
    profile_path, plan_dir = out / f"{model}.profile.json", out / f"{model}-plan"
    octopipe_cli(
        "profile",
        "--model",
        model,
        "--seq-len",
        str(size.seq_len),
        "--micro-batch-size",
        str(size.micro_batch_size),
        "--threads",
        "1",
        "--repeats",
        str(repeats),
        "--nproc",
        str(DEVICES),  # timed under the run's contention, and the link measured
        "-o",
        str(profile_path),
    )
    plan = plan_cli(profile_path, microbatches, budget, plan_dir)
    profile = load_profile(profile_path)
    devices = profile.device_list(DEVICES)
    return (
        profile.with_devices(devices),
        plan,
        plan_dir / "schedule.csv",
    )


# --- runs -----------------------------------------------------------------------------------------


def measure(
    model: str, profile: Profile, tuned: Plan, csv: Path, steps: int, repeats: int
) -> list[Row]:
    """Each plan under our executor and under PyTorch, in pairs on the same two processes.

    Rows: tuned (ours, then PyTorch's runtime on our CSV), then per PyTorch schedule class its
    run and ours on the same plan. Within a pair the runners alternate which goes first."""
    sim = Simulator(profile)
    spec = FACTORIES[model]
    M = tuned.num_microbatches
    pairs: list[tuple[Row, Job, Row, TorchJob]] = []
    simulated = sim.run(tuned).iteration_time
    pairs.append(
        (
            Row("tuned", OURS, simulated, [], tuned),
            Job(tuned, RunConfig(spec, steps=steps)),
            Row("tuned", CSV_LABEL, simulated, []),
            TorchJob(tuned, CSV_RUNTIME, spec, steps, csv=str(csv)),
        )
    )
    for cls, name in TORCH_BASELINES:
        plan = make_baseline(profile, name, "balanced", DEVICES, M, simulator=sim)
        label, simulated = f"{name}/balanced", sim.run(plan).iteration_time
        pairs.append(
            (
                Row(label, OURS, simulated, [], plan),
                Job(plan, RunConfig(spec, steps=steps)),
                Row(label, f"PyTorch {cls}", simulated, []),
                TorchJob(plan, cls, spec, steps),
            )
        )
    for k in range(repeats):
        jobs: list[Job | TorchJob] = []
        for _, ours, _, theirs in pairs:
            jobs += [ours, theirs] if k % 2 == 0 else [theirs, ours]
        results = launch_torch(jobs, DEVICES)
        for i, (our_row, _, their_row, _) in enumerate(pairs):
            first, second = results[2 * i], results[2 * i + 1]
            mine, other = (first, second) if k % 2 == 0 else (second, first)
            assert isinstance(mine, RunResult) and isinstance(other, TorchResult)
            our_row.times.append(mine.iteration_time)
            if mine.iteration_time <= min(our_row.times):
                our_row.records, our_row.step_times = mine.records, mine.step_times
            their_row.times.append(other.iteration_time)
    tuned_ours, tuned_csv = pairs[0][0], pairs[0][2]
    rows = [tuned_ours, tuned_csv]
    for our_row, _, their_row, _ in pairs[1:]:
        rows += [their_row, our_row]
    return rows


@dataclass
class SecondPass:
    """The plan made again on the profile rescaled to the first pass's run, with the fitted
    per-action overhead."""

    fit: RunFit
    ours: Row  # simulated: the default semantics, from the rescaled profile (its `predicted`)
    theirs: Row
    simulated_from_measured: float  # the same plan, default semantics, the profile as measured
    simulated_with_overhead: float  # rescaled profile and the overhead


def second_pass(
    model: str,
    profile: Profile,
    rows: list[Row],
    microbatches: int,
    budget: float,
    steps: int,
    repeats: int,
    out: Path,
) -> SecondPass:
    """Fit `in run = scale x profile + overhead` to the tuned plan's fastest run (what
    `octopipe calibrate` does), plan again on the rescaled profile with `--action-overhead`,
    and run the new plan taking turns with the PyTorch schedule fastest in the first pass."""
    tuned = rows[0]
    assert tuned.plan is not None
    fit = fit_run(profile, tuned.plan, in_run_durations(tuned.records))
    calibrated = scaled(profile, fit.scale)
    path, plan_dir = out / f"{model}.calibrated.json", out / f"{model}-plan-calibrated"
    save_profile(calibrated, path)
    plan = plan_cli(path, microbatches, budget, plan_dir, "--action-overhead", str(fit.overhead))
    best = min(
        (r for r in rows if r.runner.startswith("PyTorch Schedule")), key=lambda r: r.fastest
    )
    same_plan = next(r.plan for r in rows if r.runner == OURS and r.plan_label == best.plan_label)
    assert same_plan is not None
    label = "tuned on the calibrated profile"
    ours = Row(label, OURS, Simulator(calibrated).run(plan).iteration_time, [], plan)
    theirs = Row(best.plan_label, best.runner, best.simulated, [])
    spec, cls = FACTORIES[model], best.runner.removeprefix("PyTorch ")
    for k in range(repeats):
        jobs: list[Job | TorchJob] = [
            Job(plan, RunConfig(spec, steps=steps)),
            TorchJob(same_plan, cls, spec, steps),
        ]
        for result in launch_torch(jobs if k % 2 == 0 else jobs[::-1], DEVICES):
            if isinstance(result, RunResult):
                ours.times.append(result.iteration_time)
                if result.iteration_time <= min(ours.times):
                    ours.records, ours.step_times = result.records, result.step_times
            else:
                theirs.times.append(result.iteration_time)
    return SecondPass(
        fit,
        ours,
        theirs,
        Simulator(profile).run(plan).iteration_time,
        Simulator(calibrated, fit.overhead).run(plan).iteration_time,
    )


def second_pass_lines(second: SecondPass) -> list[str]:
    ours, theirs, fit = second.ours, second.theirs, second.fit
    assert ours.plan is not None
    other = theirs.runner.removeprefix("PyTorch ")
    return [
        (
            f"Second pass (`octopipe calibrate` on the tuned plan's fastest run): in run = "
            f"{fit.scale:.3f} x profile + {fit.overhead * 1e6:.0f} us per action "
            f"({fit.points} stage/kind pairs); `octopipe plan` on the profile x {fit.scale:.3f} "
            f"with `--action-overhead` chose {ours.plan.num_stages} stages on devices "
            f"{list(ours.plan.placement)}, run taking turns with {other}."
        ),
        "",
        (
            "| plan | runner | simulated ms | measured ms: fastest run | median | slowest "
            "| fastest / simulated |"
        ),
        "|---|---|---:|---:|---:|---:|---:|",
        *(
            f"| {r.plan_label} | {r.runner} | {ms(r.simulated)} | {ms(r.fastest)} | "
            f"{ms(r.median)} | {ms(r.slowest)} | {r.fastest / r.simulated:.3f} |"
            for r in (ours, theirs)
        ),
        "",
        (
            "- second-pass plan vs the simulator on the calibrated profile (its `predicted`, "
            f"default semantics): {ours.fastest / ours.simulated - 1:+.1%} (fastest run), "
            f"{ours.median / ours.simulated - 1:+.1%} (median); on the profile as measured "
            f"({ms(second.simulated_from_measured)} ms): "
            f"{ours.fastest / second.simulated_from_measured - 1:+.1%}; on the calibrated "
            f"profile with the overhead ({ms(second.simulated_with_overhead)} ms): "
            f"{ours.fastest / second.simulated_with_overhead - 1:+.1%} (fastest runs)"
        ),
        (
            f"- {other}'s time over the second-pass plan's: "
            f"{theirs.fastest / ours.fastest:.3f}x (fastest runs), "
            f"{theirs.median / ours.median:.3f}x (medians)"
        ),
    ]


# --- what the trace says --------------------------------------------------------------------------


@dataclass(frozen=True)
class RankBreakdown:
    """Seconds per step (medians over the steps after the first) of one rank's time."""

    step: float
    compute: float  # sum of action durations, in the run
    compute_profiled: float  # the same actions' durations by the profile
    wait: float  # waiting for inputs (transfers, or the other rank)
    gaps: float  # between one action's end and the next one's wait: bookkeeping, posting receives
    tail: float  # outside actions: posting receives, pending sends, optimizer step, and the
    # time this rank finished before the slowest one (`step` is the slowest rank's)


def _stage_kind(record: ActionRecord) -> tuple[int, str]:
    act = Action.parse(record.action)
    return act.stage, act.kind


def breakdown(
    profile: Profile, plan: Plan, records: Sequence[ActionRecord], step_times: Sequence[float]
) -> RankBreakdown:
    per_step: dict[int, list[ActionRecord]] = defaultdict(list)
    for r in records:
        per_step[r.step].append(r)
    rows = []
    for step, recs in sorted(per_step.items()):
        if step == 0 and len(per_step) > 1:
            continue
        compute = sum(r.end - r.start for r in recs)
        profiled = sum(profiled_duration(profile, plan, *_stage_kind(r)) for r in recs)
        wait = sum(r.start - r.wait_start for r in recs)
        gaps = sum(b.wait_start - a.end for a, b in pairwise(recs))
        busy_span = recs[-1].end - recs[0].wait_start
        rows.append((step_times[step], compute, profiled, wait, gaps, step_times[step] - busy_span))
    return RankBreakdown(*(statistics.median(col) for col in zip(*rows)))


def in_run_durations(records: Sequence[Sequence[ActionRecord]]) -> dict:
    """Every action's in-run duration by stage and kind, steps after the first."""
    return collect_durations(
        (Action.parse(r.action), r.end - r.start) for rank in records for r in rank if r.step > 0
    )


def in_run_profile(
    profile: Profile, plan: Plan, records: Sequence[Sequence[ActionRecord]]
) -> Profile:
    """Each stage's f, b, w scaled to its in-run mean: what the simulator predicts from the op
    times that run measured."""
    return stage_scaled(profile, plan, in_run_durations(records))


# --- one layer's backward, three ways ----------------------------------------------------------


@dataclass(frozen=True)
class BackwardCosts:
    """Fastest ms of one layer's work on one microbatch, measured in turn in one process."""

    layer: str
    kind: str
    f: float  # our executor's forward (StageCompute)
    full: float  # our executor's full backward (B)
    i: float  # our executor's split backward: I, then W
    w: float
    profiled_b: float  # the profiler's way (octopipe profile): input grads, then weight grads
    profiled_w: float


def backward_costs(model: PipelineModel, index: int, rounds: int = 7) -> BackwardCosts:
    """Time F, B, I and W of layer `index` as the executor runs them, and b, w as the profiler
    measures them, alternating so that machine load hits all alike."""
    batch = model.make_batch(1, 0)
    with torch.no_grad():
        x = model.forward_layers(0, index, batch.inputs[0])
        y = model.forward_layers(index, index + 1, x)
    stage = StageCompute(model, index, index + 1, False, 1.0)
    seeds = [torch.randn_like(t) for t in y if t.is_floating_point()]
    samples = []
    for _ in range(rounds + 1):  # the first round warms up
        t0 = time.perf_counter()
        stage.forward(0, as_leaves(x), None)
        t1 = time.perf_counter()
        stage.backward(0, seeds)
        t2 = time.perf_counter()
        stage.forward(1, as_leaves(x), None)
        t3 = time.perf_counter()
        stage.backward_input(1, seeds)
        t4 = time.perf_counter()
        stage.backward_weight(1)
        t5 = time.perf_counter()
        prof = time_layer(model.layer(index), x, None, True, torch.device("cpu"), 0, 1)
        samples.append((t1 - t0, t2 - t1, t4 - t3, t5 - t4, prof.b, prof.w))
    stage.close()
    # Other jobs on the machine only ever add time: the fastest round is the least disturbed.
    f, full, i, w, pb, pw = (min(c) * 1e3 for c in zip(*samples[1:]))
    return BackwardCosts(model.layer_names[index], model.layer_kinds[index], f, full, i, w, pb, pw)


def backward_table(model_name: str) -> list[str]:
    """One layer of every kind with weights and an input gradient (not the first nor the last)."""
    model = sized_model(model_name, 0)
    seen: set[str] = set()
    lines = [
        f"Backward of one layer of each kind ({model_name}; ms, fastest of 7, one process):",
        "",
        "| layer | kind | F | B (full) | I | W | (I+W) / B | profile b | profile w | (b+w) / B |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for index in range(1, len(model.layer_names) - 1):
        kind = model.layer_kinds[index]
        if kind in seen or kind in ("norm",):
            continue
        seen.add(kind)
        c = backward_costs(model, index)
        lines.append(
            f"| {c.layer} | {c.kind} | {c.f:.2f} | {c.full:.2f} | {c.i:.2f} | {c.w:.2f} | "
            f"{(c.i + c.w) / c.full:.2f} | {c.profiled_b:.2f} | {c.profiled_w:.2f} | "
            f"{(c.profiled_b + c.profiled_w) / c.full:.2f} |"
        )
    return lines


# --- report --------------------------------------------------------------------------------


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def compute_ratio(profile: Profile, row: Row) -> float:
    """Our executor's compute time in the run over the profile's (steps after the first)."""
    assert row.plan is not None
    recs = [r for rank in row.records for r in rank if r.step > 0]
    run = sum(r.end - r.start for r in recs)
    return run / sum(profiled_duration(profile, row.plan, *_stage_kind(r)) for r in recs)


def report(
    model: str, profile: Profile, tuned: Plan, rows: list[Row]
) -> tuple[list[str], dict[str, float]]:
    size = MODELS[model]
    work = sum(x.work for x in profile.layers)
    lines = [
        (
            f"### {model} (seq-len {size.seq_len}, micro-batch-size {size.micro_batch_size}, "
            f"{tuned.num_microbatches} microbatches, {DEVICES} ranks x 1 thread)"
        ),
        "",
        (
            f"Profile: {ms(work)} ms of F+B+W per microbatch; tuned plan: "
            f"{tuned.num_stages} stages on devices {list(tuned.placement)}."
        ),
        "",
        (
            "| plan | runner | simulated ms | measured ms: fastest run | median | slowest "
            "| fastest / simulated | op time in run / profile | simulated from in-run op times |"
        ),
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        extra = "| | |"
        if r.records and r.plan is not None:
            in_run = (
                Simulator(in_run_profile(profile, r.plan, r.records)).run(r.plan).iteration_time
            )
            error = r.fastest / in_run - 1
            extra = f"| {compute_ratio(profile, r):.3f} | {ms(in_run)} ({error:+.1%}) |"
        lines.append(
            f"| {r.plan_label} | {r.runner} | {ms(r.simulated)} | {ms(r.fastest)} | "
            f"{ms(r.median)} | {ms(r.slowest)} | {r.fastest / r.simulated:.3f} {extra}"
        )
    ours_tuned, csv = rows[0], rows[1]
    best_torch = min(
        (r for r in rows if r.runner.startswith("PyTorch Schedule")), key=lambda r: r.fastest
    )
    figures = {
        "sim_error": ours_tuned.fastest / ours_tuned.simulated - 1,
        "sim_error_median": ours_tuned.median / ours_tuned.simulated - 1,
        "vs_best_torch": best_torch.fastest / ours_tuned.fastest,
        "vs_best_torch_median": best_torch.median / ours_tuned.median,
        "vs_csv_runtime": csv.fastest / ours_tuned.fastest,
        "vs_csv_runtime_median": csv.median / ours_tuned.median,
    }
    lines += [
        "",
        (
            "- tuned plan, our executor vs the simulator (measured profile): "
            f"{figures['sim_error']:+.1%} (fastest run), "
            f"{figures['sim_error_median']:+.1%} (median)"
        ),
        (
            "- the best PyTorch schedule's time over the tuned plan's on our executor "
            f"({best_torch.runner.removeprefix('PyTorch ')}): {figures['vs_best_torch']:.3f}x "
            f"(fastest runs), {figures['vs_best_torch_median']:.3f}x (medians)"
        ),
        (
            "- the same schedule.csv, `_PipelineScheduleRuntime` time over our executor's: "
            f"{figures['vs_csv_runtime']:.3f}x (fastest runs), "
            f"{figures['vs_csv_runtime_median']:.3f}x (medians)"
        ),
        "",
        (
            "Our executor's trace of the tuned plan (its fastest run; per step, median over the "
            "steps after the first; step = the slowest rank's):"
        ),
        "",
        (
            "| rank | step ms | compute ms (in run) | compute ms (profile) | in run / profile "
            "| wait ms | gaps ms | outside actions ms |"
        ),
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for rank, recs in enumerate(ours_tuned.records):
        if not recs:
            continue
        b = breakdown(profile, tuned, recs, ours_tuned.step_times)
        lines.append(
            f"| {rank} | {ms(b.step)} | {ms(b.compute)} | {ms(b.compute_profiled)} | "
            f"{b.compute / b.compute_profiled:.3f} | {ms(b.wait)} | {ms(b.gaps)} | {ms(b.tail)} |"
        )
    return lines, figures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument(
        "--steps", type=int, default=6, help="training steps per run (the first is left out)"
    )
    parser.add_argument("--repeats", type=int, default=5, help="runs of every configuration")
    parser.add_argument(
        "--profile-repeats", type=int, default=20, help="timed runs per layer when profiling"
    )
    parser.add_argument("--plan-budget", type=float, default=20.0, help="seconds of tuner search")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    out_lines = [
        "## Executor: measured vs simulated, vs torch.distributed.pipelining",
        "",
        f"Command: `{' '.join(['.venv/bin/python benchmarks/bench_executor.py', *sys.argv[1:]])}`",
        "",
    ]
    with tempfile.TemporaryDirectory(prefix="bench-executor-") as tmp:
        for model in args.models:
            profile, tuned, csv = profile_and_plan(
                model, args.microbatches, args.profile_repeats, args.plan_budget, Path(tmp)
            )
            measured = measure(model, profile, tuned, csv, args.steps, args.repeats)
            lines, _ = report(model, profile, tuned, measured)
            second = second_pass(
                model,
                profile,
                measured,
                args.microbatches,
                args.plan_budget,
                args.steps,
                args.repeats,
                Path(tmp),
            )
            lines += ["", *second_pass_lines(second)]
            lines += ["", *backward_table(model)]
            out_lines += [*lines, ""]
            print(
                "\n".join(lines) + "\n", file=sys.stderr, flush=True
            )  # progress, in case a later model fails
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    out_lines.append(
        f"Benchmark wall time: {time.perf_counter() - began:.0f} s; load average at the end "
        f"(1, 5, 15 min): {load} on {os.cpu_count()} cores (other jobs share this machine)."
    )
    print("\n".join(out_lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
