"""Which global rank runs what: the plan's `parallelism` numbering, TP fastest, then PP, then DP.

`rank = tp_rank + T * (device + P * replica)` (docs/FORMATS.md, plan `parallelism`): the T ranks
of one pipeline device are neighbours, so torchrun fills a node with whole tensor-parallel
groups first. Pure arithmetic, no torch: the CLI prints it without loading torch. A context-
parallel degree, when it comes, goes between TP and PP (`tp_rank + T * (cp_rank + C * ...)`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Place:
    """One rank's coordinates in the job."""

    replica: int  # data-parallel index, 0 <= replica < dp
    device: int  # the plan's pipeline device
    tp_rank: int  # index inside the device's tensor-parallel group


@dataclass(frozen=True)
class RankLayout:
    """The degrees of a job: T tensor-parallel ranks per device, P devices, D replicas."""

    tp: int
    pp: int
    dp: int
    ep: int = 1  # expert parallelism: MoE experts divided over this many of a device's ranks

    def __post_init__(self) -> None:
        if min(self.tp, self.pp, self.dp, self.ep) < 1:
            raise ValueError(f"degrees must be positive: {self}")
        if (self.tp * self.dp) % self.ep:
            raise ValueError(f"EP {self.ep} does not divide a device's TP x DP ranks: {self}")

    @property
    def size(self) -> int:
        """The ranks the job uses; a larger world's other ranks only join the collectives."""
        return self.tp * self.pp * self.dp

    @property
    def stage_ranks(self) -> int:
        """How many ranks hold (a share of) each stage: every replica's TP group."""
        return self.tp * self.dp

    def rank(self, replica: int, device: int, tp_rank: int = 0) -> int:
        return tp_rank + self.tp * (device + self.pp * replica)

    def pipelines(self) -> list[list[int]]:
        """Every pipeline of the job (one per replica and TP rank) as its devices' global
        ranks, in one order on every rank."""
        return [
            [self.rank(r, d, t) for d in range(self.pp)]
            for r in range(self.dp)
            for t in range(self.tp)
        ]

    def expert_groups(self, device: int) -> list[list[int]]:
        """The EP groups of a pipeline device: consecutive runs of `ep` of its ranks listed
        DP-fastest, then TP (docs/FORMATS.md): within one TP rank while EP divides DP, over
        TP ranks too beyond (Megatron-Core's MoE parallel folding). Each group in rank order
        (its process group's): its i-th member holds the i-th E/ep of the experts."""
        ranks = [self.rank(r, device, t) for t in range(self.tp) for r in range(self.dp)]
        return [sorted(ranks[i : i + self.ep]) for i in range(0, len(ranks), self.ep)]

    def place(self, rank: int) -> Place | None:
        """The coordinates of `rank`, or None for a rank past the job."""
        if rank >= self.size:
            return None
        rest, tp_rank = divmod(rank, self.tp)
        replica, device = divmod(rest, self.pp)
        return Place(replica, device, tp_rank)

    def describe(self) -> str:
        """The line `octopipe run` prints: the rule and the degrees."""
        return (
            f"ranks: rank = tp_rank + {self.tp} x (device + {self.pp} x replica) "
            f"(TP {self.tp} x PP {self.pp} x DP {self.dp})"
        )
