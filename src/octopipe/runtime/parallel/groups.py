"""Process subgroups that keep the run's timeout.

torch gives every new group its own default timeout (30 minutes on gloo, 10 on NCCL), not the
default group's, so a transfer or all-reduce stuck on a subgroup (per-channel groups, data
parallelism's) would outlast `--timeout`. The launcher records the timeout when it joins the
default group; groups made here get it too.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import torch.distributed as dist

_timeout: timedelta | None = None  # None: torch's default (no run has joined in this process)


def use_timeout(seconds: float) -> None:
    global _timeout
    _timeout = timedelta(seconds=seconds)


def new_group(ranks: Sequence[int]) -> dist.ProcessGroup:
    """`dist.new_group(ranks)` with the run's timeout; collective, like new_group."""
    return dist.new_group(list(ranks), timeout=_timeout)
