"""Measure the point-to-point link between ranks 0 and 1: latency and bandwidth, by ping-pong.

The simulator prices a transfer as `latency + bytes / bandwidth`. Both numbers are fitted to the
mean one-way times (half a round trip) of a one-float message and of a large one, sent with the
`torch.distributed` point-to-point calls the executor uses.

In a run, transfers overlap computation: while a rank computes, the communication library's own
threads must still get a core to move the bytes, and on a host with as many ranks as cores they
wait for one. So every rank keeps a thread computing during the measurement, as its run would.
On such a host the one-way times then have a long tail (a median near the idle figure, a few
milliseconds now and then); the mean, what a pipeline pays over many transfers, includes it.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import torch
import torch.distributed as dist

from octopipe.profile import Link

SMALL_BYTES = 4
BANDWIDTH_PROBE_BYTES = 4 << 20  # large enough that bandwidth, not latency, sets its time


@contextmanager
def computing(device: torch.device) -> Iterator[None]:
    """A thread doing matrix products on `device` until the block ends (torch releases the GIL
    inside its kernels, so the main thread still runs)."""
    stop = threading.Event()

    def spin() -> None:
        # On a GPU, on a stream of its own: the probe synchronizes only its own stream.
        stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        with torch.cuda.stream(stream) if stream is not None else nullcontext():
            a = torch.randn(256, 256, device=device) / 16
            while not stop.is_set():
                a = torch.tanh(a @ a)

    worker = threading.Thread(target=spin, name="octopipe-link-load", daemon=True)
    worker.start()
    try:
        yield
    finally:
        stop.set()
        worker.join()


def _one_way_seconds(nbytes: int, device: torch.device, warmup: int, repeats: int) -> float:
    """Half the mean round trip of an `nbytes` message (rank 0's figure; 0 on other ranks)."""
    rank = dist.get_rank()
    buf = torch.zeros(max(nbytes // 4, 1), dtype=torch.float32, device=device)
    samples = []
    for i in range(warmup + repeats):
        if rank == 0:
            t0 = time.perf_counter()
            dist.send(buf, 1)
            dist.recv(buf, 1)
            if device.type == "cuda":  # NCCL's wait only orders the stream; wait for the bytes
                torch.cuda.current_stream(device).synchronize()
            if i >= warmup:
                samples.append((time.perf_counter() - t0) / 2)
        elif rank == 1:
            dist.recv(buf, 0)
            dist.send(buf, 0)
    return statistics.fmean(samples) if samples else 0.0


def measure_link(
    device: torch.device,
    warmup: int = 5,
    repeats: int = 100,
    large_bytes: int = BANDWIDTH_PROBE_BYTES,
) -> Link:
    """Every rank of the current group calls this; all get the link rank 0 measured."""
    if dist.get_world_size() < 2:
        raise ValueError("measuring a link needs two ranks")
    with computing(device):
        small = _one_way_seconds(SMALL_BYTES, device, warmup, repeats)
        large = _one_way_seconds(large_bytes, device, warmup, repeats)
    if dist.get_rank() == 0:
        extra = large - small
        bandwidth = (large_bytes - SMALL_BYTES) / extra if extra > 0 else float("inf")
        found = [Link(bandwidth=bandwidth, latency=small)]
    else:
        found = [None]
    dist.broadcast_object_list(found, src=0)
    return found[0]
