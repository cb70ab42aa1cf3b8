"""Start the ranks of a run and bring back its results, or its first error.

Two ways in: `launch` spawns one process per rank on this host (gloo on loopback for CPU,
NCCL when there is a GPU per rank) and watches them (`spawn`): if one fails, the rest are killed
and the cause is raised here; nothing is left running. `run_under_torchrun` runs this process
as one rank of an existing `torchrun` job (RANK/WORLD_SIZE in the environment). Both run a list
of jobs in one process group, so tests pay for process start-up once.
"""

from __future__ import annotations

import getpass
import os
import tempfile
from collections.abc import Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from octopipe.errors import InputError
from octopipe.limits import DEFAULT_TIMEOUT_S
from octopipe.runtime.job.progress import OnReport, say
from octopipe.runtime.launch.forks import RANK_MODULES
from octopipe.runtime.launch.made_for import check_made_for_model
from octopipe.runtime.launch.preflight import (
    check_checkpoint_room,
    check_first_batch,
    check_fp8,
    check_local_processes,
    check_overlap,
    check_parallelism,
    check_resumable,
    check_sizes,
)
from octopipe.runtime.launch.spawn import (  # noqa: F401 - RankFailure, Stopped: raised through here
    CHILD_ENVIRONMENT,
    RankFailure,
    Stopped,
    spawn_ranks,
    tell_parent,
)
from octopipe.runtime.model.recompute import check_recomputable
from octopipe.runtime.model.split import check_plan_layer_names
from octopipe.runtime.parallel import groups
from octopipe.runtime.step.deps import check_runnable

if TYPE_CHECKING:
    from octopipe.runtime.job.result import RunResult
    from octopipe.runtime.job.run_config import Job


_CHECKING = "checking the plan against the model, the data and the checkpoints"


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def choose_backend(requested: str, local_world_size: int) -> str:
    """`auto`: NCCL when every local rank can have a GPU of its own, else gloo on CPU. NCCL asked
    for without a GPU per local rank is refused before any rank starts."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if requested == "nccl" and gpus < local_world_size:
        raise InputError(
            "--backend",
            f"nccl needs a CUDA GPU per rank ({local_world_size} on this host); "
            f"this torch sees {gpus}",
        )
    if requested != "auto":
        return requested
    return "nccl" if gpus >= local_world_size else "gloo"


def validate_jobs(jobs: Sequence[Job], world_size: int) -> list[Job]:
    """Refuse, before any rank starts, a plan that does not fit its model or the world size,
    and a checkpoint that cannot be resumed; the jobs with their checkpoints to resume chosen."""
    checked = []
    written: set[str] = set()  # checkpoint folders the jobs so far write to
    for job in jobs:
        recipe = job.config.recipe()
        layers = recipe.layers
        dp, tp = job.config.shape.dp, job.config.shape.tp
        if dp < 1 or world_size % dp:
            raise InputError("--dp", f"{dp} replicas do not divide the {world_size} processes")
        if tp < 1 or world_size % (dp * tp):
            raise InputError(
                "--tp",
                f"{dp} replicas of {tp} ranks per device do not divide the {world_size} processes",
            )
        check_sizes(job.config)
        check_runnable(job.plan, len(layers), world_size // (dp * tp), job.source)
        check_plan_layer_names(job.plan.layer_names, layers)
        check_made_for_model(job.plan, recipe, job.config.seq_len, job.source)
        check_parallelism(job.config, recipe, job.plan)
        check_recomputable(job.plan, recipe, job.source)
        check_overlap(job.config)
        check_fp8(job.config)
        config = check_resumable(job.config, recipe)
        if (
            config.checkpoint.resume and config.checkpoint.dir in written
        ):  # not there yet: at its start
            waits = replace(config.checkpoint, chosen=None, at_start=True)
            config = replace(config, checkpoint=waits)
        if config.checkpoint.every and config.checkpoint.dir:
            written.add(config.checkpoint.dir)
        check_checkpoint_room(config, recipe)
        check_first_batch(config, recipe, job.plan)
        checked.append(replace(job, config=config))
    return checked


def checkpoint_folders(jobs: Sequence[Job]) -> list[str]:
    """The folders the jobs write checkpoints to or resume from: each held for the run."""
    return [
        job.config.checkpoint.dir
        for job in jobs
        if job.config.checkpoint.dir
        and (job.config.checkpoint.every or job.config.checkpoint.resume)
    ]


def execute(
    jobs: Sequence[Job],
    nproc: int,
    backend: str = "auto",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    init_method: str = "env://",
    on_report: OnReport | None = None,
) -> list[RunResult] | None:
    """Run the jobs on `nproc` fresh processes, or on the torchrun job this process belongs to
    (then `init_method` is how its ranks meet: torchrun's `env://`, or e.g. a shared `file://`).

    Returns the results on the process that speaks for the run (the parent, or rank 0), else None;
    `on_report` is called there with every step's report as the steps finish, and with notes
    of what the run is doing (`progress.RunNote`).
    """
    if under_torchrun():
        return run_under_torchrun(jobs, backend, timeout_s, init_method, on_report)
    return launch(jobs, nproc, backend, timeout_s, on_report)


# --- inside torchrun --------------------------------------------------------------------------


def run_under_torchrun(
    jobs: Sequence[Job],
    backend: str = "auto",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    init_method: str = "env://",
    on_report: OnReport | None = None,
) -> list[RunResult] | None:
    """Be one rank of a job started by torchrun (or anything that sets RANK and WORLD_SIZE)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    # Rank 0 holds the checkpoint folders for the job; the others use its choice (session).
    with held(checkpoint_folders(jobs) if rank == 0 else ()):
        say(on_report if rank == 0 else None, _CHECKING, passing=True)
        jobs = validate_jobs(jobs, world)
        backend = choose_backend(backend, int(os.environ.get("LOCAL_WORLD_SIZE", str(world))))
        return train_as_rank(
            jobs, rank, world, local_rank, init_method, backend, timeout_s, on_report
        )


def train_as_rank(
    jobs: Sequence[Job],
    rank: int,
    world: int,
    local_rank: int,
    init_method: str,
    backend: str,
    timeout_s: float,
    on_report: OnReport | None = None,
) -> list[RunResult] | None:
    """Join the process group, train every job, leave; rank 0 returns the results and hands
    every step's report (and note) to `on_report`."""
    from octopipe.runtime.job.session import run_job_on_rank

    device = join_process_group(backend, rank, world, local_rank, init_method, timeout_s)
    results = [
        run_job_on_rank(job, rank, world, device, backend == "nccl", _of_job(on_report, j, rank))
        for j, job in enumerate(jobs)
    ]
    # Only on success: after a failure, tearing down may wait on dead peers; the error goes first.
    # The barrier keeps a fast rank from closing its sockets under a peer still finishing.
    dist.barrier()
    dist.destroy_process_group()
    return results if rank == 0 else None


def _of_job(on_report, job: int, rank: int) -> OnReport | None:
    """Rank 0's reports of job `job`, labelled with it."""
    if on_report is None or rank != 0:
        return None
    return lambda report: on_report(replace(report, job=job))


def join_process_group(
    backend: str, rank: int, world: int, local_rank: int, init_method: str, timeout_s: float
) -> torch.device:
    """Join the default process group; the device this rank computes on (its GPU for NCCL)."""
    device = _device_for(backend, local_rank)
    dist.init_process_group(
        backend,
        init_method=init_method,
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout_s),
        device_id=_bound_device(device),
    )
    groups.use_timeout(timeout_s)
    return device


