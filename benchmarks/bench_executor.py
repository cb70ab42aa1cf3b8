"""Executor benchmark: measured against the simulator and against PyTorch.

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

Modules beside this script: `executor_runs` (models, profiling and planning through the CLI,
steps 1-3 and the runs of step 5), `executor_trace` (step 4's reading of the trace),
`executor_report` (the Markdown tables and figures), `executor_backward` (step 6).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from executor_backward import backward_table
from executor_report import report, second_pass_lines
from executor_runs import MODELS, measure, profile_and_plan, second_pass


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
