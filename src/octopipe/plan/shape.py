"""The job's shape: every parallel degree, the rank order, the optimizer sharding and the
microbatching of one training job, as one frozen value that every reader asks.

    shape = JobShape(tp=8, pp=4, dp=2, microbatch_size=1, num_microbatches=32, zero=1)
    shape.world_size, shape.copies, shape.shards         # 64 GPUs, 2 copies, 2 shards
    shape.rank(replica=1, device=2, tp_rank=3)          # the rank numbering, in its order
    shape.to_json()                                     # the plan's `parallelism` object

A plan holds its shape (`Plan.shape`, the `parallelism` key of docs/FORMATS.md); the cluster
search enumerates shapes, the cost model prices them, each engine refuses, writes and launches
them, and `octopipe run` builds its process groups from one. The shape checks only what no
engine could run (degrees below one, unknown names); what an engine cannot run is that engine's
refusal (`octopipe.engines`). Pure arithmetic: no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

NO_RECOMPUTE = "none"
# As the cost model names them, from least memory saved to most (cheapest in time first).
RECOMPUTE_KINDS = (NO_RECOMPUTE, "selective", "full")
ZERO_STAGES = (0, 1, 2, 3)
# Where a device's data-parallel ranks sit (docs/FORMATS.md, plan `parallelism.rank_order`):
# "octopipe" numbers TP fastest, then CP, then PP, then DP (a replica's pipeline on
# neighbouring ranks); "megatron" TP, CP, DP, then PP (Megatron-Core's `tp-cp-ep-dp-pp` and
# torchtitan's mesh: a stage's replicas, and the EP groups folded over them, on neighbouring
# ranks).
RANK_ORDERS = ("octopipe", "megatron")
DEFAULT_RANK_ORDER = "octopipe"


@dataclass(frozen=True)
class Place:
    """One rank's coordinates in the job."""

    replica: int  # data-parallel index, 0 <= replica < dp
    device: int  # the plan's pipeline device
    tp_rank: int  # index inside the device's tensor-parallel group
    cp_rank: int = 0  # index inside its context-parallel group


