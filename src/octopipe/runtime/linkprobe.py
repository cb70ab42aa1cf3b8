"""Measure the point-to-point link between ranks 0 and 1: latency and bandwidth, by ping-pong.

The simulator prices a transfer as `latency + bytes / bandwidth`. Both numbers are fitted to the
one-way times (half a round trip, median of the repeats) of a one-float message and of a large
one, sent with the same `torch.distributed` point-to-point calls the executor uses.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from octopipe.profile import Link

SMALL_BYTES = 4


def _one_way_seconds(nbytes: int, device: torch.device, warmup: int, repeats: int) -> float:
    """Half the median round trip of an `nbytes` message (rank 0's figure; 0 on other ranks)."""
    rank = dist.get_rank()
    buf = torch.zeros(max(nbytes // 4, 1), dtype=torch.float32, device=device)
    samples = []
    for i in range(warmup + repeats):
        if rank == 0:
            t0 = time.perf_counter()
            dist.send(buf, 1)
            dist.recv(buf, 1)
            if i >= warmup:
                samples.append((time.perf_counter() - t0) / 2)
        elif rank == 1:
            dist.recv(buf, 0)
            dist.send(buf, 0)
    return statistics.median(samples) if samples else 0.0


def measure_link(
    large_bytes: int, device: torch.device, warmup: int = 3, repeats: int = 15
) -> Link:
    """Every rank of the current group calls this; all get the link rank 0 measured."""
    if dist.get_world_size() < 2:
        raise ValueError("measuring a link needs two ranks")
    large_bytes = max(large_bytes, 64 * SMALL_BYTES)
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
