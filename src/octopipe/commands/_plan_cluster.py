"""`octopipe plan --gpus N`: lay a model out on a cluster (TP x PP x DP, microbatches).

Screens every layout, tunes the best few under the shared `--time-budget`, prints them best
first beside Megatron-LM's usual layout, and writes the best plan (with its `parallelism`) and
the profile it was planned on to the output folder. The search lives in `octopipe.layouts.search`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from octopipe.api import plan_layout
from octopipe.commands._flags import count
from octopipe.commands._output_paths import check_output_folder
from octopipe.commands._plan_outputs import pictures_fit, since, write_outputs
from octopipe.errors import InputError, MemoryExceededError
from octopipe.layouts import Job, LayoutReport, Row
from octopipe.limits import MAX_GLOBAL_BATCH
from octopipe.profile import save_profile
from octopipe.units import GIB

SHOWN_ROWS = 10
DEFAULT_MODEL = "gemma2-9b"  # as the single-pipeline plan's
# Options of the single-pipeline `plan` that a cluster layout decides itself.
DECIDED = ("profile", "devices", "microbatches", "tp", "micro_batch_size", "memory_limit")


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("cluster layout (with --gpus: choose TP, PP, DP and microbatches)")
    g.add_argument(
        "--gpus",
        help="GPUs of the cluster: a count of --hardware GPUs (16) or counts of presets "
        "(4xh100,4xa100: whole nodes of each); plans the layout instead of one pipeline",
    )
    g.add_argument("--gpus-per-node", type=count(1, 1024), default=8, help="GPUs per node")
    g.add_argument(
        "--global-batch",
        type=count(1, MAX_GLOBAL_BATCH),
        default=512,
        help="samples (of --seq-len tokens) per step: DP x microbatches x microbatch size",
    )


def run(args: argparse.Namespace) -> int:
    given = [f"--{k.replace('_', '-')}" for k in DECIDED if getattr(args, k, None) is not None]
    if given:
        raise InputError(given[0], "the cluster layout decides this itself; drop it or --gpus")
    started = time.perf_counter()
    out = Path(args.output)
    check_output_folder("--output", out)  # before the search: a bad folder fails at once
    show = not args.quiet and sys.stderr.isatty()
    with _progress(show) as report:
        result = plan_layout(
            args.model or DEFAULT_MODEL,
            args.gpus,
            global_batch=args.global_batch,
            gpus_per_node=args.gpus_per_node,
            hardware=args.hardware,
            seq_len=args.seq_len,
            time_budget=args.time_budget - since(started),
            seed=args.seed,
            max_chunks=args.max_chunks,
            progress=report,
            overlap_steps=args.overlap_steps,
        )
    job = result.job
    console = Console()
    console.print(layout_table(result, job, args.overlap_steps))
    best = result.best
    if not best.sim.fits:  # the table (stdout) shows the leanest first; the refusal is one line
        sim = best.sim
        d = max(range(sim.num_devices), key=lambda i: sim.memory_excess_bytes[i])
        raise MemoryExceededError(
            f"no layout fits the GPUs' memory: the leanest, {best.layout.describe()}, needs "
            f"{sim.memory_excess_bytes[d] / GIB:.2f} GiB more on device {d}"
        )
    out.mkdir(parents=True, exist_ok=True)
    lay = best.layout
    plan = best.plan.with_parallelism(lay.tp, lay.dp, lay.microbatch_size, int(lay.zero1))
    plan = plan.with_predicted(best.sim.predicted())
    save_profile(best.profile, out / "profile.json")
    left = args.time_budget - since(started)
    written = write_outputs(plan, best.profile, out, pictures=args.png and pictures_fit(plan, left))
    console.print(
        f"{job.cluster.describe()}: screened {result.screened} of {result.candidates} layouts, "
        f"tuned {result.tuned}, in {result.seconds:.1f} s; wrote profile.json, "
        + ", ".join(written)
    )
    return 0


def layout_table(result: LayoutReport, job: Job, overlap_steps: bool = False) -> Table:
    overlapped = ", steps overlapped (step s: steady state; Megatron-LM synchronous)"
    table = Table(
        title=f"{job.config} on {job.cluster.describe()}, global batch {job.global_batch} x "
        f"{job.seq_len} tokens: layouts (simulated){overlapped if overlap_steps else ''}",
        caption="DP Z1: optimizer state sharded across DP (ZeRO-1); b x M: samples per "
        "microbatch x microbatches per step; Megatron-LM: its usual layout, interleaved 1F1B "
        "over a uniform partition (1F1B with one stage)",
    )
    for col in ("TP", "PP", "DP", "b x M"):
        table.add_column(col, justify="right", no_wrap=True)
    table.add_column("plan")
    for col in ("step s", "tok/s/GPU", "GiB", "fits"):
        table.add_column(col, justify="right", no_wrap=True)

    def add(row: Row, bold: bool = False) -> None:
        lay, sim = row.layout, row.sim
        cells = [
            str(lay.tp),
            str(lay.pp),
            f"{lay.dp} Z1" if lay.zero1 else str(lay.dp),
            f"{lay.microbatch_size} x {lay.num_microbatches}",
            row.label,
            f"{row.step_time:.3f}",
            f"{row.tokens_per_gpu(job):,.0f}",
            f"{max(sim.peak_memory_bytes) / GIB:.1f}",
            "yes" if sim.fits else "[red]no[/red]",
        ]
        table.add_row(*(f"[bold]{c}[/bold]" for c in cells) if bold else cells)

    for i, row in enumerate(result.rows[:SHOWN_ROWS]):
        add(row, bold=i == 0)
    if result.reference is not None:
        table.add_section()
        add(result.reference)
    return table


class _progress:
    """A rich progress bar on stderr over the time budget, saying what is being planned."""

    def __init__(self, show: bool):
        self.show = show
        self.bar: Progress | None = None

    def __enter__(self):
        if not self.show:
            return None
        self.bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        self.bar.start()
        self.task = self.bar.add_task("layouts", total=1.0)
        return self.report

    def report(self, what: str, fraction: float) -> None:
        assert self.bar is not None
        self.bar.update(self.task, completed=fraction, description=what)

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()
