"""Tight memory: the tuner with and without recomputation per stage, beside recomputing every layer.

    .venv/bin/python benchmarks/bench_recompute.py           # about 10 minutes

Profiles of bench_tuner.py's kind (H100, sequence 4096, micro-batch 1), every device's memory
capped below what the fastest plans need. Each case is tuned with every baseline, to
convergence, four ways:

- *no per-stage choice*: the profile without its `recompute` keys, as the tuner saw it
  before per-stage recomputation (no stage recomputes);
- *per stage* (the default): the tuner chooses what each stage recomputes (AdaPipe's variable);
- *all full*, *all selective*: the profile estimated with every block recomputed so (the
  global flag, `profile-arch --recompute`, Megatron-LM's recompute granularity).

Times are simulated (deterministic; efficiency is the physical limit without recomputation over
the time); seconds are this machine's, baselines included.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass

from octopipe.baselines import all_baselines
from octopipe.costmodel import load_architecture
from octopipe.costmodel.build import build_profile
from octopipe.costmodel.hardware import hardware_preset
from octopipe.costmodel.settings import Settings
from octopipe.profile import Profile
from octopipe.sim import lower_bound
from octopipe.tuner import tune
from octopipe.units import GIB


@dataclass(frozen=True)
class Tight:
    label: str
    model: str
    devices: int
    microbatches: int
    tp: int
    memory_gib: float


CASES = (
    Tight("llama3-70b tp4, 48 GiB", "llama3-70b", 8, 32, 4, 48),
    Tight("llama3-70b tp4, 56 GiB", "llama3-70b", 8, 32, 4, 56),
    Tight("gemma2-9b, 48 GiB", "gemma2-9b", 4, 32, 1, 48),
    Tight("nemotron-h-8b, 40 GiB", "nemotron-h-8b", 4, 32, 1, 40),
    Tight("qwen1.5-moe-a2.7b tp2, 32 GiB", "qwen1.5-moe-a2.7b", 4, 32, 2, 32),
)


def profile_of(case: Tight, recompute: str = "none") -> Profile:
    settings = Settings(tensor_parallel=case.tp, recompute=recompute)
    arch, h100 = load_architecture(case.model), hardware_preset("h100")
    profile = build_profile(arch, h100, settings, case.devices)
    devices = tuple(
        d.model_copy(update={"memory_bytes": case.memory_gib * GIB}) for d in profile.devices
    )
    return profile.with_devices(devices)


def without_choices(profile: Profile) -> Profile:
    layers = tuple(layer.model_copy(update={"recompute": None}) for layer in profile.layers)
    return profile.model_copy(update={"layers": layers})


def cell(case: Tight, profile: Profile, limit: float) -> str:
    started = time.perf_counter()
    base = all_baselines(profile, case.devices, case.microbatches)
    best = tune(profile, case.microbatches, case.devices, baselines=base, time_budget=math.inf).best
    seconds = time.perf_counter() - started
    sim = best.sim
    if not sim.fits:
        return f"does not fit ({seconds:.0f} s)"
    kinds = Counter(best.plan.recompute_of(s) for s in range(best.plan.num_stages))
    chosen = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()) if k != "none")
    chosen = f"; {chosen} of {best.plan.num_stages}" if best.plan.recompute else ""
    return f"{sim.iteration_time:.4f} ({limit / sim.iteration_time:.3f}{chosen}; {seconds:.0f} s)"


def main() -> None:
    print(
        "| case | P x M | no per-stage choice: s (efficiency; search s) | per stage "
        "(stages recomputing) | all full | all selective |"
    )
    print("|---|---|---|---|---|---|")
    for case in CASES:
        plain = profile_of(case)
        limit = lower_bound(plain, plain.device_list(), case.microbatches)
        cells = [
            cell(case, without_choices(plain), limit),
            cell(case, plain, limit),
            cell(case, profile_of(case, "full"), limit),
            cell(case, profile_of(case, "selective"), limit),
        ]
        print(
            f"| {case.label} | {case.devices} x {case.microbatches} | {' | '.join(cells)} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