@dataclass(frozen=True)
class JobShape:
    """TP x CP x PP x DP ranks, b sequences per microbatch and M microbatches a step per
    replica, EP among a device's ranks, the optimizer sharding, the recomputation and the order
    ranks are numbered in."""

    tp: int
    pp: int
    dp: int
    microbatch_size: int = 1
    num_microbatches: int = 1
    cp: int = 1
    """Context parallelism: each rank holds seq_len / cp tokens of a sequence."""
    recompute: str = NO_RECOMPUTE
    """Activation recomputation of every stage: none, selective, full."""
    ep: int = 1
    """Expert parallelism: a MoE layer's experts spread over this many of a device's ranks."""
    zero: int = 0
    """ZeRO stage: 1 the optimizer state sharded over the shards, 2 also the gradients, 3 also
    the weights (FSDP)."""
    shard_group: int = 0
    """HSDP: ZeRO-2/3 shards over groups of this many of the DP x CP ranks and replicates over
    the rest; 0: over all of them."""
    etp: int = 0
    """Expert TP of the MoE layers, folded with EP over the stage's TP x CP x DP ranks
    (Megatron-Core's MoE parallel folding); 0: TP without EP, 1 with it."""
    rank_order: str = DEFAULT_RANK_ORDER
    """How global ranks are numbered (`RANK_ORDERS`)."""

    def __post_init__(self) -> None:
        degrees = (self.tp, self.pp, self.dp, self.cp, self.ep, self.microbatch_size)
        if min(*degrees, self.num_microbatches) < 1:
            raise ValueError(f"degrees and microbatches must be positive: {self}")
        if min(self.shard_group, self.etp) < 0:
            raise ValueError(f"shard_group and etp must not be negative: {self}")
        if self.zero not in ZERO_STAGES:
            raise ValueError(f"ZeRO stage {self.zero} is not one of {ZERO_STAGES}")
        if self.recompute not in RECOMPUTE_KINDS:
            raise ValueError(f"recompute {self.recompute!r} is not one of {RECOMPUTE_KINDS}")
        if self.rank_order not in RANK_ORDERS:
            raise ValueError(f"rank order {self.rank_order!r} is not one of {RANK_ORDERS}")

    # --- what the degrees make ----------------------------------------------------------

    @property
    def world_size(self) -> int:
        """The ranks (GPUs) the job uses: TP x CP x PP x DP."""
        return self.tp * self.cp * self.pp * self.dp

    @property
    def copies(self) -> int:
        """How many ranks hold the same weights and average their gradients: DP x CP."""
        return self.dp * self.cp

    @property
    def shards(self) -> int:
        """The ranks ZeRO shards over: the shard group, or all DP x CP copies."""
        return self.shard_group or self.copies

    @property
    def stage_ranks(self) -> int:
        """How many ranks hold (a share of) each stage: every replica's TP x CP group."""
        return self.tp * self.copies

    @property
    def shards_optimizer(self) -> bool:
        """Whether the optimizer state is sharded (any ZeRO stage)."""
        return self.zero >= 1

    @property
    def expert_tp(self) -> int:
        return self.etp or (self.tp if self.ep == 1 else 1)

    @property
    def expert_data_parallel(self) -> int:
        """The ranks of a stage holding the same experts: TP x CP x DP / (EP x ETP)."""
        return max(1, self.stage_ranks // (self.ep * self.expert_tp))

    @property
    def sequences_per_step(self) -> int:
        """Sequences of one step over all replicas: D x M x b."""
        return self.dp * self.num_microbatches * self.microbatch_size

    # --- the rank numbering ---------------------------------------------------------------

    def rank(self, replica: int, device: int, tp_rank: int = 0, cp_rank: int = 0) -> int:
        """The global rank of TP rank `tp_rank` of CP rank `cp_rank` of pipeline device
        `device` in `replica`: TP fastest, then CP, then the order's PP and DP
        (docs/FORMATS.md, plan `parallelism`)."""
        inner = tp_rank + self.tp * cp_rank
        if self.rank_order == "megatron":
            return inner + self.tp * self.cp * (replica + self.dp * device)
        return inner + self.tp * self.cp * (device + self.pp * replica)

    def place(self, rank: int) -> Place | None:
        """The coordinates of `rank`, or None for a rank past the job."""
        if not 0 <= rank < self.world_size:
            return None
        rest, tp_rank = divmod(rank, self.tp)
        rest, cp_rank = divmod(rest, self.cp)
        if self.rank_order == "megatron":
            device, replica = divmod(rest, self.dp)
        else:
            replica, device = divmod(rest, self.pp)
        return Place(replica, device, tp_rank, cp_rank)

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

    # --- words and JSON ----------------------------------------------------------------------

    def describe(self) -> str:
        """One line of the degrees, as the layout tables and notes print them."""
        zero = f", ZeRO-{self.zero}" if self.zero else ""
        zero += f" (HSDP, shards of {self.shard_group})" if self.shard_group else ""
        cp = f" x CP {self.cp}" if self.cp > 1 else ""
        ep = f" (EP {self.ep})" if self.ep > 1 else ""
        ep = f" (EP {self.ep}, ETP {self.etp})" if self.etp else ep
        again = f", recompute {self.recompute}" if self.recompute != NO_RECOMPUTE else ""
        order = f", ranks {self.rank_order}" if self.rank_order != DEFAULT_RANK_ORDER else ""
        return (
            f"TP {self.tp}{cp} x PP {self.pp} x DP {self.dp}{ep}, "
            f"b {self.microbatch_size} x M {self.num_microbatches}{zero}{again}{order}"
        )

    def rank_rule(self) -> str:
        """The numbering in words, with the degrees: the line `octopipe run` prints."""
        tc = f"cp_rank + {self.cp} x (" if self.cp > 1 else ""
        close = ")" if self.cp > 1 else ""
        if self.rank_order == "megatron":
            outer = f"replica + {self.dp} x device"
        else:
            outer = f"device + {self.pp} x replica"
        cp = f" x CP {self.cp}" if self.cp > 1 else ""
        return (
            f"ranks: rank = tp_rank + {self.tp} x ({tc}{outer}{close}) "
            f"(TP {self.tp}{cp} x PP {self.pp} x DP {self.dp})"
        )

    def degrees(self) -> dict[str, int | str]:
        """The shape's keys as the `--json` lines of `estimate` and `plan --gpus` name them."""
        return {
            "tp": self.tp,
            "cp": self.cp,
            "pp": self.pp,
            "dp": self.dp,
            "ep": self.ep,
            "microbatch_size": self.microbatch_size,
            "microbatches": self.num_microbatches,
            "recompute": self.recompute,
            "zero": self.zero,
            **({"shard_group": self.shard_group} if self.shard_group else {}),
            **({"etp": self.etp} if self.etp else {}),
            **({"rank_order": self.rank_order} if self.rank_order != DEFAULT_RANK_ORDER else {}),
        }

    def to_json(self) -> dict[str, Any]:
        """The plan's `parallelism` object (docs/FORMATS.md): `tp`, `pp`, `dp` and
        `microbatch_size`, then each optional key only where it differs from its default. The
        microbatch count is the plan's own `num_microbatches`."""
        out: dict[str, Any] = {
            "tp": self.tp,
            "pp": self.pp,
            "dp": self.dp,
            "microbatch_size": self.microbatch_size,
        }
        for key, default in _OPTIONAL_KEYS:
            value = getattr(self, key)
            if value != default:
                out[key] = value
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any], num_microbatches: int) -> JobShape:
        """A checked `parallelism` object (`plan/checks.py` reads files) and the plan's
        microbatch count."""
        optional = {key: data[key] for key, _ in _OPTIONAL_KEYS if key in data}
        return cls(
            data["tp"],
            data["pp"],
            data["dp"],
            data["microbatch_size"],
            num_microbatches,
            **optional,
        )


# The `parallelism` keys written only where they differ from these defaults, in this order
# (the order plan files have always had them in).
_OPTIONAL_KEYS = (
    ("zero", 0),
    ("cp", 1),
    ("ep", 1),
    ("recompute", NO_RECOMPUTE),
    ("shard_group", 0),
    ("etp", 0),
    ("rank_order", DEFAULT_RANK_ORDER),
)
