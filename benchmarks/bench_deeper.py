"""Deeper interleaving by default: the authors' kind of profile, and the zoo, capped and not.

    .venv/bin/python benchmarks/bench_deeper.py            # about 3 minutes
    .venv/bin/python benchmarks/bench_deeper.py --long     # with long reference searches (~1 h)
    .venv/bin/python benchmarks/bench_deeper.py --zoo      # bench_tuner.py's zoo instead

The published authors' tuner was measured on its own per-layer profiles of dense and hybrid
models (56-98 layers, 4 devices, 8 microbatches, no communication cost, no memory limit); neither
those profiles nor that tuner are here. These are profiles of that kind built from the analytic
cost model (H100, sequence 4096, micro-batch 1): shipped configs and two shapes from public
configs, with free transfers and unlimited memory. Each is tuned with every baseline as
`octopipe plan` does, to convergence, once with `max_chunks=4` (the default until now: the
first search alone) and once by default (as deep as it pays, up to 8 stages per device).
`--long` adds a long reference search per profile: the tuner's iterated local search run on
its own at each chunk count from 3 to 9, from 8 starts with 5 kicks each (the default: 5 and 3,
all chunk counts sharing them), the best kept. Simulated times are deterministic; seconds are
this machine's.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import bench_tuner as bt

from octopipe.baselines import all_baselines
from octopipe.costmodel import load_architecture
from octopipe.costmodel.build import build_profile
from octopipe.costmodel.hardware import hardware_preset
from octopipe.costmodel.hf_config import architecture_from_hf
from octopipe.costmodel.settings import Settings
from octopipe.profile import Device, Link, Profile
from octopipe.sim import Simulator
from octopipe.tuner import tune
from octopipe.tuner.candidate import Evaluator
from octopipe.tuner.local_search import Search
from octopipe.tuner.seeds import seed_candidates

P, M = 4, 8
CONFIGS = Path(__file__).resolve().parents[1] / "src/octopipe/costmodel/configs"

# Nemotron-H's layer pattern (Mamba, MLP, every fifth mixer attention) over 95 blocks: a hybrid
# stack as deep as the authors' deepest.
NEMOTRON = json.loads((CONFIGS / "nemotron-h-8b.json").read_text())
HYBRID_95 = dict(NEMOTRON, num_hidden_layers=95, hybrid_override_pattern=("M-M-M-M*-" * 11)[:95])
# Qwen2.5-32B's shape (its public config.json): 64 decoder layers.
QWEN_32B = {
    "model_type": "qwen2",
    "vocab_size": 152064,
    "hidden_size": 5120,
    "intermediate_size": 27648,
    "num_hidden_layers": 64,
    "num_attention_heads": 40,
    "num_key_value_heads": 8,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": False,
}


@dataclass(frozen=True)
class Stack:
    label: str
    arch: object
    tp: int = 1


def stacks() -> list[Stack]:
    return [
        Stack("hybrid: nemotron-h-8b, 55 layers", load_architecture("nemotron-h-8b")),
        Stack("hybrid: nemotron-h pattern, 98 layers", architecture_from_hf(HYBRID_95, "", "h98")),
        Stack("hybrid: llama3.2-11b-vision, 85 layers", load_architecture("llama3.2-11b-vision")),
        Stack("dense: gemma3-27b tp2, 65 layers", load_architecture("gemma3-27b"), 2),
        Stack("dense: qwen2.5-32b tp4, 67 layers", architecture_from_hf(QWEN_32B, "", "q32"), 4),
        Stack("dense: llama3-70b tp8, 83 layers", load_architecture("llama3-70b"), 8),
    ]


def authors_kind(stack: Stack) -> Profile:
    """No communication cost, no memory limit."""
    settings = Settings(tensor_parallel=stack.tp)
    profile = build_profile(stack.arch, hardware_preset("h100"), settings, P)
    free = Link(bandwidth=1e18, latency=0.0)
    return profile.model_copy(update={"link": free, "devices": tuple(Device() for _ in range(P))})


def counts(placement) -> str:
    """Stages per device, device 0 first."""
    per = Counter(placement)
    return "/".join(str(per[d]) for d in range(max(placement) + 1))


def tuned(profile: Profile, devices: int, microbatches: int, base, max_chunks):
    started = time.perf_counter()
    result = tune(
        profile,
        microbatches,
        devices,
        baselines=base,
        time_budget=math.inf,
        max_chunks=max_chunks,
    )
    return result.best, time.perf_counter() - started


def long_reference(profile: Profile) -> tuple[float, str, float]:
    """The best of a full iterated local search at each chunk count alone (module docstring)."""
    started, best = time.perf_counter(), None
    simulator = Simulator(profile)
    for chunks in range(3, min(9, profile.num_layers // P) + 1):
        evaluator = Evaluator(profile, profile.device_list(), M, simulator.costs)
        search = Search(evaluator, math.inf, 0, None, lambda _: True)
        search.run(seed_candidates(evaluator, chunks, chunks), starts=8, kicks=5)
        plan = evaluator.to_plan(search.best)
        seconds = simulator.run(plan, detail=False).iteration_time
        if best is None or seconds < best[0]:
            best = (seconds, counts(plan.placement))
    assert best is not None
    return best[0], best[1], time.perf_counter() - started


def authors_table(long: bool) -> None:
    head = "| profile | capped at 4: s (stages per device, search s) | default | change |"
    rule = "|---|---|---|---:|"
    if long:
        head += " long reference (s, stages, search s) | default vs reference |"
        rule += "---|---:|"
    print(head)
    print(rule)
    ratios: list[tuple[float, float]] = []
    for stack in stacks():
        profile = authors_kind(stack)
        base = all_baselines(profile, P, M)
        (capped, s1), (auto, s2) = (tuned(profile, P, M, base, c) for c in (4, None))
        t1, t2 = capped.sim.iteration_time, auto.sim.iteration_time
        row = (
            f"| {stack.label} | {t1:.6f} ({counts(capped.plan.placement)}, {s1:.1f} s) | "
            f"{t2:.6f} ({counts(auto.plan.placement)}, {s2:.1f} s) | {t2 / t1 - 1:+.2%} |"
        )
        ref = math.nan
        if long:
            ref, stages, s3 = long_reference(profile)
            row += f" {ref:.6f} ({stages}, {s3:.0f} s) | {t2 / ref:.4f}x |"
        ratios.append((t2 / t1, t2 / ref))
        print(row, flush=True)
    geo = [bt.geomean([r[i] for r in ratios]) for i in range(2)]
    summary = f"| **geometric mean** | | | **{geo[0] - 1:+.2%}** |"
    if long:
        summary += f" | **{geo[1]:.4f}x** (worst {max(r[1] for r in ratios):.4f}x) |"
    print(summary)


def zoo_table() -> None:
    print("| case | capped at 4: s (stages per device, search s) | default | change |")
    print("|---|---|---|---:|")
    for case in bt.ZOO:
        profile = bt.profile_for(case)
        base = all_baselines(profile, case.devices, case.microbatches)
        cells = [tuned(profile, case.devices, case.microbatches, base, c) for c in (4, None)]
        (capped, s1), (auto, s2) = cells
        t1, t2 = capped.sim.iteration_time, auto.sim.iteration_time
        print(
            f"| {case.label} | {t1:.6f} ({counts(capped.plan.placement)}, {s1:.1f} s) | "
            f"{t2:.6f} ({counts(auto.plan.placement)}, {s2:.1f} s) | {t2 / t1 - 1:+.2%} |",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--long", action="store_true", help="add the long reference searches")
    parser.add_argument("--zoo", action="store_true", help="bench_tuner.py's zoo instead")
    args = parser.parse_args()
    if args.zoo:
        zoo_table()
    else:
        authors_table(args.long)


if __name__ == "__main__":
    main()
