"""Which job shapes a cluster allows: the parallel degrees and the microbatches of one job.

    job = Job("llama3-70b", cluster, global_batch=512, seq_len=4096)
    layouts = candidate_layouts(cluster, 512, num_layers=83, tp_fits=...)   # TP x PP x DP x b
    layouts = search_space(job, num_layers=83, fits=..., experts=0)          # every degree

A layout is a `JobShape` (`octopipe.plan.shape`): TP (inside a node), CP, PP, DP (and EP among
the DP x CP ranks) with TP x CP x PP x DP GPUs, the microbatch size b and count M with
D x M x b = the global batch, the recomputation, the optimizer sharding and the rank order.
Nothing here costs or searches a layout.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from octopipe.config.planning import DEFAULT_HEADROOM
from octopipe.errors import InputError
from octopipe.layouts.cluster import Cluster
from octopipe.layouts.stack import Stack
from octopipe.plan.shape import DEFAULT_RANK_ORDER, RANK_ORDERS, RECOMPUTE_KINDS, JobShape

MAX_MICROBATCH_SIZE = 8
MIN_CP_CHUNK = 1024  # tokens of a sequence a context-parallel rank holds at least
MAX_EP = 64  # the widest expert-parallel group searched


@dataclass(frozen=True)
class Job:
    """What to lay out: a model config on a cluster at a global batch (samples of seq_len)."""

    config: str
    cluster: Cluster
    global_batch: int
    seq_len: int = 4096
    stack: Stack = field(default_factory=Stack)  # how the training framework runs it
    memory_headroom: float = DEFAULT_HEADROOM  # of each GPU's memory, left for what plans miss
    # The rank orders the job's shapes are searched in, the first the default (the references'
    # and a given layout's where they have none of their own); empty: every order the engine
    # the search is for runs (`LayoutSearch` fills them in).
    rank_orders: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.rank_orders, str):  # one order given as a name
            object.__setattr__(self, "rank_orders", (self.rank_orders,))
        if not set(self.rank_orders) <= set(RANK_ORDERS):
            raise InputError("--rank-order", f"expected one of {', '.join(RANK_ORDERS)}")

    @property
    def rank_order(self) -> str:
        return self.rank_orders[0] if self.rank_orders else DEFAULT_RANK_ORDER

    @property
    def tokens(self) -> int:
        return self.global_batch * self.seq_len


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidate_layouts(
    cluster: Cluster, global_batch: int, num_layers: int, tp_fits: Callable[[int], bool]
) -> list[JobShape]:
    """Every TP (dividing a node, `tp_fits` the model) x PP (at most one device per layer) x
    DP = the cluster, with every power-of-two microbatch size up to MAX_MICROBATCH_SIZE that
    divides the per-replica batch."""
    N, G = cluster.size, cluster.gpus_per_node
    out = []
    for tp in divisors(min(N, G)):  # nodes are whole (Cluster): tp divides N too
        if not tp_fits(tp):
            continue
        for pp in divisors(N // tp):
            dp = N // (tp * pp)
            if pp > num_layers or global_batch % dp:
                continue
            per_replica = global_batch // dp
            b = 1
            while b <= min(MAX_MICROBATCH_SIZE, per_replica):
                if per_replica % b == 0:
                    out.append(JobShape(tp, pp, dp, b, per_replica // b))
                b *= 2
    return out


def search_space(
    job: Job,
    num_layers: int,
    fits: Callable[[int, int, int], bool],
    experts: int = 0,
    zero_stages: tuple[int, ...] = (0, 1),
    fold_experts: bool = False,
) -> list[JobShape]:
    """Every layout of the job: `candidate_layouts`' TP x PP x DP x b, with every CP degree
    that leaves each rank at least MIN_CP_CHUNK tokens of a sequence, every EP degree dividing
    the MoE model's `experts` and the DP x CP ranks (up to MAX_EP; `fold_experts`: the TP x CP
    x DP ranks, as Megatron-Core's MoE parallel folding lays EP), each recomputation, and each
    of `zero_stages` where there are replicas (0 and 1 by default; 2 and 3 price ZeRO-2 and
    FSDP, `sharded_dp.py`). `fits(tp, cp, ep)` says whether the model splits so."""
    cluster = job.cluster
    out = []
    for cp in divisors(cluster.size):
        if cp > 1 and (job.seq_len % cp or job.seq_len // cp < MIN_CP_CHUNK):
            continue

        # A pipeline device is a TP x CP group: lay TP x PP x DP out on a cluster 1/cp the size.
        def tp_fits(tp: int, cp: int = cp) -> bool:
            return fits(tp, cp, 1)

        for base in candidate_layouts(_Scaled(cluster, cp), job.global_batch, num_layers, tp_fits):
            ranks = base.dp * cp
            folded = ranks * base.tp if fold_experts else ranks
            eps = [1] + [
                e for e in divisors(folded) if 1 < e <= MAX_EP and experts and experts % e == 0
            ]
            for ep in eps:
                if ep > 1 and not fits(base.tp, cp, ep):
                    continue
                for recompute in RECOMPUTE_KINDS:
                    for zero in zero_stages if ranks > 1 else (0,):
                        out.append(
                            replace(
                                base,
                                cp=cp,
                                recompute=recompute,
                                ep=ep,
                                zero=zero,
                                rank_order=job.rank_order,
                            )
                        )
    return out


class _Scaled:
    """A cluster seen as 1/cp as many GPUs (each pipeline device a TP x CP group), for
    `candidate_layouts`' TP x PP x DP enumeration: TP still divides a node."""

    def __init__(self, cluster: Cluster, cp: int):
        self.size = cluster.size // cp
        self.gpus_per_node = cluster.gpus_per_node
