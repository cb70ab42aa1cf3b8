"""`octopipe plan --gpus N`: lay a model out on a cluster (TP x CP x PP x DP x EP, microbatches,
recomputation, optimizer sharding) for the engine `--runner` names (`octopipe run`, torchtitan or
Megatron-LM), written as that engine's export.

Plans Megatron-LM's usual layout, the model's published recipe (and the user's `--from-layout`)
first, screens every layout best bound first (with the standard schedules beside: the
`best_standard` row), tunes the best few, prints them best first beside those references and
which layers each device holds, writes the best plan (with its `parallelism`) and the profile
it was planned on, and prints how to launch it. On a terminal a live line says how far the
search is (`--quiet` and `--json` keep it off; nothing is drawn in a pipe).
The search lives in `octopipe.layouts.search`; its work is counted in layouts and
evaluations, so the answer is the same on any machine unless `--time-budget` cuts it (the
output then says so).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from octopipe.commands._device_layers import device_layers, print_wide
from octopipe.commands._plan_band import band_cell, row_band, within_error_line
from octopipe.commands._plan_progress import SearchLine
from octopipe.commands._stack_args import add_stack_arguments, stack_from_args
from octopipe.config.flags import count
from octopipe.config.planning import add_job_flags, resolved
from octopipe.engines import ENGINES, Exports, get_engine
from octopipe.errors import InputError, MemoryExceededError
from octopipe.layouts import Job, LayoutReport, Row
from octopipe.layouts.cluster import parse_gpus
from octopipe.layouts.planner import TUNE_EVALUATIONS
from octopipe.layouts.search import DEFAULT_TIME_BUDGET
from octopipe.limits import MAX_WORKERS
from octopipe.units import GIB, fmt_bytes

SHOWN_ROWS = 10
DEFAULT_MODEL = "gemma2-9b"  # as the single-pipeline plan's
# Options of the single-pipeline `plan` that a cluster layout decides itself.
DECIDED = ("profile", "devices", "microbatches", "tp", "micro_batch_size", "memory_limit")


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "cluster layout (with --gpus: choose TP, CP, PP, DP, EP, microbatches, recomputation)"
    )
    # The job's settings, each its one definition (`octopipe.config`); --gpus plans the layout
    # instead of one pipeline.
    add_job_flags(g, ("cluster.gpus", "cluster.gpus_per_node", "data.global_batch"))
    chosen = g.add_mutually_exclusive_group()
    chosen.add_argument(
        "--from-layout",
        metavar="LAYOUT",
        help="your own layout to beat, e.g. tp8,pp16,dp24,b1,v2 (cpN, epN, z1, z3, selective or "
        "full also): planned as `octopipe estimate` plans it, tuned, shown beside the answer",
    )
    chosen.add_argument(
        "--layout",
        metavar="LAYOUT",
        help="exactly this layout (as --from-layout writes it): tuned, written and launched as "
        "the answer, with every note; the search's other layouts are not tried",
    )
    add_job_flags(g, ("cluster.memory_headroom",))
    g.add_argument(
        "--tune-evaluations",
        type=count(1, 10**7),
        default=TUNE_EVALUATIONS,
        help="the tuner's evaluations per tuned layout: the search's work, the same on any machine",
    )
    g.add_argument(
        "--runner",
        choices=ENGINES,
        help="the engine the answer is for (default octopipe: `octopipe run`): the search keeps "
        "to the layouts, schedules, placements and memory techniques it runs, priced as it runs "
        "them; torchtitan: FSDP/HSDP or DDP, written as octopipe_torchtitan.py; megatron: "
        "(interleaved) 1F1B looped, the distributed optimizer, written as megatron_args.sh",
    )
    g.add_argument(
        "--workers",
        type=count(1, MAX_WORKERS),
        help="processes the search runs on: the next layout screened and the finalists tuned "
        "side by side (default: the cores this process may use); the answer is the same for any, "
        "and 1 may be faster on a machine busy with other work",
    )
    g.add_argument(
        "--json",
        action="store_true",
        help="the chosen layout and those it is set beside as JSON on the last line "
        '({"chosen", "best_standard", "recipe", "reference", "given", "search"})',
    )
    add_stack_arguments(p)
    add_job_flags(p, ("shape.rank_order", "precision.precision", "precision.fp8_scaling"))


def run(args: argparse.Namespace) -> int:
    from octopipe.api import plan_layout

    given = [f"--{k.replace('_', '-')}" for k in DECIDED if getattr(args, k, None) is not None]
    if given:
        raise InputError(given[0], "the cluster layout decides this itself; drop it or --gpus")
    if args.moe_a2a_overlap:  # priced by `estimate`, but no runner's export writes it
        raise InputError(
            "--moe-a2a-overlap",
            "prices a published Megatron-Core run with `octopipe estimate`; no plan --gpus "
            "runner's export overlaps MoE all-to-alls, so its answer would not run as priced",
        )
    show = not (args.quiet or args.json) and sys.stderr.isatty()
    if args.gpus_per_node is None:  # the preset's NVLink domain
        groups = parse_gpus(args.gpus, args.hardware)
        args.gpus_per_node = min(g.hardware.nvlink_domain for g in groups)
    with SearchLine(show) as report:
        result = plan_layout(
            args.model or DEFAULT_MODEL,
            args.gpus,
            global_batch=resolved(args, "data.global_batch"),
            gpus_per_node=args.gpus_per_node,
            hardware=args.hardware,
            seq_len=resolved(args, "data.seq_len"),
            stack=stack_from_args(args),
            memory_headroom=args.memory_headroom,
            rank_order=args.rank_order,  # None: the runner's own numbering
            output=Path(args.output),
            exports=exports_of(args),
            pictures=args.png,
            time_budget=DEFAULT_TIME_BUDGET if args.time_budget is None else args.time_budget,
            tune_evaluations=args.tune_evaluations,
            seed=args.seed,
            max_chunks=args.max_chunks,
            progress=report,
            overlap_steps=args.overlap_steps,
            from_layout=_given_layout(args),
            exact=args.layout is not None,
            torchtitan=args.torchtitan,
            runner=args.runner,
            workers=args.workers,
        )
    _print_answer(result, args)
    if args.json:
        print(json.dumps(json_summary(result)))
    return 0


def _given_layout(args: argparse.Namespace):
    from octopipe.layouts.spec import parse_layout

    if args.layout is not None:
        return parse_layout(args.layout, "--layout")
    return parse_layout(args.from_layout) if args.from_layout else None


def exports_of(args: argparse.Namespace) -> Exports:
    """The export flags `plan` was given."""
    return Exports(
        torchtitan_config=args.torchtitan_config,
        torchtitan_assets=args.torchtitan_assets,
        torchtitan_data=args.torchtitan_data,
        megatron=args.megatron,
    )


def _print_answer(result: LayoutReport, args: argparse.Namespace) -> None:
    """The table and its notes; the refusal where nothing fits; else which layers each device
    holds, what was written and how to launch it."""
    job, best = result.job, result.best
    console = Console()
    print_wide(console, layout_table(result, job, args.overlap_steps))
    engine = get_engine(result.runner).title
    for name, why in result.not_runnable:
        shown = {"reference": "Megatron-LM", "given": "given"}.get(name, name)
        console.print(f"note: {shown} not run by {engine}: {why}", highlight=False)
    for note in result.notes:
        console.print(f"[yellow]note: {note}[/yellow]")
    if not best.sim.fits:  # the table (stdout) shows the leanest first; the refusal is one line
        raise MemoryExceededError(
            f"no layout fits {job.cluster.size} GPUs' memory (less {args.memory_headroom:.0%} "
            f"headroom): the leanest, {best.layout.describe()}, lacks "
            f"{fmt_bytes(best.memory_lacking_bytes)} a GPU"
        )
    console.print("which layers each device holds (the chosen plan):")
    for line in device_layers(best.plan, best.profile.layer_names):
        console.print(f"  {line}", highlight=False, soft_wrap=True)
    if best.sim.steady is None:  # one synchronous step: the bounds apply
        bounds = pipeline_bounds(best)
        console.print(
            f"its pipeline: {bounds.describe(best.sim.iteration_time)}",
            highlight=False,
            soft_wrap=True,
        )
    if best.plan.num_devices == 1 and len(best.plan.stages) > 1:
        console.print(
            f"  (PP 1: these {len(best.plan.stages)} chunks are no pipeline stages; each "
            "chunk's gradient reduction starts once its backward is done, under the backward "
            "work left on the others, as gradient buckets would)",
            highlight=False,
            soft_wrap=True,
        )
    written = result.written
    assert written is not None  # written wherever the answer fits
    for note in written.notes:
        Console(stderr=True).print(f"note: {note}", highlight=False)
    console.print(
        f"{job.cluster.describe()}: {_search_counts(result)}, {result.tuned} tuned "
        f"({result.evaluations:,} evaluations) in {result.seconds:.1f} s; "
        "wrote " + ", ".join(written.files),
        highlight=False,
    )
    for line in written.lines:
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    within = within_error_line(result)
    if within:
        console.print(within, markup=False, highlight=False, soft_wrap=True)


def _search_counts(result: LayoutReport) -> str:
    """What became of every layout of the space, in parts that add up to the whole."""
    parts = [
        f"{result.unfit} set aside for memory",
        f"{result.screened_in_space} screened",
    ]
    if result.skipped:
        parts.append(f"{result.skipped} left as a heavier recomputation of one that fits")
    parts.append(f"{result.pruned} left out by their bounds")
    extra = result.screened - result.screened_in_space
    besides = f"; {extra} reference layout{'s' * (extra > 1)} besides" if extra > 0 else ""
    layouts = f"{result.candidates} layout{'s' * (result.candidates != 1)}"
    return f"{layouts} ({', '.join(parts)}{besides})"


def pipeline_bounds(row: Row):
    """The bounds of the row's pipeline (its step less the optimizer update after it), on its
    first replica's devices: `sim/bounds.py`."""
    from octopipe.sim import Simulator

    return Simulator(row.profile).bounds(row.plan)


