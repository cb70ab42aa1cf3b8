"""Our schedule generators against `torch.distributed.pipelining` (torch 2.13.0).

PyTorch's schedule classes build every rank's compute order in their constructor; we build
them over stand-in stage objects (no process group, no model) and compare compute actions
(F/B/I/W) per rank, with DualPipeV's overlapped forward+backward pairs expanded in order.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch.distributed.pipelining.schedules as tps

from octopipe.actions import Action
from octopipe.errors import InputError
from octopipe.schedules import generate

logging.getLogger("torch.distributed.pipelining.schedules").setLevel(logging.ERROR)


def _stand_in_stages(num_devices: int, stage_ids: list[int], num_stages: int) -> list:
    """What the schedule constructors read from a stage, for rank 0."""
    return [
        SimpleNamespace(
            group_size=num_devices,
            group_rank=0,
            num_stages=num_stages,
            stage_index=s,
            is_first=s == 0,
            is_last=s == num_stages - 1,
            submod=None,
            stage_index_to_group_rank=None,
        )
        for s in stage_ids
    ]


def _compute_actions(order: list) -> list[str]:
    """Compute actions only, overlapped pairs expanded; idle steps and comms dropped."""
    out = []
    for a in order:
        if a is None:
            continue
        if a.computation_type == tps.OVERLAP_F_B:
            out += [str(sub) for sub in a.sub_actions]
        elif a.computation_type in (tps.F, tps.B, tps.I, tps.W):
            out.append(str(a))
    return out


def torch_orders(cls, num_devices: int, num_microbatches: int, chunks: int, v_shape: bool = False):
    P, V = num_devices, chunks
    if cls in (tps.ScheduleGPipe, tps.Schedule1F1B):
        sched = cls(_stand_in_stages(P, [0], P)[0], num_microbatches)
    else:
        local = [0, 2 * P - 1] if v_shape else [c * P for c in range(V)]
        sched = cls(_stand_in_stages(P, local, P * V), num_microbatches)
    return {rank: _compute_actions(order) for rank, order in sched.pipeline_order.items()}


def our_orders(name: str, num_devices: int, num_microbatches: int, chunks: int | None = None):
    spec = generate(name, num_devices, num_microbatches, chunks)
    return {d: [str(a) for a in acts] for d, acts in spec.orders.items()}


GRID = [(P, M) for P in (1, 2, 3, 4, 5) for M in (1, 2, 3, 4, 5, 6, 8, 9, 10, 12, 16)]
GRID += [(6, 12), (8, 8), (8, 16), (8, 24), (8, 20)]


@pytest.mark.parametrize("P,M", GRID)
def test_gpipe_equals_torch(P, M):
    assert our_orders("gpipe", P, M) == torch_orders(tps.ScheduleGPipe, P, M, 1)


@pytest.mark.parametrize("P,M", [(P, M) for P, M in GRID if M >= P])  # torch needs M >= P
def test_1f1b_equals_torch_except_its_last_rank_off_by_one(P, M):
    ours, theirs = our_orders("1f1b", P, M), torch_orders(tps.Schedule1F1B, P, M, 1)
    for rank in range(P - 1):
        assert ours[rank] == theirs[rank]
    # Schedule1F1B._get_pipeline_order (a description only; its runtime does not read it)
    # numbers the last rank's forwards from 1 (1..M instead of 0..M-1): with no warm-up
    # forward its counter is incremented before the first use. Everything else agrees.
    last = P - 1
    renumbered = [
        str(a._replace(mb=a.mb - 1)) if a.kind == "F" else str(a)
        for a in map(Action.parse, theirs[last])
    ]
    assert ours[last] == renumbered


@pytest.mark.parametrize("P,M", GRID)
@pytest.mark.parametrize("V", [2, 3])
def test_gpipe_with_chunks_is_looped_bfs_with_backwards_in_forward_order(P, M, V):
    ours = our_orders("gpipe", P, M, V)
    theirs = torch_orders(tps.ScheduleLoopedBFS, P, M, V)

    # Looped BFS runs each stage's backwards from the last microbatch down; GPipe's (and ours)
    # from the first up. Same stage order, same forwards: map microbatch m -> M-1-m in the
    # backwards to compare.
    def mirror(a: str) -> str:
        if "B" not in a:
            return a
        stage, mb = a.split("B")
        return f"{stage}B{M - 1 - int(mb)}"

    assert ours == {r: [mirror(a) for a in acts] for r, acts in theirs.items()}


def _supported_by_torch_rounds(P, M):
    return M % max(1, M // P) == 0


@pytest.mark.parametrize("P,M", GRID)
@pytest.mark.parametrize("V", [1, 2, 3])
def test_interleaved_1f1b_equals_torch(P, M, V):
    if not _supported_by_torch_rounds(P, M):
        with pytest.raises(ValueError):
            torch_orders(tps.ScheduleInterleaved1F1B, P, M, V)
        if V > 1:  # with one chunk the round size cannot change the order: we accept it
            with pytest.raises(InputError):
                generate("i1f1b", P, M, V)
        return
    assert our_orders("i1f1b", P, M, V) == torch_orders(tps.ScheduleInterleaved1F1B, P, M, V)


@pytest.mark.parametrize("P,M", GRID)
@pytest.mark.parametrize("V", [1, 2, 3])
def test_zbh1_equals_torch_interleaved_zero_bubble(P, M, V):
    if not _supported_by_torch_rounds(P, M):
        with pytest.raises(ValueError):
            torch_orders(tps.ScheduleInterleavedZeroBubble, P, M, V)
        if V > 1:  # with one chunk the round size cannot change the order: we accept it
            with pytest.raises(InputError):
                generate("zbh1", P, M, V)
        return
    assert our_orders("zbh1", P, M, V) == torch_orders(tps.ScheduleInterleavedZeroBubble, P, M, V)


@pytest.mark.parametrize("P,M", GRID)
def test_zbv_equals_torch(P, M):
    assert our_orders("zbv", P, M) == torch_orders(tps.ScheduleZBVZeroBubble, P, M, 2, v_shape=True)


@pytest.mark.parametrize("P,M", [(P, M) for P, M in GRID if M >= 2 * P])
def test_dualpipev_equals_torch(P, M):
    theirs = torch_orders(tps.ScheduleDualPipeV, P, M, 2, v_shape=True)
    assert our_orders("dualpipev", P, M) == theirs
