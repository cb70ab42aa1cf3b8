"""Non-blocking point-to-point transfers of activations and their gradients between ranks.

A *channel* is one direction of one stage boundary whose two stages sit on different ranks:
activations flow forward from stage b-1 to stage b, gradients flow back from b to b-1. On a
channel the sender produces microbatches in its schedule's order; the receiver posts its receives
in that same order (only as far ahead as it is asked to), so transfers match even on backends that
ignore tags (NCCL, where each channel gets its own communicator and matching is by order alone);
on gloo, by default, all channels share the default group and every tensor gets a unique tag.
Sends never wait: their handles are kept until `wait_sends` at the end of the step.

This module moves tensors only; what to send when is the worker's business.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from octopipe.actions import B, F, I
from octopipe.plan import JobShape, Place, Plan
from octopipe.runtime.parallel.groups import new_group
from octopipe.runtime.step.shapes import BoundarySpec, grad_specs


@dataclass(frozen=True)
class ChannelKey:
    boundary: int  # the stage that receives activations on this boundary (b-1 -> b)
    backward: bool  # False: activations b-1 -> b; True: gradients b -> b-1


@dataclass
class _Channel:
    key: ChannelKey
    src: int
    dst: int
    specs: BoundarySpec
    order: deque[int]  # microbatches in the order the sender sends them, not yet posted
    group: dist.ProcessGroup | None  # None: the default group, with tags
    posted: dict[int, tuple[list[dist.Work], list[torch.Tensor]]]


def channel_keys(plan: Plan) -> list[ChannelKey]:
    """Every channel of the plan, in the same order on every rank."""
    keys = []
    for b in range(1, plan.num_stages):
        if plan.stages[b - 1].device != plan.stages[b].device:
            keys += [ChannelKey(b, False), ChannelKey(b, True)]
    return keys


def sender_order(plan: Plan, key: ChannelKey) -> list[int]:
    """The microbatches in the order the channel's sender produces them."""
    stage = key.boundary if key.backward else key.boundary - 1
    kinds = (B, I) if key.backward else (F,)
    acts = plan.schedule.get(plan.stages[stage].device, ())
    return [a.mb for a in acts if a.stage == stage and a.kind in kinds]


