"""The job's process groups and its device mesh: DP x PP x CP x TP, in the shape's rank order
(`JobShape.rank`), and the EP groups over a device's ranks (`JobShape.expert_groups`).

Every group is made with the run's timeout (`octopipe.runtime.parallel.groups`), and the mesh is put
together from them with `DeviceMesh.from_group`, so a stuck DTensor or FSDP collective fails
after `--timeout` as a transfer does (`init_device_mesh` would give each group torch's default
of 30 minutes). `new_group` is collective: every rank of the world creates every group, in one
order, ranks past the job included; those get no mesh.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from octopipe.plan import JobShape, Place
from octopipe.runtime.parallel.context import ContextGroup
from octopipe.runtime.parallel.experts import ExpertGroup
from octopipe.runtime.parallel.groups import new_group

DIMS = ("dp", "pp", "cp", "tp")  # the grid's dimensions (`rank_grid`)


@dataclass(frozen=True)
class JobMesh:
    """This rank's place in the job and the groups it computes in."""

    layout: JobShape
    place: Place | None  # None: a rank past the job
    mesh: DeviceMesh | None  # dims DIMS; only when DTensors are needed (TP or FSDP)
    # The ranks holding the same weights as this one (this device's TP rank in every replica
    # and CP rank; dp x cp > 1): they average their gradients.
    dp_group: dist.ProcessGroup | None
    experts: ExpertGroup | None = None  # this rank's EP group (ep > 1)
    # The ranks holding the same experts as this one (their gradients are summed), where
    # there are more than one.
    expert_dp_group: dist.ProcessGroup | None = None
    context: ContextGroup | None = None  # this rank's CP group (cp > 1)
    copies_mesh: DeviceMesh | None = None  # `dp_group` as a mesh, under CP (FSDP2's)

    @property
    def tp_mesh(self) -> DeviceMesh | None:
        return None if self.mesh is None else self.mesh["tp"]

    @property
    def dp_mesh(self) -> DeviceMesh | None:
        """The ranks holding the same weights: the replicas (and, under CP, their CP ranks)."""
        if self.copies_mesh is not None:
            return self.copies_mesh
        return None if self.mesh is None else self.mesh["dp"]


def build_job_mesh(layout: JobShape, rank: int, device_type: str, with_mesh: bool) -> JobMesh:
    """The groups of `layout` seen from `rank`; with `with_mesh`, the DeviceMesh too (made of the
    groups along each dimension). Without it only data and context parallelism's groups are
    made."""
    place = layout.place(rank)
    grid = rank_grid(layout)
    dims = DIMS if with_mesh else tuple(n for n in ("dp", "cp") if getattr(layout, n) > 1)
    mine = {name: _groups_along(grid, DIMS.index(name), rank) for name in dims}
    mesh = None
    if with_mesh and place is not None:
        mesh = DeviceMesh.from_group(
            [mine[name] for name in DIMS], device_type, mesh=grid, mesh_dim_names=DIMS
        )
    dp_group = mine.get("dp") if layout.dp > 1 else None
    context, copies_mesh = None, None
    if layout.cp > 1:
        # The copies of a weight: one TP rank of one device, every replica and CP rank.
        copies = grid.permute(1, 3, 0, 2).reshape(-1, layout.dp * layout.cp)
        dp_group = mine["cp"] if layout.dp == 1 else _groups_of(copies.tolist(), rank)
        if place is not None:
            ranks = tuple(
                layout.rank(place.replica, place.device, place.tp_rank, c) for c in range(layout.cp)
            )
            context = ContextGroup(layout.cp, place.cp_rank, ranks, mine["cp"])
            if with_mesh:
                members = [
                    layout.rank(r, place.device, place.tp_rank, c)
                    for r in range(layout.dp)
                    for c in range(layout.cp)
                ]
                copies_mesh = DeviceMesh.from_group(dp_group, device_type, mesh=sorted(members))
    experts, expert_dp = (
        _expert_groups(layout, rank, device_type) if layout.ep > 1 else (None, None)
    )
    return JobMesh(layout, place, mesh, dp_group, experts, expert_dp, context, copies_mesh)


def rank_grid(shape: JobShape) -> torch.Tensor:
    """Every rank of the job at [replica, device, cp_rank, tp_rank] (dims DIMS), in the shape's
    rank order."""
    return torch.tensor(
        [
            [
                [[shape.rank(r, d, t, c) for t in range(shape.tp)] for c in range(shape.cp)]
                for d in range(shape.pp)
            ]
            for r in range(shape.dp)
        ]
    )


def _expert_groups(
    layout: JobShape, rank: int, device_type: str
) -> tuple[ExpertGroup | None, dist.ProcessGroup | None]:
    """Every device's EP groups and the groups of ranks holding the same experts (made by
    every rank, in one order); this rank's."""
    mine, same = None, None
    for device in range(layout.pp):
        groups = layout.expert_groups(device)
        for ranks in groups:
            group = new_group(ranks)
            if rank in ranks:
                mesh = DeviceMesh.from_group(group, device_type, mesh=ranks)
                mine = ExpertGroup(layout.ep, ranks.index(rank), group, mesh)
        if len(groups) > 1:
            for i in range(layout.ep):
                holders = [ranks[i] for ranks in groups]
                group = new_group(holders)
                if rank in holders:
                    same = group
    return mine, same


def _groups_along(grid: torch.Tensor, dim: int, rank: int) -> dist.ProcessGroup | None:
    """Create the group of every line of the grid along `dim`; the one holding `rank`."""
    return _groups_of(grid.movedim(dim, -1).reshape(-1, grid.shape[dim]).tolist(), rank)


def _groups_of(lines: list[list[int]], rank: int) -> dist.ProcessGroup | None:
    """Create a group of each list of ranks (collective: every rank, in one order); the one
    holding `rank`."""
    found = None
    for ranks in lines:
        group = new_group(ranks)
        if rank in ranks:
            found = group
    return found
