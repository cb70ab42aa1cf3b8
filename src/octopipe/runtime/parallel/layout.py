"""Which global rank runs what: the plan's `parallelism` numbering, TP fastest, then CP, then
PP, then DP.

`rank = tp_rank + T * (cp_rank + C * (device + P * replica))` (docs/FORMATS.md, plan
`parallelism`): the T x C ranks of one pipeline device are neighbours, so torchrun fills a node
with whole tensor- and context-parallel groups first. With C = 1 the rule is the one without
CP. Pure arithmetic, no torch: the CLI prints it without loading torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Place:
    """One rank's coordinates in the job."""

    replica: int  # data-parallel index, 0 <= replica < dp
    device: int  # the plan's pipeline device
    tp_rank: int  # index inside the device's tensor-parallel group
    cp_rank: int = 0  # index inside its context-parallel group


@dataclass(frozen=True)
class RankLayout:
    """The degrees of a job: T tensor-parallel x C context-parallel ranks per device, P
    devices, D replicas; EP divides experts over E of a device's ranks."""

    tp: int
    pp: int
    dp: int
    ep: int = 1  # expert parallelism: MoE experts divided over this many of a device's ranks
    cp: int = 1  # context parallelism: each sequence divided over this many ranks

    def __post_init__(self) -> None:
        if min(self.tp, self.pp, self.dp, self.ep, self.cp) < 1:
            raise ValueError(f"degrees must be positive: {self}")
        if (self.tp * self.cp * self.dp) % self.ep:
            raise ValueError(f"EP {self.ep} does not divide a device's TP x CP x DP ranks: {self}")

    @property
    def size(self) -> int:
        """The ranks the job uses; a larger world's other ranks only join the collectives."""
        return self.tp * self.cp * self.pp * self.dp

    @property
    def stage_ranks(self) -> int:
        """How many ranks hold (a share of) each stage: every replica's TP x CP group."""
        return self.tp * self.cp * self.dp

    @property
    def copies(self) -> int:
        """How many ranks hold the same weights and average their gradients: D x C."""
        return self.dp * self.cp

    def rank(self, replica: int, device: int, tp_rank: int = 0, cp_rank: int = 0) -> int:
        return tp_rank + self.tp * (cp_rank + self.cp * (device + self.pp * replica))

    def pipelines(self) -> list[list[int]]:
        """Every pipeline of the job (one per replica, CP rank and TP rank) as its devices'
        global ranks, in one order on every rank."""
        return [
            [self.rank(r, d, t, c) for d in range(self.pp)]
            for r in range(self.dp)
            for c in range(self.cp)
            for t in range(self.tp)
        ]

    def expert_groups(self, device: int) -> list[list[int]]:
        """The EP groups of a pipeline device: consecutive runs of `ep` of its ranks listed
        CP-fastest, then DP, then TP (docs/FORMATS.md): within one TP rank while EP divides
        C x D, over TP ranks too beyond (Megatron-Core's MoE parallel folding). Each group in
        rank order (its process group's): its i-th member holds the i-th E/ep of the experts."""
        ranks = [
            self.rank(r, device, t, c)
            for t in range(self.tp)
            for r in range(self.dp)
            for c in range(self.cp)
        ]
        return [sorted(ranks[i : i + self.ep]) for i in range(0, len(ranks), self.ep)]

    def place(self, rank: int) -> Place | None:
        """The coordinates of `rank`, or None for a rank past the job."""
        if rank >= self.size:
            return None
        rest, tp_rank = divmod(rank, self.tp)
        rest, cp_rank = divmod(rest, self.cp)
        replica, device = divmod(rest, self.pp)
        return Place(replica, device, tp_rank, cp_rank)

    def describe(self) -> str:
        """The line `octopipe run` prints: the rule and the degrees."""
        if self.cp == 1:
            return (
                f"ranks: rank = tp_rank + {self.tp} x (device + {self.pp} x replica) "
                f"(TP {self.tp} x PP {self.pp} x DP {self.dp})"
            )
        return (
            f"ranks: rank = tp_rank + {self.tp} x (cp_rank + {self.cp} x (device + {self.pp} x "
            f"replica)) (TP {self.tp} x CP {self.cp} x PP {self.pp} x DP {self.dp})"
        )
