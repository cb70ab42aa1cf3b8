"""`octopipe run` builds its process groups in the plan's rank order: every rank's TP, CP, DP,
PP and EP groups, on real gloo process groups, against the numbering written out by hand."""

from datetime import timedelta

import pytest
import torch.distributed as dist

from octopipe.plan import JobShape
from octopipe.runtime.launch.launcher import spawn_ranks

pytestmark = pytest.mark.slow  # real process groups: the full suite, not `-m "not slow"`


def report_groups(rank, world, store, shape):
    from octopipe.runtime.parallel.mesh import build_job_mesh

    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=world,
        timeout=timedelta(seconds=60),
    )  # fmt: skip
    try:
        mesh = build_job_mesh(shape, rank, "cpu", with_mesh=True)

        def members(group) -> list[int]:
            return sorted(dist.get_process_group_ranks(group))

        mine = {
            "tp": members(mesh.tp_mesh.get_group()),
            "pp": members(mesh.mesh["pp"].get_group()),
            "dp": members(mesh.dp_group),
            "cp": sorted(mesh.context.ranks),
            "ep": members(mesh.experts.group),
        }
        every = [None] * world if rank == 0 else None
        dist.gather_object(mine, every, dst=0)
        return every
    finally:
        dist.destroy_process_group()


def _megatron_rank(t: int, c: int, r: int, p: int, T: int, C: int, D: int) -> int:
    """Megatron-Core's `tp-cp-ep-dp-pp`: TP fastest, then CP, then DP, PP outermost."""
    return t + T * (c + C * (r + D * p))


def _octopipe_rank(t: int, c: int, r: int, p: int, T: int, C: int, P: int) -> int:
    """OctoPipe's numbering: TP fastest, then CP, then PP, DP outermost."""
    return t + T * (c + C * (p + P * r))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("order", ["megatron", "octopipe"])
def test_every_group_follows_the_plans_rank_order(order):
    T, C, P, D = 2, 2, 2, 2
    shape = JobShape(tp=T, pp=P, dp=D, cp=C, ep=2, rank_order=order)
    every = spawn_ranks(report_groups, (shape,), shape.world_size, "groups")

    def rank(t, c, r, p):
        if order == "megatron":
            return _megatron_rank(t, c, r, p, T, C, D)
        return _octopipe_rank(t, c, r, p, T, C, P)

    coords = [(t, c, r, p) for t in range(T) for c in range(C) for r in range(D) for p in range(P)]
    assert sorted(rank(*x) for x in coords) == list(range(shape.world_size))
    for t, c, r, p in coords:
        groups = every[rank(t, c, r, p)]
        assert groups["tp"] == sorted(rank(u, c, r, p) for u in range(T))
        assert groups["cp"] == sorted(rank(t, k, r, p) for k in range(C))
        assert groups["pp"] == sorted(rank(t, c, r, q) for q in range(P))
        # The copies of a weight: every replica and CP rank of this TP rank of this device.
        assert groups["dp"] == sorted(rank(t, k, s, p) for k in range(C) for s in range(D))
        # EP takes consecutive runs of a device's ranks listed CP fastest, then DP.
        run = [rank(t, k, s, p) for s in range(D) for k in range(C)]
        mine = run.index(rank(t, c, r, p)) // 2
        assert groups["ep"] == sorted(run[2 * mine : 2 * mine + 2])
