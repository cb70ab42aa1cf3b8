"""`octopipe profile`: measure a real model layer by layer on this machine, write a profile."""

from __future__ import annotations

import argparse

from octopipe.errors import InputError
from octopipe.units import GIB

NAME = "profile"
HELP = "Measure a bundled (or config.json) model's per-layer costs on this device; write a profile."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="bundled model name or config.json path")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--seq-len", type=int, default=32, help="tokens per sequence")
    parser.add_argument("--micro-batch-size", type=int, default=2, help="sequences per microbatch")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per layer (median)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed runs per layer first")
    parser.add_argument("--seed", type=int, default=0, help="weights and data seed")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="CPU threads for torch (default 1: small layers gain nothing from more, and "
        "timings stay steady on a shared machine)",
    )
    parser.add_argument(
        "--nproc",
        type=int,
        default=1,
        help="processes measuring at once, as many as the run will have: each layer is timed "
        "in all of them together (the median is kept), so the contention of a run's ranks on "
        "shared cores and memory is in the times; from 2 on, the link between two of them is "
        "measured too, while they compute, as in a run (gloo on CPU; NCCL with a GPU per "
        "process)",
    )
    parser.add_argument("-o", "--output", required=True, help="profile JSON to write")


def _check(args: argparse.Namespace) -> None:
    for flag, value, least in (
        ("--seq-len", args.seq_len, 1),
        ("--micro-batch-size", args.micro_batch_size, 1),
        ("--repeats", args.repeats, 1),
        ("--warmup", args.warmup, 0),
        ("--threads", args.threads, 1),
        ("--nproc", args.nproc, 1),
    ):
        if value < least:
            raise InputError(flag, f"must be at least {least}, got {value}")


FP32_BYTES = 4
# The weights may take this share of the device's memory; gradients, activations and the
# allocator need the rest.
WEIGHT_SHARE = 0.4


def _device_memory(device: str) -> int:
    import os

    import torch

    if device == "cuda":
        return torch.cuda.mem_get_info()[1]
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _check_fits(name: str, device: str) -> None:
    """Refuse, in one line, a model whose fp32 weights alone would crowd out the device."""
    from octopipe.costmodel.arch import load_architecture
    from octopipe.models.build import parameter_count

    weights = FP32_BYTES * parameter_count(load_architecture(name))
    memory = _device_memory(device)
    if weights > WEIGHT_SHARE * memory:
        raise InputError(
            "--model",
            f"{name} holds {weights / GIB:.1f} GiB of fp32 weights, too much for this "
            f"{device}'s {memory / GIB:.0f} GiB; profile a smaller config, or use "
            "`octopipe profile-arch` for the analytic cost model",
        )


def run(args: argparse.Namespace) -> int:
    import torch

    from octopipe.profile import save_profile
    from octopipe.runtime.launcher import spawn_ranks

    _check(args)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise InputError("--device", "cuda was asked for but this torch sees no CUDA device")
    if args.device == "cuda" and args.nproc > torch.cuda.device_count():
        raise InputError(
            "--nproc",
            f"{args.nproc} processes need as many GPUs; this machine has "
            f"{torch.cuda.device_count()}",
        )
    _check_fits(args.model, args.device)
    # Measured in fresh processes that start as the executor's ranks do (same allocator
    # settings, one process per device), so the profile's times are the run's.
    options = {k: getattr(args, k) for k in _PROFILE_OPTIONS}
    profile = spawn_ranks(
        _profile_in_child, (options,), args.nproc, deadline_s=_DEADLINE_S, name="octopipe-profile"
    )
    save_profile(profile, args.output)
    work = sum(layer.work for layer in profile.layers)
    link = ""
    if args.nproc > 1:
        link = (
            f"; link {profile.link.latency * 1e6:.0f} us + {profile.link.bandwidth / 1e9:.2f} GB/s"
        )
    print(
        f"wrote {args.output}: {profile.num_layers} layers, "
        f"{work * 1e3:.2f} ms of F+B+W per microbatch on {args.device}{link}"
    )
    return 0


_PROFILE_OPTIONS = (
    "model",
    "device",
    "seq_len",
    "micro_batch_size",
    "repeats",
    "warmup",
    "seed",
    "threads",
)
_DEADLINE_S = 24 * 3600.0  # profiling a large config takes long; a failure still ends it at once


def _profile_in_child(rank: int, world: int, store: str, options: dict):
    """The profiling itself, in a spawned process: build the model, time every layer; with
    several processes, in step with the others, then measure the link and merge."""
    import torch
    import torch.distributed as dist

    from octopipe.models import build_model
    from octopipe.runtime.launcher import join_process_group
    from octopipe.runtime.linkprobe import measure_link
    from octopipe.runtime.profiler import median_profile

    o = argparse.Namespace(**options)
    torch.set_num_threads(o.threads)
    model = build_model(o.model, o.seed, seq_len=o.seq_len, micro_batch_size=o.micro_batch_size)
    name = f"{model.arch.name}-{o.device}-s{o.seq_len}-mb{o.micro_batch_size}"
    if world == 1:
        return _profile_with_progress(model, o, torch.device(o.device), name, lambda: None)
    backend = "nccl" if o.device == "cuda" else "gloo"
    device = join_process_group(backend, rank, world, rank, f"file://{store}", _DEADLINE_S)
    try:
        if rank == 0:
            profile = _profile_with_progress(model, o, device, name, dist.barrier)
        else:
            profile = _profile(model, o, device, name, lambda _i, _n: dist.barrier())
        link = measure_link(device)
        every: list = [None] * world
        dist.all_gather_object(every, profile)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return median_profile(every).model_copy(update={"link": link, "name": f"{name}-x{world}"})


def _profile(model, o: argparse.Namespace, device, name: str, on_layer):
    from octopipe.runtime.profiler import profile_model

    return profile_model(
        model,
        device=device,
        warmup=o.warmup,
        repeats=o.repeats,
        seed=o.seed,
        name=name,
        on_layer=on_layer,
    )


def _profile_with_progress(model, o: argparse.Namespace, device, name: str, after_layer):
    """`_profile` with a progress bar on stderr; `after_layer()` runs after each layer."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    names = model.layer_names
    with Progress(
        TextColumn("[bold]profiling[/] {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as progress:
        task = progress.add_task(names[0], total=len(names))

        def advance(index: int, _name: str) -> None:
            after_layer()
            following = names[index + 1] if index + 1 < len(names) else "done"
            progress.update(task, advance=1, description=following)

        return _profile(model, o, device, name, advance)