# --- spawning our own ranks ---------------------------------------------------------------------


def launch(
    jobs: Sequence[Job],
    nproc: int,
    backend: str = "auto",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    on_report: OnReport | None = None,
) -> list[RunResult]:
    """Run the jobs on `nproc` spawned ranks; `on_report` gets every step's report (and the
    run's notes) here, as the steps finish. No deadline on the whole run: `timeout_s` bounds
    each wait inside it.

    The ranks' start begins before the jobs are checked, so that the checks overlap the ranks'
    imports; a refused job stops them before they run anything."""
    check_local_processes(nproc)

    def checked(args: tuple) -> tuple:
        requested, jobs, timeout_s, report_steps = args
        say(on_report, _CHECKING, passing=True)
        jobs = validate_jobs(jobs, nproc)
        chosen = choose_backend(requested, nproc)
        on_cpu = " on CPU" if chosen == "gloo" else ""
        say(on_report, f"starting {nproc} processes ({chosen}{on_cpu})")
        return (chosen, jobs, timeout_s, report_steps)

    with no_empty_compile_cache(), held(checkpoint_folders(jobs)):  # no writer meanwhile
        return spawn_ranks(
            _train_jobs,
            (backend, list(jobs), timeout_s, on_report is not None),
            nproc,
            on_note=on_report,
            check=checked,
            preload=RANK_MODULES,
            warm=_build_recipes,
        )


@contextmanager
def held(folders: Sequence[str]):
    """`checkpoint.folder.hold_all` of the folders (imported only where there are any: it
    imports torch.distributed.checkpoint)."""
    with ExitStack() as stack:
        if folders:
            from octopipe.runtime.checkpoint.folder import hold_all

            stack.enter_context(hold_all(folders))
        yield


@contextmanager
def no_empty_compile_cache():
    """torch makes its compile cache folder (TMPDIR/torchinductor_USER) whenever torch._dynamo
    is imported, which building a model may do; nothing here compiles, so a folder this run
    made and left empty is removed again (one holding anything, or made by another, stays)."""
    # torch's default (torch._inductor.runtime.cache_dir_utils, not imported: importing it
    # would make the folder).
    default = Path(tempfile.gettempdir()) / f"torchinductor_{getpass.getuser()}"
    folder = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or str(default)
    existed = os.path.exists(folder)
    try:
        yield
    finally:
        if not existed:
            with suppress(OSError):  # not empty, or gone: not ours to remove
                os.rmdir(folder)


def _train_jobs(
    rank: int,
    world: int,
    store: str,
    backend: str,
    jobs: list[Job],
    timeout_s: float,
    report_steps: bool,
) -> list[RunResult] | None:
    on_report = tell_parent if report_steps else None
    return train_as_rank(jobs, rank, world, rank, f"file://{store}", backend, timeout_s, on_report)


def _build_recipes(args: tuple) -> None:
    """Before the ranks are forked: each job's model recipe (its whole model on the meta device,
    and what building it imports: transformers for `hf:`, the user's module), built once for
    all ranks (`session.build_recipes`)."""
    from octopipe.runtime.job.session import build_recipes

    build_recipes(job.config for job in args[1])


def _device_for(backend: str, local_rank: int) -> torch.device:
    if backend == "nccl":
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def _bound_device(device: torch.device) -> torch.device | None:
    """NCCL ranks name their GPU up front (no guessing from the rank); gloo ranks name none."""
    return device if device.type == "cuda" else None
