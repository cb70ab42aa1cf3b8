"""Randomized check of the executor: random valid plans must train exactly like one process.

`random_plan` draws a contiguous partition, a placement (any map of stages to devices), a full
or split backward per (stage, microbatch), and a random topological order of all actions, dealt
out to the devices, which is valid by construction. Run hundreds with

    python -m octopipe.runtime.fuzz --plans 300 --nproc 4 --model tiny-hybrid
    PYTHONPATH=tests python -m octopipe.runtime.fuzz --plans 300 --model executor_helpers:toy_model

Each launch runs a batch of plans in one process group; any mismatch with single-process
training (loss, any parameter or gradient beyond `--tol` relative difference) is printed with its
plan and makes the exit status 1.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time

from octopipe.plan import Plan
from octopipe.random_plans import random_plan as random_valid_plan
from octopipe.runtime.job.run_config import Job, RunConfig
from octopipe.runtime.launch.launcher import launch
from octopipe.runtime.model.load import load_recipe
from octopipe.runtime.reference import mismatches, train_reference
from octopipe.runtime.step.optim import OptimizerConfig


def random_plan(
    rng: random.Random, num_layers: int, num_devices: int, max_stages: int, max_microbatches: int
) -> Plan:
    """A random valid plan with a random microbatch count and share of split backwards (some plans
    all B, some all I/W, most mixed)."""
    return random_valid_plan(
        rng,
        num_layers,
        num_devices,
        rng.randint(1, max_microbatches),
        max_stages,
        split_probability=rng.random(),
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m octopipe.runtime.fuzz", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--model", required=True, help="bundled model name or module:factory")
    ap.add_argument("--plans", type=int, default=100)
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--per-launch", type=int, default=25, help="plans run in one process group")
    ap.add_argument("--max-stages", type=int, default=8)
    ap.add_argument("--max-microbatches", type=int, default=6)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tol", type=float, default=1e-5)
    ap.add_argument(
        "--optimizer",
        choices=("sgd", "adam"),
        default="sgd",
        help="sgd (momentum 0.9) by default: Adam turns rounding noise in near-zero "
        "gradients into visible parameter differences after one step",
    )
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    num_layers = len(load_recipe(args.model).layers)
    optimizer = (
        OptimizerConfig("adam", lr=0.01)
        if args.optimizer == "adam"
        else OptimizerConfig("sgd", 0.05, 0.9)
    )
    cfg = RunConfig(
        args.model, seed=args.seed, steps=args.steps, optimizer=optimizer, collect_state=True
    )
    failures, done, began = 0, 0, time.perf_counter()
    references = {}
    while done < args.plans:
        plans = [
            random_plan(rng, num_layers, args.nproc, args.max_stages, args.max_microbatches)
            for _ in range(min(args.per_launch, args.plans - done))
        ]
        results = launch([Job(p, cfg) for p in plans], args.nproc, "gloo")
        for plan, result in zip(plans, results):
            m = plan.num_microbatches
            if m not in references:
                references[m] = train_reference(cfg, m)
            problems = mismatches(result, references[m], args.tol)
            if problems:
                failures += 1
                print(f"MISMATCH: {'; '.join(problems[:3])}\n  plan: {json.dumps(plan.to_dict())}")
        done += len(plans)
        print(
            f"{done}/{args.plans} plans, {failures} mismatched, "
            f"{time.perf_counter() - began:.1f} s",
            flush=True,
        )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