class P2P:
    """The channels touching one rank; `specs[b]` is the activation entering stage b.

    Ranks are the plan's devices; globally, the job's shape numbers them (`JobShape.rank`:
    replica, device, context- and tensor-parallel rank). Each pipeline, one per replica, CP
    rank and TP rank, has channels of its own: TP rank t of CP rank c of a stage sends its part
    to TP rank t of CP rank c of the next."""

    def __init__(
        self,
        plan: Plan,
        specs: dict[int, BoundarySpec],
        device: torch.device,
        per_channel_groups: bool,
        shape: JobShape | None = None,
        place: Place | None = None,
    ) -> None:
        """`place` is this rank's (its `device` the plan's device index) in `shape`, the job's
        degrees (default: device 0 of one replica, no tensor parallelism).
        `per_channel_groups`: one group per channel, transfers matched by order, no tags (what
        NCCL needs; on gloo it is how tests check the ordering NCCL relies on)."""
        shape = shape or JobShape(1, plan.num_devices, 1)
        place = place or Place(0, 0, 0)
        replica, tp_rank, cp_rank = place.replica, place.tp_rank, place.cp_rank
        self.rank, self.device = place.device, device
        rank = place.device
        self._global = lambda d: shape.rank(replica, d, tp_rank, cp_rank)  # device -> rank
        self._tagged = not per_channel_groups
        self._num_mb = plan.num_microbatches
        self._max_entries = max((len(s) for s in specs.values()), default=1)
        self._channels: dict[ChannelKey, _Channel] = {}
        self._pending_sends: list[tuple[dist.Work, torch.Tensor]] = []
        self._plan = plan
        keys = channel_keys(plan)
        groups = {}
        if per_channel_groups:
            # new_group is collective: every rank creates every channel's group of every
            # pipeline, in one order.
            mine = shape.rank(replica, 0, tp_rank, cp_rank)
            for ranks in shape.pipelines():
                for key in keys:
                    group = new_group(sorted(ranks[d] for d in self._ends(key)))
                    if ranks[0] == mine:
                        groups[key] = group
        for key in keys:
            src, dst = self._ends(key)
            if rank not in (src, dst):
                continue
            group = groups.get(key)
            if group is not None:
                self._handshake(src, dst, group)
            spec = grad_specs(specs[key.boundary]) if key.backward else specs[key.boundary]
            self._channels[key] = _Channel(key, src, dst, spec, deque(), group, {})
        self.reset()

    def _ends(self, key: ChannelKey) -> tuple[int, int]:
        """The channel's (sending, receiving) devices."""
        plan = self._plan
        before, after = plan.stages[key.boundary - 1].device, plan.stages[key.boundary].device
        return (after, before) if key.backward else (before, after)

    def reset(self, orders: Plan | None = None) -> None:
        """Start a step: every channel expects its microbatches again, in the sender's order
        of the plan's schedule, or of `orders` (the same stages and placement in another
        order: held-out evaluation's forwards)."""
        for ch in self._channels.values():
            assert not ch.posted, f"unconsumed receives on {ch.key}"
            ch.order = deque(sender_order(orders or self._plan, ch.key))

    # --- the four transfers the worker needs ----------------------------------------------

    def send_forward(self, stage: int, mb: int, outputs: Sequence[torch.Tensor]) -> None:
        self._send(ChannelKey(stage + 1, False), mb, outputs)

    def send_backward(self, stage: int, mb: int, input_grads: Sequence[torch.Tensor]) -> None:
        self._send(ChannelKey(stage, True), mb, input_grads)

    def recv_forward(self, stage: int, mb: int) -> list[torch.Tensor]:
        return self._take(ChannelKey(stage, False), mb)

    def recv_backward(self, stage: int, mb: int) -> list[torch.Tensor]:
        return self._take(ChannelKey(stage + 1, True), mb)

    def prefetch_forward(self, stage: int, mb: int) -> None:
        self._post(ChannelKey(stage, False), mb)

    def prefetch_backward(self, stage: int, mb: int) -> None:
        self._post(ChannelKey(stage + 1, True), mb)

    def wait_sends(self) -> None:
        for work, _ in self._pending_sends:
            work.wait()
        self._pending_sends.clear()

    # --- mechanics ---------------------------------------------------------------------------

    def _handshake(self, src: int, dst: int, group: dist.ProcessGroup) -> None:
        """One tiny transfer, in the global channel order, so NCCL sets the pair's communicator
        up now: set up lazily by an early-posted receive, it would block this rank until the
        peer's first real send, which may itself wait on this rank."""
        probe = torch.zeros(1, device=self.device)
        if self.rank == src:
            dist.send(probe, self._global(dst), group=group)
        else:
            dist.recv(probe, self._global(src), group=group)

    def _tag(self, key: ChannelKey, mb: int, entry: int) -> int:
        if not self._tagged:
            return 0
        channel = 2 * key.boundary + int(key.backward)
        return (channel * self._num_mb + mb) * self._max_entries + entry

    def _send(self, key: ChannelKey, mb: int, tensors: Sequence[torch.Tensor]) -> None:
        ch = self._channels[key]
        if len(tensors) != len(ch.specs) or not all(
            s.matches(t) for s, t in zip(ch.specs, tensors)
        ):
            got = [(tuple(t.shape), t.dtype) for t in tensors]
            raise RuntimeError(
                f"stage boundary {key.boundary}, microbatch {mb}: sending {got}, "
                "but every microbatch must match the sample's "
                f"{[(s.shape, s.dtype) for s in ch.specs]}"
            )
        # Finished sends are dropped as we go so their buffers do not pile up within a step.
        self._pending_sends = [(w, t) for w, t in self._pending_sends if not w.is_completed()]
        for i, t in enumerate(tensors):
            t = t.detach().contiguous()
            work = dist.isend(t, self._global(ch.dst), group=ch.group, tag=self._tag(key, mb, i))
            self._pending_sends.append((work, t))

    def _post(self, key: ChannelKey, mb: int) -> None:
        """Post receives on the channel, in sender order, up to and including microbatch `mb`."""
        ch = self._channels[key]
        while mb not in ch.posted:
            if not ch.order:
                raise RuntimeError(
                    f"rank {self.rank}: no transfer of microbatch {mb} expected on {key}"
                )
            nxt = ch.order.popleft()
            bufs = [s.empty(self.device) for s in ch.specs]
            works = [
                dist.irecv(buf, self._global(ch.src), group=ch.group, tag=self._tag(key, nxt, i))
                for i, buf in enumerate(bufs)
            ]
            ch.posted[nxt] = (works, bufs)

    def _take(self, key: ChannelKey, mb: int) -> list[torch.Tensor]:
        self._post(key, mb)
        works, bufs = self._channels[key].posted.pop(mb)
        for w in works:
            w.wait()
        return bufs
