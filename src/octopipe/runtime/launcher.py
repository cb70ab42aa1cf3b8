"""Start the ranks of a run and bring back its results, or its first error.

Two ways in: `launch` spawns one process per rank on this host (gloo on loopback for CPU,
NCCL when there is a GPU per rank) and watches them: if one fails, the rest are killed and its
traceback is raised here; nothing is left running. `run_under_torchrun` runs this process as one
rank of an existing `torchrun` job (RANK/WORLD_SIZE in the environment). Both run a list of jobs
in one process group, so tests pay for process start-up once.
"""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import queue as queue_mod
import tempfile
import time
import traceback
from collections.abc import Sequence
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from octopipe.errors import InputError
from octopipe.runtime import DEFAULT_TIMEOUT_S
from octopipe.runtime.deps import check_runnable
from octopipe.runtime.recipe import ModelRecipe
from octopipe.runtime.session import Job, RunConfig, RunResult, run_job_on_rank
from octopipe.runtime.split import check_plan_layer_names

_GRACE_S = 2.0  # how long a failed run's other ranks get before they are killed

# Every process that times or trains (ranks, and the profiler's) starts with these unless the
# user set them. glibc hands large freed blocks back to the OS at once, so a split backward's
# retained graph faults in fresh pages on every microbatch: keeping freed memory made CPU op
# times steadier and the profile's times match the run's (BENCHMARKS.md, executor diagnosis 2).
CHILD_ENVIRONMENT = {
    "GLIBC_TUNABLES": ":".join(
        f"glibc.malloc.{knob}=4294967296" for knob in ("mmap_threshold", "trim_threshold")
    ),
    "GLOO_SOCKET_IFNAME": "lo",  # one host: gloo's and NCCL's sockets stay on loopback
    "NCCL_SOCKET_IFNAME": "lo",
}


class RankFailure(RuntimeError):
    """A rank raised (or died); the message carries its original traceback."""

    exit_codes: tuple[int | None, ...] = ()  # every spawned rank's, once all are stopped


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def choose_backend(requested: str, local_world_size: int) -> str:
    """`auto`: NCCL when every local rank can have a GPU of its own, else gloo on CPU."""
    if requested != "auto":
        return requested
    usable = torch.cuda.is_available() and torch.cuda.device_count() >= local_world_size
    return "nccl" if usable else "gloo"