def json_summary(result: LayoutReport) -> dict:
    def summary(row: Row | None) -> dict | None:
        if row is None:
            return None
        band = row_band(row, result.job)
        return {**row.summary(), "error_band": {**band.summary(), "like": band.describe()}}

    refused = dict(result.not_runnable)

    def reference(name: str, row: Row | None) -> dict | None:
        if row is None:
            return None
        out = {**summary(row), "runnable": name not in refused}
        return {**out, "not_runnable": refused[name]} if name in refused else out

    return {
        "runner": result.runner,
        "chosen": {
            **summary(result.best),
            **(
                {"bounds": pipeline_bounds(result.best).to_json()}
                if result.best.sim.fits and result.best.sim.steady is None
                else {}
            ),
        },
        "within_model_error": within_error_line(result),
        "best_standard": summary(result.best_standard),
        "recipe": {**reference("recipe", result.recipe), "source": result.recipe_source}
        if result.recipe is not None
        else None,
        "reference": reference("reference", result.reference),
        "given": summary(result.given),
        "search": {
            "candidates": result.candidates,
            "screened": result.screened,
            # what became of every layout: these four add up to "candidates"
            "set_aside_for_memory": result.unfit,
            "screened_in_space": result.screened_in_space,
            "heavier_recomputation": result.skipped,
            "left_out_by_bounds": result.pruned,
            "tuned": result.tuned,
            "evaluations": result.evaluations,
            "seconds": result.seconds,
            "cut_by_time": result.cut_by_time,
            "workers": result.workers,
        },
    }


