"""A cluster of GPUs in nodes, and the topology one pipeline replica sees on it.

`parse_gpus("16", "h100")` or `parse_gpus("4xh100,4xa100")` describes the GPUs; `Cluster` puts
them in nodes of `gpus_per_node`, in the order given. `replica_topology` answers, for a layout
of tensor (T), context (C), pipeline (P) and data (D) parallel degrees, what docs/FORMATS.md's
profile keys need: each pipeline device's node, speed and memory, the links inside and between
nodes, and the data-parallel ring. GPUs are numbered by the job's shape (`JobShape.rank`, the
`parallelism` rule of docs/FORMATS.md); a pipeline device is a group of T x C GPUs.

Nothing here estimates a model's costs (`costmodel/`) or searches (`layouts.py`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from octopipe.costmodel.hardware import Hardware, hardware_preset
from octopipe.errors import InputError
from octopipe.limits import MAX_GPUS
from octopipe.plan.shape import DEFAULT_RANK_ORDER, JobShape
from octopipe.profile import DataParallel, Device, Link, Links


@dataclass(frozen=True)
class GpuGroup:
    count: int
    hardware: Hardware


def parse_gpus(spec: str, default_hardware: str = "h100") -> tuple[GpuGroup, ...]:
    """'16' (GPUs of `default_hardware`) or '4xh100,4xa100' (counts of presets, in order)."""
    groups = []
    for part in spec.split(","):
        # ASCII digits only: Python's int() would also read other scripts' digits.
        m = re.fullmatch(r"\s*([0-9]{1,30})\s*(?:x\s*([A-Za-z0-9_-]+))?\s*", part)
        if m is None:
            raise InputError("--gpus", f"expected N or NxPRESET[,NxPRESET...], got {spec!r}")
        count = int(m.group(1))
        if count < 1:
            raise InputError("--gpus", f"a GPU count must be at least 1, got {part.strip()!r}")
        groups.append(GpuGroup(count, hardware_preset(m.group(2) or default_hardware)))
    total = sum(g.count for g in groups)
    if total > MAX_GPUS:  # before a cluster of that many is built
        raise InputError("--gpus", f"{total:,} GPUs; at most {MAX_GPUS:,} are laid out")
    return tuple(groups)


@dataclass(frozen=True)
class Topology:
    """What one pipeline replica runs on: its devices (each a TP group), links, DP ring."""

    devices: tuple[Device, ...]
    links: Links
    data_parallel: DataParallel
    replicas: tuple[tuple[Device, ...], ...]
    """The distinct replicas' devices, replica 0's first, each one's nodes numbered from 0 (only
    which devices share a node matters): more than one on a mixed cluster, where the plan is
    tuned on replica 0 and then checked on the others."""


class Cluster:
    """GPUs in nodes of `gpus_per_node`, filled in the order the groups are given."""

    def __init__(self, groups: tuple[GpuGroup, ...], gpus_per_node: int):
        if gpus_per_node < 1:
            raise InputError("--gpus-per-node", f"must be at least 1, got {gpus_per_node}")
        self.groups, self.gpus_per_node = groups, gpus_per_node
        self.gpus: tuple[Hardware, ...] = tuple(g.hardware for g in groups for _ in range(g.count))
        if self.size > gpus_per_node and self.size % gpus_per_node:
            raise InputError(
                "--gpus",
                f"{self.size} GPUs do not fill whole nodes of {gpus_per_node} (a part-filled "
                "node would give some replicas other links than the rest)",
            )
        if len(groups) > 1:
            for g in groups:
                if g.count % gpus_per_node:
                    raise InputError(
                        "--gpus",
                        f"{g.count}x{g.hardware.name} does not fill whole nodes of "
                        f"{gpus_per_node}: a node holds one kind of GPU",
                    )

    @property
    def size(self) -> int:
        return len(self.gpus)

    @property
    def reference(self) -> Hardware:
        """The preset the layers' costs are estimated for (the first group's)."""
        return self.groups[0].hardware

    @property
    def mixed(self) -> bool:
        return len({g.hardware.name for g in self.groups}) > 1

    def node_of(self, gpu: int) -> int:
        return gpu // self.gpus_per_node

    def describe(self) -> str:
        kinds = " + ".join(f"{g.count}x{g.hardware.name}" for g in self.groups)
        nodes = -(-self.size // self.gpus_per_node)
        return f"{kinds} in {nodes} node{'s' if nodes > 1 else ''} of {self.gpus_per_node}"

    def cp_across_nodes(self, tp: int, cp: int) -> bool:
        """Whether a context-parallel group spans nodes (its ring then runs over the NICs)."""
        return cp > 1 and tp * cp > self.gpus_per_node

    def replica_topology(
        self,
        tp: int,
        pp: int,
        dp: int,
        speed: dict[str, float] | None = None,
        cp: int = 1,
        rank_order: str = DEFAULT_RANK_ORDER,
    ) -> Topology:
        """The topology of replica 0 under TP x CP x PP x DP = the cluster's size, its GPUs
        numbered in `rank_order`: which node each pipeline device sits on, so which pipeline
        hops cross nodes, and the data-parallel ring; `speed` gives each preset's speed
        relative to the reference (1.0 where not given)."""
        shape = JobShape(tp, pp, dp, cp=cp, rank_order=rank_order)
        if tp * cp * pp * dp != self.size:
            raise ValueError(f"{tp} x {cp} x {pp} x {dp} != {self.size} GPUs")
        if min(self.gpus_per_node, self.size) % tp:
            raise ValueError(f"TP {tp} does not divide a node of {self.gpus_per_node}")
        speed = speed or {}
        kinds = [g.hardware for g in self.groups]
        kind_of = {hw.name: i for i, hw in enumerate(kinds)}
        # Each replica as plain (kind, node) pairs, nodes renumbered from 0: thousands of
        # replicas compare as tuples of ints before any Device is built. On a cluster of one
        # kind, a replica's pattern depends only on where in a node it starts, so the replicas
        # repeat with a period of at most a node's GPUs.
        period = dp if self.mixed or len(self.groups) > 1 else min(dp, self.gpus_per_node)
        patterns: dict[tuple[tuple[int, int], ...], None] = {}
        for r in range(period):
            renumber: dict[int, int] = {}
            pattern = []
            for p in range(pp):
                first = shape.rank(r, p)  # the group's first GPU
                node = renumber.setdefault(self.node_of(first), len(renumber))
                pattern.append((kind_of[self.gpus[first].name], node))
            patterns.setdefault(tuple(pattern), None)

        def device(kind: int, node: int) -> Device:
            hw = kinds[kind]
            return Device(
                speed=speed.get(hw.name, 1.0),
                memory_bytes=hw.memory_bytes,
                node=node,
                name=hw.name,
            )

        replicas = tuple(tuple(device(k, n) for k, n in pattern) for pattern in patterns)
        # NVLink between pipeline neighbours of a node, the NIC between nodes; on a mixed
        # cluster, the slower preset's of each (one link per kind in the profile format).
        links = Links(
            intra_node=Link(bandwidth=self._slowest("tp_bandwidth"), latency=self._latency),
            inter_node=Link(bandwidth=self._slowest("link_bandwidth"), latency=self._latency),
        )
        return Topology(replicas[0], links, self.data_parallel_ring(shape), replicas)

    def _slowest(self, field: str) -> float:
        return min(getattr(g.hardware, field) for g in self.groups)

    @property
    def _latency(self) -> float:
        return max(g.hardware.link_latency for g in self.groups)

    def data_parallel_ring(self, shape: JobShape) -> DataParallel:
        """The gradient ring of one TP rank of pipeline device 0: its D x C copies (the data
        and context-parallel ranks hold the same weights). Inside one node it runs over
        NVLink. Across nodes NCCL runs one ring per NIC: a node holding k of the ring's GPUs
        drives their k NICs, so the ring moves k x the NIC's bandwidth, capped by NVLink's;
        the node with the fewest such GPUs bounds it (TP ranks reduce their own shards side by
        side, each over its own NICs). Each step pays the network's latency where it crosses
        nodes (NVLink hops' few microseconds are left out)."""
        members = [
            shape.rank(r, 0, 0, c) for r in range(shape.dp) for c in range(shape.cp)
        ]  # every pipeline device's ring is laid out alike: device 0's stands for all
        return self.ring_of(members)

    def ring_of(self, members: list[int]) -> DataParallel:
        """The ring over these GPUs, priced as `data_parallel_ring` says."""
        if len(members) == 1:
            return DataParallel()
        per_node: dict[int, int] = {}
        for g in members:
            per_node[self.node_of(g)] = per_node.get(self.node_of(g), 0) + 1
        nvlink = self._slowest("tp_bandwidth")
        if len(per_node) == 1:
            return DataParallel(degree=len(members), bandwidth=nvlink, latency=0.0)
        nics = min(per_node.values())
        bandwidth = min(nvlink, nics * self._slowest("link_bandwidth"))
        crossing = len(per_node) / len(members)  # the share of ring steps that cross nodes
        return DataParallel(
            degree=len(members), bandwidth=bandwidth, latency=crossing * self._latency
        )