def validate_jobs(jobs: Sequence[Job], world_size: int) -> None:
    """Refuse, before any rank starts, a plan that does not fit its model or the world size."""
    for job in jobs:
        recipe = job.config.recipe()
        layers = recipe.layers
        dp = job.config.dp
        if dp < 1 or world_size % dp:
            raise InputError("--dp", f"{dp} replicas do not divide the {world_size} processes")
        check_runnable(job.plan, len(layers), world_size // dp, job.source)
        check_plan_layer_names(job.plan.layer_names, layers)
        check_resumable(job.config, recipe)
        check_overlap(job.config)


def check_overlap(config: RunConfig) -> None:
    """What overlapped steps do not combine with yet, refused in one line."""
    if not config.overlap_steps:
        return
    for flag, used in (
        ("--dp", config.dp > 1),
        ("--zero", config.zero),
        ("--checkpoint-every", config.checkpoint_every),
        ("--resume", config.resume),
    ):
        if used:
            raise InputError(flag, "not supported with --overlap-steps yet")


def check_resumable(config: RunConfig, recipe: ModelRecipe) -> None:
    """A checkpoint to resume must be of this model and before the run's last step."""
    found = config.resume_from()
    if found is None:
        return
    from octopipe.runtime.checkpoint import check_compatible

    path, step = found
    check_compatible(path, recipe.layers, recipe.meta_model)
    if step >= config.steps:
        raise InputError("--steps", f"{path} is at step {step}; --steps {config.steps} is done")


def execute(
    jobs: Sequence[Job],
    nproc: int,
    backend: str = "auto",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    init_method: str = "env://",
) -> list[RunResult] | None:
    """Run the jobs on `nproc` fresh processes, or on the torchrun job this process belongs to
    (then `init_method` is how its ranks meet: torchrun's `env://`, or e.g. a shared `file://`).

    Returns the results on the process that speaks for the run (the parent, or rank 0), else None.
    """
    if under_torchrun():
        return run_under_torchrun(jobs, backend, timeout_s, init_method)
    return launch(jobs, nproc, backend, timeout_s)


# --- inside torchrun --------------------------------------------------------------------------


def run_under_torchrun(
    jobs: Sequence[Job],
    backend: str = "auto",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    init_method: str = "env://",
) -> list[RunResult] | None:
    """Be one rank of a job started by torchrun (or anything that sets RANK and WORLD_SIZE)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    validate_jobs(jobs, world)
    backend = choose_backend(backend, int(os.environ.get("LOCAL_WORLD_SIZE", str(world))))
    return train_as_rank(jobs, rank, world, local_rank, init_method, backend, timeout_s)


def train_as_rank(
    jobs: Sequence[Job],
    rank: int,
    world: int,
    local_rank: int,
    init_method: str,
    backend: str,
    timeout_s: float,
) -> list[RunResult] | None:
    """Join the process group, train every job, leave; rank 0 returns the results."""
    device = join_process_group(backend, rank, world, local_rank, init_method, timeout_s)
    results = [run_job_on_rank(job, rank, world, device, backend == "nccl") for job in jobs]
    # Only on success: after a failure, tearing down may wait on dead peers; the error goes first.
    # The barrier keeps a fast rank from closing its sockets under a peer still finishing.
    dist.barrier()
    dist.destroy_process_group()
    return results if rank == 0 else None


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
    return device


# --- spawning our own ranks ---------------------------------------------------------------------


def launch(
    jobs: Sequence[Job], nproc: int, backend: str = "auto", timeout_s: float = DEFAULT_TIMEOUT_S
) -> list[RunResult]:
    validate_jobs(jobs, nproc)
    backend = choose_backend(backend, nproc)
    return spawn_ranks(
        _train_jobs, (backend, list(jobs), timeout_s), nproc, timeout_s * (1 + len(jobs))
    )


def spawn_ranks(body, args: tuple, nproc: int, deadline_s: float, name: str = "octopipe"):
    """Run `body(rank, world, store, *args)` on `nproc` fresh processes and return what rank 0's
    body returns. `store` is a file for `init_method="file://..."` (rendezvous without opening a
    port). The first rank to fail stops all of them and its traceback is raised as RankFailure;
    nothing is left running."""
    ctx = mp.get_context("spawn")
    messages = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix=f"{name}-") as tmp:
        store = str(Path(tmp) / "store")
        procs = [
            ctx.Process(
                target=_rank_main,
                args=(body, rank, nproc, store, args, messages),
                name=f"{name}-rank{rank}",
                daemon=True,
            )
            for rank in range(nproc)
        ]
        with _environment(CHILD_ENVIRONMENT):  # spawned children read it as they start
            for p in procs:
                p.start()
        try:
            payload = _watch(procs, messages, deadline_s)
        except RankFailure as failure:
            _stop(procs)
            failure.exit_codes = tuple(p.exitcode for p in procs)
            raise
        finally:
            _stop(procs)
    return torch.load(io.BytesIO(payload), weights_only=False)


@contextmanager
def _environment(defaults: dict[str, str]):
    """`defaults` in os.environ for the duration (values already set win), then as before."""
    added = [k for k in defaults if k not in os.environ]
    os.environ.update({k: defaults[k] for k in added})
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


def _train_jobs(
    rank: int, world: int, store: str, backend: str, jobs: list[Job], timeout_s: float
) -> list[RunResult] | None:
    return train_as_rank(jobs, rank, world, rank, f"file://{store}", backend, timeout_s)


def _watch(procs: list[mp.process.BaseProcess], messages: mp.Queue, deadline_s: float) -> bytes:
    """Wait for rank 0's results and every rank's clean exit; raise on the first failure."""
    deadline = time.monotonic() + deadline_s
    payload: bytes | None = None
    while True:
        msg = _next_message(messages, 0.05)
        if msg is not None and msg[0] == "error":
            raise RankFailure(f"rank {msg[1]} failed:\n{msg[2]}")
        if msg is not None:
            payload = msg[1]
        codes = [p.exitcode for p in procs]
        bad = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
        if bad:
            msg = _next_message(
                messages, _GRACE_S
            )  # the failed rank's traceback may still be in flight
            if msg is not None and msg[0] == "error":
                raise RankFailure(f"rank {msg[1]} failed:\n{msg[2]}")
            raise RankFailure(f"rank {bad[0][0]} died with exit code {bad[0][1]}")
        if payload is not None and all(c == 0 for c in codes):
            return payload
        if all(c == 0 for c in codes):
            msg = _next_message(messages, _GRACE_S)
            if msg is None or msg[0] != "ok":
                raise RankFailure("every rank exited but rank 0 sent no result")
            return msg[1]
        if time.monotonic() > deadline:
            raise RankFailure(f"the run did not finish within {deadline_s:.0f} s")


def _next_message(messages: mp.Queue, timeout: float) -> tuple | None:
    try:
        return messages.get(timeout=timeout)
    except queue_mod.Empty:
        return None


def _stop(procs: list[mp.process.BaseProcess]) -> None:
    """Leave nothing running: ask, then force."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(_GRACE_S)
        if p.is_alive():
            p.kill()
            p.join()


def _rank_main(body, rank: int, world: int, store: str, args: tuple, messages: mp.Queue) -> None:
    """One spawned rank: run the body; rank 0 sends its results; any error is reported."""
    code = 0
    try:
        torch.set_num_threads(1)  # ranks share the host's cores; oversubscription only slows them
        results = body(rank, world, store, *args)
        if rank == 0:
            buf = io.BytesIO()
            torch.save(results, buf)
            messages.put(("ok", buf.getvalue()))
    except BaseException:  # noqa: BLE001 - whatever it was, the parent must hear of it
        messages.put(("error", rank, traceback.format_exc()))
        code = 1
    messages.close()
    messages.join_thread()
    os._exit(code)  # skip interpreter teardown: a peer may be gone, and its sockets with it


def _device_for(backend: str, local_rank: int) -> torch.device:
    if backend == "nccl":
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def _bound_device(device: torch.device) -> torch.device | None:
    """NCCL ranks name their GPU up front (no guessing from the rank); gloo ranks name none."""
    return device if device.type == "cuda" else None