def layout_table(result: LayoutReport, job: Job, overlap_steps: bool = False) -> Table:
    overlapped = ", steps overlapped (step s: steady state; Megatron-LM synchronous)"
    engine = get_engine(result.runner).title
    table = Table(
        title=f"{job.config} on {job.cluster.describe()}, global batch {job.global_batch} x "
        f"{job.seq_len} tokens: layouts for {engine} (--runner {result.runner}, simulated)"
        f"{overlapped if overlap_steps else ''}",
        caption=_caption(result),
    )
    references = _references(result)
    shown = [*result.rows[:SHOWN_ROWS], *(row for _, row in references)]
    degrees = ["TP", "CP", "PP", "DP", "EP", "b x M", "R", "ranks"]
    if len({r.layout.rank_order for r in shown}) == 1:
        degrees.remove("ranks")
    if all(r.layout.cp == 1 for r in shown):
        degrees.remove("CP")
    if all(r.layout.ep == 1 for r in shown):
        degrees.remove("EP")
    if all(r.layout.recompute == "none" for r in shown):
        degrees.remove("R")
    for col in degrees:
        table.add_column(col, justify="right", overflow="fold")
    # Long labels ("best_standard: dualpipev/uniform") wrap between their words: the table
    # keeps to 100 columns.
    table.add_column("plan", min_width=8, max_width=18, overflow="fold")
    capacity = min(g.hardware.memory_bytes for g in job.cluster.groups) / GIB
    for col in ("step s", "tok/s", f"GiB of {capacity:.0f}", "fits", "error"):
        table.add_column(col, justify="right", overflow="fold")

    def add(row: Row, bold: bool = False, label: str | None = None) -> None:
        lay, sim = row.layout, row.sim
        values = {
            "TP": str(lay.tp),
            "CP": str(lay.cp),
            "PP": str(lay.pp),
            "DP": _dp_cell(lay),
            "EP": str(lay.ep),
            "b x M": f"{lay.microbatch_size} x {lay.num_microbatches}",
            "R": {"none": "-", "selective": "s", "full": "f"}[lay.recompute],
            "ranks": {"octopipe": "o", "megatron": "m"}[lay.rank_order],
        }
        cells = [
            *(values[d] for d in degrees),
            label or row.label,
            f"{row.step_time:.3f}",
            f"{row.tokens_per_gpu(job):,.0f}",
            f"{max(sim.peak_memory_bytes) / GIB:.1f}",
            "yes" if sim.fits else "[red]no[/red]",
            band_cell(row_band(row, job)),
        ]
        table.add_row(*(f"[bold]{c}[/bold]" for c in cells) if bold else cells)

    for i, row in enumerate(result.rows[:SHOWN_ROWS]):
        add(row, bold=i == 0)
    refused = dict(result.not_runnable)
    if references:
        table.add_section()
        for name, row in references:
            shown_as = {"reference": "Megatron-LM", "given": "given"}.get(name)
            label = shown_as or (row.label if ":" in row.label else f"{name}: {row.label}")
            if name in refused:  # shown for comparison; why not: a note under the table
                label += " (not run)"
            add(row, label=label)
    return table


