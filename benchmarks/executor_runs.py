"""bench_executor.py's runs: the models and their sizes, profiling and planning through the CLI,
and each plan under our executor and under PyTorch's pipelining runtimes, taking turns on the same
two processes (the first pass), then the plan made again on the calibrated profile (the second).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from executor_trace import in_run_durations

from octopipe.baselines import make_baseline
from octopipe.calibrate import RunFit, fit_run, scaled
from octopipe.plan import JobShape, Plan, load_plan
from octopipe.profile import Profile, load_profile, save_profile
from octopipe.runtime.job.result import RunResult
from octopipe.runtime.job.run_config import Job, RunConfig
from octopipe.runtime.step.records import ActionRecord
from octopipe.runtime.torch_pipelining import CSV_RUNTIME, TorchJob, TorchResult, launch_torch
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


def our_job(plan: Plan, model: str, steps: int) -> Job:
    """Our executor's run of `plan` on the model at its benchmark size."""
    size = MODELS[model]
    return Job(
        plan,
        RunConfig(
            model,
            steps=steps,
            seq_len=size.seq_len,
            shape=JobShape(tp=1, pp=1, dp=1, microbatch_size=size.micro_batch_size),
        ),
    )


def their_job(plan: Plan, runner: str, model: str, steps: int, csv: str | None = None) -> TorchJob:
    """PyTorch's run of `plan` on the model at its benchmark size."""
    size = MODELS[model]
    return TorchJob(
        plan,
        runner,
        model,
        steps,
        csv=csv,
        seq_len=size.seq_len,
        micro_batch_size=size.micro_batch_size,
    )


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
    M = tuned.num_microbatches
    pairs: list[tuple[Row, Job, Row, TorchJob]] = []
    simulated = sim.run(tuned).iteration_time
    pairs.append(
        (
            Row("tuned", OURS, simulated, [], tuned),
            our_job(tuned, model, steps),
            Row("tuned", CSV_LABEL, simulated, []),
            their_job(tuned, CSV_RUNTIME, model, steps, csv=str(csv)),
        )
    )
    for cls, name in TORCH_BASELINES:
        plan = make_baseline(profile, name, "balanced", DEVICES, M, simulator=sim)
        label, simulated = f"{name}/balanced", sim.run(plan).iteration_time
        pairs.append(
            (
                Row(label, OURS, simulated, [], plan),
                our_job(plan, model, steps),
                Row(label, f"PyTorch {cls}", simulated, []),
                their_job(plan, cls, model, steps),
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
    cls = best.runner.removeprefix("PyTorch ")
    for k in range(repeats):
        jobs: list[Job | TorchJob] = [
            our_job(plan, model, steps),
            their_job(same_plan, cls, model, steps),
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
