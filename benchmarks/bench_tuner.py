"""Benchmark the tuner on a zoo of heterogeneous cases from the analytic cost model.

    .venv/bin/python benchmarks/bench_tuner.py            # zoo + scaling, markdown on stdout
    .venv/bin/python benchmarks/bench_tuner.py --quick    # zoo only
    .venv/bin/python benchmarks/bench_tuner.py --quick --torchtitan   # placements torchtitan builds
    .venv/bin/python benchmarks/bench_tuner.py --shipped  # shipped models, `octopipe plan` defaults
    .venv/bin/python benchmarks/bench_tuner.py --quick --overlap-steps --budget 60   # steady state

Per case: tuned efficiency (physical limit / simulated time), speedup over Megatron-LM
interleaved 1F1B with the uniform partition (`i1f1b/uniform`), speedup over the best fitting
baseline, and the tuning time on this machine. All times are the simulator's.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass

from octopipe.baselines import all_baselines
from octopipe.costmodel import load_architecture
from octopipe.costmodel.build import build_profile
from octopipe.costmodel.hardware import hardware_preset
from octopipe.costmodel.settings import Settings
from octopipe.costs import CostTable
from octopipe.plan import Plan
from octopipe.profile import Device, Profile
from octopipe.sim import Simulator
from octopipe.tuner import tune
from octopipe.tuner.balance import device_loads
from octopipe.units import GIB

MEGATRON = "i1f1b/uniform"


@dataclass(frozen=True)
class Case:
    label: str
    model: str
    devices: int
    microbatches: int
    tp: int = 1
    slow_devices: int = 0  # the last ones become A100s among H100s
    memory_gib: float | None = None  # capacity override, every device


ZOO = (
    Case("large vocabulary (gemma2-9b)", "gemma2-9b", 4, 32),
    Case("MoE (qwen1.5-moe-a2.7b)", "qwen1.5-moe-a2.7b", 4, 32, tp=2),
    Case("hybrid Mamba (nemotron-h-8b)", "nemotron-h-8b", 4, 32),
    Case("vision-language (llama3.2-11b-vision)", "llama3.2-11b-vision", 8, 32),
    Case("homogeneous control (llama3-8b)", "llama3-8b", 4, 32),
    Case(
        "mixed speeds: 4 H100 + 4 A100 (llama3-70b tp8)", "llama3-70b", 8, 32, tp=8, slow_devices=4
    ),
    Case("memory-limited: 72 GiB (llama3-70b tp4)", "llama3-70b", 8, 32, tp=4, memory_gib=72),
    Case("16 devices, 55 layers (nemotron-h-8b)", "nemotron-h-8b", 16, 64),
)

# Tighter than any baseline fits: the tuner must find a plan on its own.
NO_BASELINE_FITS = Case(
    "memory-limited: 48 GiB (llama3-70b tp4)", "llama3-70b", 8, 32, tp=4, memory_gib=48
)

SCALING = tuple(
    Case(f"llama3-70b tp8 P={P} M={M}", "llama3-70b", P, M, tp=8)
    for P, M in ((4, 16), (8, 32), (16, 32), (16, 64), (32, 64), (32, 128))
)


# `octopipe plan --model NAME` defaults (4 devices, 16 microbatches), with the tensor-parallel
# degree (and devices) a model needs to fit 80 GB devices at all.
SHIPPED_NEEDS = {
    "deepseek-v3": (8, 32),
    "gemma3-27b": (2, 4),
    "llama3-70b": (8, 4),
    "mixtral-8x7b": (4, 4),
}


def shipped_cases() -> list[Case]:
    from octopipe.costmodel import shipped_models

    out = []
    for name in shipped_models():
        tp, devices = SHIPPED_NEEDS.get(name, (1, 4))
        out.append(Case(f"{name} tp{tp}", name, devices, 4 * devices, tp=tp))
    return out


def shipped_table(rows: list[Row]) -> str:
    lines = [
        "| model | P x M | efficiency | vs best fitting baseline (which) | baselines fitting |"
        + " tuning s |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        vs = f"{r.vs_best:.3f}x ({r.best_label})" if r.baselines_fitting else "none fits"
        lines.append(
            f"| {r.case.label} | {r.case.devices} x {r.case.microbatches} | "
            f"{r.efficiency:.3f} | {vs} | {r.baselines_fitting} of {r.baselines_total} "
            f"| {r.seconds:.1f} |"
        )
    return "\n".join(lines)


def profile_for(case: Case) -> Profile:
    h100 = hardware_preset("h100")
    profile = build_profile(
        load_architecture(case.model), h100, Settings(tensor_parallel=case.tp), case.devices
    )
    a100 = hardware_preset("a100")
    devices = []
    for d in range(case.devices):
        slow = d >= case.devices - case.slow_devices
        speed = a100.peak_flops / h100.peak_flops if slow else 1.0
        memory = (a100 if slow else h100).memory_bytes
        if case.memory_gib is not None:
            memory = case.memory_gib * GIB
        devices.append(Device(speed=speed, memory_bytes=memory))
    return profile.with_devices(devices)


@dataclass(frozen=True)
class Row:
    case: Case
    efficiency: float
    balance_ceiling: float  # the efficiency the tuned plan's device loads allow with no bubble
    vs_megatron: float
    vs_best: float
    best_label: str
    seconds: float
    cpu_seconds: float  # this process's CPU time: robust when others share the machine
    evaluations: int
    tuned_label: str
    fits: bool
    megatron_fits: bool
    baselines_fitting: int
    baselines_total: int
    # The tuned time over the joint bound (any plan) and over its own partition's bound (any
    # order of its stages): sim/bounds.py; NaN with steps overlapped, where neither applies.
    over_joint: float = math.nan
    over_plan: float = math.nan

    @property
    def bound_vs_best(self) -> float:
        """The speedup over the best baseline if the tuned partition ran with no bubble at all."""
        return self.vs_best * self.balance_ceiling / self.efficiency


def run_case(
    case: Case, budget: float, torchtitan: bool = False, overlap_steps: bool = False
) -> Row:
    profile = profile_for(case)
    started, cpu_started = time.perf_counter(), time.process_time()
    baselines = all_baselines(profile, case.devices, case.microbatches)
    result = tune(
        profile,
        case.microbatches,
        case.devices,
        baselines=baselines,
        time_budget=budget,
        torchtitan=torchtitan,
        overlap_steps=overlap_steps,
    )
    # Baselines included: what `octopipe plan` pays.
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    tuned = result.best.sim
    fitting = [b for b in result.baselines if b.sim.fits]
    # With no fitting baseline, compare with the fastest one anyway (it needs more memory).
    best = min(fitting or result.baselines, key=lambda b: b.sim.iteration_time)
    # Absent when the model has too few layers for two chunks per device.
    megatron = next((b for b in result.baselines if b.label == MEGATRON), None)
    megatron_time = megatron.sim.iteration_time if megatron else math.nan
    ceiling = balance_ceiling(profile, result.best.plan, tuned.lower_bound)
    over_joint = over_plan = math.nan
    if not overlap_steps:
        bounds = Simulator(profile).bounds(result.best.plan)
        over_joint = tuned.iteration_time / bounds.joint - 1
        over_plan = tuned.iteration_time / bounds.plan - 1
    return Row(
        case,
        tuned.efficiency,
        ceiling,
        megatron_time / tuned.iteration_time,
        best.sim.iteration_time / tuned.iteration_time,
        best.label,
        seconds,
        cpu,
        result.evaluations,
        result.best.label,
        tuned.fits,
        megatron is not None and megatron.sim.fits,
        len(fitting),
        len(result.baselines),
        over_joint,
        over_plan,
    )


def balance_ceiling(profile: Profile, plan: Plan, lower_bound: float) -> float:
    """LB / (M x the most loaded device's work per microbatch): what layer granularity leaves."""
    ranges = tuple((s.start, s.end) for s in plan.stages)
    speeds = [d.speed for d in profile.device_list(plan.num_devices)]
    loads = device_loads(CostTable(profile).work, ranges, plan.placement, speeds)
    return lower_bound / (plan.num_microbatches * max(loads))


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def zoo_table(rows: list[Row]) -> str:
    lines = [
        "| case | P x M | efficiency | over the joint bound | over its partition's bound "
        + "| balance ceiling | vs Megatron i1F1B | vs best baseline"
        + " (which) | bubble-free bound vs best | tuning s (CPU s) | tuned from |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        mega = f"{r.vs_megatron:.3f}x" + ("" if r.megatron_fits else " (i1F1B does not fit)")
        lines.append(
            f"| {r.case.label} | {r.case.devices} x {r.case.microbatches} | {r.efficiency:.3f}"
            f"{'' if r.fits else ' (no fit)'} | {r.over_joint:.2%} | {r.over_plan:.2%} | "
            f"{r.balance_ceiling:.3f} | {mega} | "
            f"{r.vs_best:.3f}x ({r.best_label}) | {r.bound_vs_best:.3f}x | "
            f"{r.seconds:.1f} ({r.cpu_seconds:.1f}) | {r.tuned_label} |"
        )
    lines.append(
        f"| **geometric mean** | | **{geomean([r.efficiency for r in rows]):.3f}** | "
        f"**{_mean([r.over_joint for r in rows]):.2%}** (mean) | "
        f"{_mean([r.over_plan for r in rows]):.2%} (mean) | | "
        f"**{geomean([r.vs_megatron for r in rows]):.3f}x** | "
        f"**{geomean([r.vs_best for r in rows]):.3f}x** | "
        f"{geomean([r.bound_vs_best for r in rows]):.3f}x | | |"
    )
    return "\n".join(lines)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def scaling_table(rows: list[Row]) -> str:
    lines = [
        "| case | candidates | tuning s (CPU s) | efficiency | balance ceiling |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.case.label} | {r.evaluations} | "
            f"{r.seconds:.1f} ({r.cpu_seconds:.1f}) | "
            f"{r.efficiency:.3f} | {r.balance_ceiling:.3f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="zoo only, no scaling runs")
    parser.add_argument("--budget", type=float, default=60.0, help="tuner time budget per case")
    parser.add_argument(
        "--shipped",
        action="store_true",
        help="only the shipped models with `octopipe plan`'s defaults",
    )
    parser.add_argument(
        "--torchtitan",
        action="store_true",
        help="tune only placements torchtitan builds (baselines likewise)",
    )
    parser.add_argument(
        "--overlap-steps",
        action="store_true",
        help="rank plans by their steady step time with steps back to back (efficiency too)",
    )
    args = parser.parse_args()
    if args.shipped:
        print(shipped_table([run_case(c, args.budget, args.torchtitan) for c in shipped_cases()]))
        return
    rows = []
    for case in ZOO:
        rows.append(run_case(case, args.budget, args.torchtitan, args.overlap_steps))
        print(f"<!-- {case.label}: {rows[-1].seconds:.1f} s -->", flush=True)
    print(zoo_table(rows))
    print()
    tight = run_case(NO_BASELINE_FITS, args.budget, overlap_steps=args.overlap_steps)
    print(
        f"{tight.case.label}: the tuned plan {'fits' if tight.fits else 'does NOT fit'} "
        f"(efficiency {tight.efficiency:.3f}, {tight.seconds:.1f} s, "
        f"{tight.cpu_seconds:.1f} CPU s); "
        f"{tight.baselines_fitting} of {tight.baselines_total} baselines fit."
    )
    if not args.quick:
        print()
        print(
            scaling_table(
                [run_case(c, args.budget, overlap_steps=args.overlap_steps) for c in SCALING]
            )
        )


if __name__ == "__main__":
    main()