def _dp_cell(lay) -> str:
    """DP with its optimizer sharding: Z1, Z3 (FSDP), Z3/S (HSDP in shard groups of S)."""
    if not lay.zero:
        return str(lay.dp)
    group = f"/{lay.shard_group}" if lay.shard_group else ""
    return f"{lay.dp} Z{lay.zero}{group}"


def _caption(result: LayoutReport) -> str:
    """The legend: what each abbreviation and reference row means."""
    parts = [
        "DP Z1: optimizer state sharded across DP (ZeRO-1); Z3: weights and gradients too "
        "(FSDP); Z3/S: in shard groups of S, replicated across them (HSDP)",
        "b x M: samples per microbatch x microbatches per step",
        "step s: the pipeline (timeline.png's iteration) and the optimizer step after it",
        "tok/s: tokens per second per GPU",
        "R: recomputation (s: selective, f: full)",
        "ranks: how GPUs are numbered (o: OctoPipe's, DP outermost; m: Megatron-Core's, PP "
        "outermost; docs/FORMATS.md)",
        "plan: schedule/partition (tuned: OctoPipe's tuner; docs/LAYOUTS.md)",
        "best_standard: the fastest standard schedule over the uniform partition, of every "
        "layout screened",
    ]
    if result.recipe is not None:
        parts.append(f"recipe: {result.recipe_source}, scaled to these GPUs")
    parts.append(
        "Megatron-LM: its rule (TP by model size, interleaved 1F1B over a uniform partition)"
    )
    if result.given is not None:
        given = "--layout, the answer's own" if result.exact else "--from-layout"
        parts.append(f"given: {given}")
    if result.not_runnable:
        engine = get_engine(result.runner).title
        parts.append(f"a reference {engine} cannot run is shown beside, not chosen")
    job = result.job
    parts.append(
        f"GiB of N: the fullest GPU's peak, of its N GiB; a plan fits with "
        f"{job.memory_headroom:.0%} of it free (--memory-headroom: the allocator's reserve and "
        "the memory model's measured error)"
    )
    parts.append(
        "error: mean held-out error of published runs like the row (model kind, GPU, "
        "precision, parallelism kinds; BENCHMARKS.md)"
    )
    return "; ".join(parts)


def _references(result: LayoutReport) -> list[tuple[str, Row]]:
    """The rows the answer is set beside, named as `--json` names them."""
    named = [
        ("best_standard", result.best_standard),
        ("recipe", result.recipe),
        ("reference", result.reference),
        ("given", result.given),
    ]
    return [(name, row) for name, row in named if row is not None]
