"""`octopipe profile-arch`: an analytic profile of a model architecture on a hardware preset."""

from __future__ import annotations

import argparse
from collections import defaultdict
from typing import TYPE_CHECKING

from octopipe.config.flags import count, number
from octopipe.config.planning import add_job_flags, resolved
from octopipe.costmodel.hf_config import HF_RUNNABLE, shipped_models
from octopipe.limits import (
    MAX_BANDWIDTH,
    MAX_BYTES,
    MAX_DEVICES,
    MAX_SECONDS,
    MIN_BANDWIDTH,
)

if TYPE_CHECKING:
    from octopipe.profile import Profile

NAME = "profile-arch"
HELP = "Estimate a profile from an architecture config (HF config.json or a shipped model name)."

GB = 1e9


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "config",
        metavar="CONFIG_OR_NAME",
        help=f"config.json path or shipped model: {', '.join(shipped_models())}",
    )
    # The job's settings, each its one definition (`octopipe.config`).
    add_job_flags(
        parser,
        (
            "cluster.hardware",
            "parallelism.tp",
            "data.seq_len",
            "data.micro_batch_size",
            "shape.recompute",
            "precision.precision",
            "precision.fp8_scaling",
        ),
    )
    parser.add_argument(
        "--sequence-parallel",
        action="store_true",
        help="Megatron sequence parallelism (split replicated activations)",
    )
    parser.add_argument(
        "--optimizer-bytes",
        type=count(0, 1024),
        default=12,
        help="optimizer-state bytes per parameter (mixed-precision Adam: 12)",
    )
    parser.add_argument(
        "--devices", type=count(1, MAX_DEVICES), help="list this many devices in the profile"
    )
    parser.add_argument(
        "--memory-gb",
        type=number(0, MAX_BYTES / GB, above=True),
        help="override device memory (GB, 1e9 bytes)",
    )
    parser.add_argument(
        "--link-bandwidth",
        type=number(MIN_BANDWIDTH / GB, MAX_BANDWIDTH / GB),
        help="override inter-stage link bandwidth (GB/s)",
    )
    parser.add_argument(
        "--link-latency", type=number(0, MAX_SECONDS), help="override link latency (seconds)"
    )
    parser.add_argument(
        "--layer-names",
        choices=("torchtitan", "hf"),
        default="torchtitan",
        help="torchtitan's FQNs (layers.3, default) or transformers' (model.layers.3), so that "
        "plans run on `octopipe run --model hf:PATH` of the same config.json (the families "
        f"hf: runs only: {', '.join(HF_RUNNABLE.values())})",
    )
    parser.add_argument("-o", "--output", required=True, help="profile JSON to write")


def run(args: argparse.Namespace) -> int:
    from octopipe.outfiles import check_output_file

    check_output_file("--output", args.output)
    from octopipe.api import profile_from_config
    from octopipe.costmodel.build import parameter_count
    from octopipe.costmodel.hf_config import load_architecture
    from octopipe.profile import save_profile

    profile = profile_from_config(
        args.config,
        args.hardware,
        devices=args.devices,
        tp=resolved(args, "parallelism.tp"),
        seq_len=resolved(args, "data.seq_len"),
        micro_batch_size=resolved(args, "data.micro_batch_size"),
        sequence_parallel=args.sequence_parallel,
        recompute=args.recompute,
        optimizer_bytes=args.optimizer_bytes,
        memory_bytes=args.memory_gb * GB if args.memory_gb is not None else None,
        link_bandwidth=args.link_bandwidth * GB if args.link_bandwidth is not None else None,
        link_latency=args.link_latency,
        layer_names=args.layer_names,
        precision=args.precision,
        fp8_scaling=args.fp8_scaling,
    )
    save_profile(profile, args.output)
    _print_summary(profile, parameter_count(load_architecture(args.config)), args.output)
    return 0


def _print_summary(profile: Profile, params: int, path: str) -> None:
    from rich.console import Console
    from rich.table import Table

    from octopipe.units import byte_unit, fmt_column, fmt_count, time_unit

    by_kind: dict[str, list] = defaultdict(list)
    for layer in profile.layers:
        by_kind[layer.kind].append(layer)
    title = f"{profile.name}: {len(profile.layers)} layers, {fmt_count(params)} params"
    table = Table(title=title)
    # Each column in the unit of its largest figure (the total's): a small model's keep digits.
    layers = profile.layers
    seconds = time_unit(max(sum(x.f for x in layers), sum(x.b + x.w for x in layers)))
    memory = byte_unit(max(sum(x.act_bytes for x in layers), sum(x.param_bytes for x in layers)))
    out = byte_unit(max(x.out_bytes for x in layers))
    times = (f"{k} {seconds[0]}" for k in "fbw")
    sizes = (f"act {memory[0]}", f"param {memory[0]}", f"out {out[0]}")
    for column in ("kind", "layers", *times, *sizes):
        table.add_column(column, justify="left" if column == "kind" else "right")
    groups = [*by_kind.values(), layers]
    sums = [_sums(group, seconds[1], memory[1], out[1]) for group in groups]
    columns = [fmt_column([row[i] for row in sums]) for i in range(len(sums[0]))]
    cells = [[column[r] for column in columns] for r in range(len(groups))]
    for (kind, group), row in zip(by_kind.items(), cells):
        table.add_row(kind, str(len(group)), *row)
    table.add_row("total", str(len(layers)), *cells[-1], style="bold")
    console = Console()
    console.print(table)
    console.print(f"wrote {path}")


def _sums(layers, per_second: float, memory_unit: float, out_unit: float) -> list[float]:
    return [
        sum(x.f for x in layers) * per_second,
        sum(x.b for x in layers) * per_second,
        sum(x.w for x in layers) * per_second,
        sum(x.act_bytes for x in layers) / memory_unit,
        sum(x.param_bytes for x in layers) / memory_unit,
        max(x.out_bytes for x in layers) / out_unit,
    ]
