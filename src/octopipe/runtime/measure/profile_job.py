"""A measured profile of any model `--model` names (bundled, config.json, `hf:PATH`,
`module:factory`), in processes that start as a run's.

    measure_profile("tiny-hybrid", seq_len=128, nproc=2)   # -> Profile, with the link measured

Every layer is timed in `nproc` freshly spawned processes at once (the median is kept), so the
contention of a run's ranks on shared cores and memory is in the times; from two processes on,
the link between two of them is measured too, while they compute, as in a run. `profiler.py`
times one model in one process; this module adds the processes, the progress bar and the check
that the model fits the device.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass

from octopipe.errors import InputError
from octopipe.profile import Device, Profile
from octopipe.units import GIB

FP32_BYTES = 4
# The weights may take this share of the device's memory; gradients, activations and the
# allocator need the rest.
WEIGHT_SHARE = 0.4
DEADLINE_S = 24 * 3600.0  # one wait while profiling (a large config takes long); failures end it


@dataclass(frozen=True)
class MeasureOptions:
    """How to measure: the model, its sizes, the device and the timing repeats."""

    model: str  # bundled model name, config.json, hf:PATH or module:factory
    device: str = "cpu"  # "cpu" or "cuda"
    seq_len: int = 32  # tokens per sequence
    micro_batch_size: int = 2  # sequences per microbatch
    repeats: int = 5  # timed runs per layer (the median is kept)
    warmup: int = 2  # untimed runs per layer first
    seed: int = 0  # weights and data
    threads: int = 1  # torch CPU threads per process
    progress: bool = True  # a progress bar on stderr


def measure_profile(model: str, *, nproc: int = 1, **options) -> Profile:
    """Measure `model` layer by layer in `nproc` processes; see `MeasureOptions` for options."""
    import torch

    from octopipe.runtime.launch.spawn import spawn_ranks

    o = MeasureOptions(model, **options)
    for name, value, least in (
        ("seq_len", o.seq_len, 1),
        ("micro_batch_size", o.micro_batch_size, 1),
        ("repeats", o.repeats, 1),
        ("warmup", o.warmup, 0),
        ("threads", o.threads, 1),
        ("nproc", nproc, 1),
    ):
        if value < least:
            raise InputError(
                f"--{name.replace('_', '-')}", f"must be at least {least}, got {value}"
            )
    if o.device == "cuda" and not torch.cuda.is_available():
        raise InputError("--device", "cuda was asked for but this torch sees no CUDA device")
    if o.device == "cuda" and nproc > torch.cuda.device_count():
        raise InputError(
            "--nproc",
            f"{nproc} processes need as many GPUs; this machine has {torch.cuda.device_count()}",
        )
    check_fits(o.model, o.device, o.seq_len, o.micro_batch_size, nproc)
    # Measured in fresh processes that start as the executor's ranks do (same allocator
    # settings, one process per device), so the profile's times are the run's.
    return spawn_ranks(_measure_in_child, (asdict(o),), nproc, name="octopipe-profile")


def check_fits(
    name: str, device: str, seq_len: int = 32, micro_batch_size: int = 2, nproc: int = 1
) -> None:
    """Refuse, in one line, a model whose fp32 weights alone would crowd out the device, or
    whose activations at these sizes cannot fit (`memory_floor`); counted on the meta device:
    nothing is allocated."""
    from octopipe.runtime.measure.memory_floor import check_activations
    from octopipe.runtime.model.load import load_recipe

    recipe = load_recipe(name)
    meta = recipe.meta_model
    weights = FP32_BYTES * sum(p.numel() for p in meta.parameters())
    memory = _device_memory(device)
    if weights > WEIGHT_SHARE * memory:
        raise InputError(
            "--model",
            f"{name} holds {weights / GIB:.1f} GiB of fp32 weights, too much for this "
            f"{device}'s {memory / GIB:.0f} GiB; profile a smaller config, or use "
            "`octopipe profile-arch` for the analytic cost model",
        )
    check_activations(recipe, device, seq_len, micro_batch_size, nproc)


def _device_memory(device: str) -> int:
    import torch

    if device == "cuda":
        return torch.cuda.mem_get_info()[1]
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _measure_in_child(rank: int, world: int, store: str, options: dict) -> Profile:
    """In a spawned process: build the model, time every layer; with several processes, in step
    with the others, then measure the link and merge."""
    import torch
    import torch.distributed as dist

    from octopipe.runtime.launch.launcher import join_process_group
    from octopipe.runtime.measure.linkprobe import measure_link
    from octopipe.runtime.measure.profiler import median_profile

    o = MeasureOptions(**options)
    torch.set_num_threads(o.threads)
    from octopipe.runtime.model.load import load_recipe

    model = load_recipe(o.model)
    name = f"{model.name}-{o.device}-s{o.seq_len}-mb{o.micro_batch_size}"
    if world == 1:
        return _time_layers(model, o, torch.device(o.device), name, lambda: None, o.progress)
    backend = "nccl" if o.device == "cuda" else "gloo"
    device = join_process_group(backend, rank, world, rank, f"file://{store}", DEADLINE_S)
    try:
        # Rank 0 shows progress; every rank waits for the others after each layer.
        profile = _time_layers(model, o, device, name, dist.barrier, o.progress and rank == 0)
        link = measure_link(device)
        every: list = [None] * world
        dist.all_gather_object(every, profile)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    # The times are those of `world` processes at once: the profile is of that many devices.
    share = _device_memory(o.device) // (1 if o.device == "cuda" else world)
    devices = tuple(Device(memory_bytes=float(share)) for _ in range(world))
    update = {"link": link, "name": f"{name}-x{world}", "devices": devices}
    return median_profile(every).model_copy(update=update)


def _time_layers(
    model, o: MeasureOptions, device, name: str, after_layer: Callable[[], None], show: bool
) -> Profile:
    """`profile_model` over every layer, with a progress bar on stderr when `show`;
    `after_layer()` runs after each layer."""
    from octopipe.runtime.measure.profiler import profile_model

    def measure(on_layer: Callable[[int, str], None]) -> Profile:
        return profile_model(
            model,
            device=device,
            warmup=o.warmup,
            repeats=o.repeats,
            seed=o.seed,
            seq_len=o.seq_len,
            micro_batch_size=o.micro_batch_size,
            name=name,
            on_layer=on_layer,
        )

    if not show:
        return measure(lambda _i, _n: after_layer())
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    names = model.layers
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

        return measure(advance)
