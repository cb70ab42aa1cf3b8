"""What a rank records of its steps: when each action ran and each step's losses and time
(plain data its launcher reads back, pickled, without importing the step's machinery), and
how much it held for its backwards (`HeldTensors`).

`HeldTensors` counts, from the tensors themselves, what a rank holds between a microbatch's
forward and its backward: the high-water mark the simulator's per-device peak is held to. Each
storage counts once, for as long as anything holds it:
- what autograd saves for the backward (a `saved_tensors_hooks` pair around each forward: the
  hook hands autograd a small holder, and the storage is released when the last holder goes,
  with the graph);
- what the stage keeps itself (`keep`): the inputs of modules it recomputes (their checkpoints
  keep them, out of autograd's sight), and after a split backward's I what W still needs.
The model's own parameters and buffers are not counted (the static part, weighed apart with
gradients and optimizer state). `peak` is the most held at once. On CPU this is the only such
figure (the allocator reports none). Counting costs Python work on every saved tensor, and a
rank's passes repeat one pattern: the worker counts its first `COUNTED_PASSES` only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ActionRecord:
    """When one action ran, in seconds since the job's common start (a barrier)."""

    step: int
    action: str
    wait_start: float  # began waiting for its inputs
    start: float  # inputs ready, compute began
    end: float


@dataclass(frozen=True)
class StepRecord:
    """One rank's step: its losses, how long it took, its share of the gradient norm."""

    losses: tuple[float, ...]  # per microbatch, unscaled; empty but on the last stage
    duration: float  # from the step's start barrier to this rank's optimizer step end
    # This rank's share of the squared gradient norm before clipping (`optim.squared_norm`);
    # None where the step does not measure it (overlapped steps).
    grad_squares: float | None = None


class _Holder:
    """One reference to a counted storage; releases it when dropped."""

    __slots__ = ("_key", "_owner", "tensor")

    def __init__(self, owner: HeldTensors, key: int, tensor: torch.Tensor) -> None:
        self._owner, self._key, self.tensor = owner, key, tensor

    def __del__(self) -> None:
        self._owner._release(self._key)


COUNTED_PASSES = 2  # the first pass's, then one with every buffer of the step in place


class HeldTensors:
    def __init__(self) -> None:
        self._own: set[int] = set()
        self._counts: dict[int, list[int]] = {}  # storage -> [bytes, holders]
        self.live = 0
        self.peak = 0
        self.counting = True  # off: nothing new is counted (what is held is still released)

    def exclude(self, tensors: Iterable[torch.Tensor]) -> None:
        """Storages never counted: the model's parameters and buffers."""
        self._own |= {key for t in tensors if (key := _storage(t)[0]) is not None}

    def saving(self) -> torch.autograd.graph.saved_tensors_hooks:
        """Count what autograd saves inside this context."""
        return torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)

    def keep(self, tensors: Iterable[torch.Tensor | None]) -> list[_Holder]:
        """Count `tensors` for as long as the returned holders live."""
        if not self.counting:
            return []
        return [h for t in tensors if t is not None and (h := self._hold(t)) is not None]

    def reset(self) -> None:
        self.peak = self.live

    def _pack(self, tensor: torch.Tensor):
        holder = self._hold(tensor)
        return tensor if holder is None else holder

    def _hold(self, tensor: torch.Tensor) -> _Holder | None:
        if isinstance(tensor, torch.nn.Parameter):  # a weight (FSDP2's gathered ones too)
            return None
        key, nbytes = _storage(tensor)
        if key is None or key in self._own or not nbytes:
            return None
        entry = self._counts.get(key)
        if entry is None:
            entry = self._counts[key] = [nbytes, 0]
            self.live += nbytes
            self.peak = max(self.peak, self.live)
        entry[1] += 1
        return _Holder(self, key, tensor)

    def _release(self, key: int) -> None:
        entry = self._counts.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del self._counts[key]
            self.live -= entry[0]


def _unpack(saved):
    return saved.tensor if isinstance(saved, _Holder) else saved


def _storage(tensor: torch.Tensor) -> tuple[int | None, int]:
    """(a key of the storage holding `tensor`'s bytes on this rank, its bytes); (None, 0) for
    a meta tensor."""
    local = getattr(tensor, "_local_tensor", tensor)  # a DTensor's shard on this rank
    if local.device.type == "meta":
        return None, 0
    try:
        storage = local.untyped_storage()
        return storage.data_ptr(), storage.nbytes()
    except (RuntimeError, NotImplementedError, TypeError):
        # A wrapper subclass without a storage of its own (an async collective's result):
        # its own bytes, keyed by the object (alive while a holder holds it).
        return -id(local), local.numel() * local.element_size()
