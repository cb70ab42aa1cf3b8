"""The cost model of one job's layouts: per-layer estimates and profiles, and what a step costs
beyond the simulated pipeline. `octopipe estimate` and the layout search of `plan --gpus` both
stand on it, so they predict the same step for the same layout and plan.

    costs = LayoutCosts(job)
    profile, replicas = costs.profile(layout)       # topology, ZeRO-1, gradient buckets
    step = costs.step(layout, plan, sim)             # + optimizer step, ZeRO-1's all-gather

A step is the pipeline as simulated (compute, transfers, the data-parallel reductions;
docs/FORMATS.md), then each device's optimizer update of its parameters and, with ZeRO-1, the
all-gather of the updated weight shards (docs/COSTMODEL.md, "The step"). Nothing here
searches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from octopipe.costmodel.build import LayerEstimate, TimeParts, build_profile, estimate_layers
from octopipe.costmodel.hardware import Hardware
from octopipe.costmodel.hf_config import load_architecture
from octopipe.costmodel.precision import weight_cast_bytes
from octopipe.costmodel.settings import Settings
from octopipe.errors import InputError
from octopipe.layouts.layout import Job
from octopipe.layouts.sharded_dp import Sharding, replica_ring, shard_layers, sharding
from octopipe.layouts.stack import layer_settings
from octopipe.plan import Plan
from octopipe.plan.shape import JobShape
from octopipe.profile import DataParallel, Profile
from octopipe.sim import SimResult

# Bytes the optimizer step moves per parameter it updates, besides the gradient: it reads the
# gradient twice (the global norm, then Adam), reads and writes the FP32 master weight and the
# two moments (4 x 3 x 2), and writes the working copy of the weight.
ADAM_STATE_TRAFFIC = 24


@dataclass(frozen=True)
class Tail:
    """What follows the pipeline on the slowest device: the optimizer update, and ZeRO-1's
    all-gather of the updated weights (0 without it)."""

    optimizer: float
    all_gather: float

    @property
    def total(self) -> float:
        return self.optimizer + self.all_gather


def optimizer_seconds(
    params: float,
    grad_bytes: int,
    weight_bytes: int,
    hw: Hardware,
    fp8_params: float = 0.0,
    precision: str = "bf16",
) -> float:
    """The memory-bound Adam update of `params` parameters (docs/COSTMODEL.md), and the cast
    of the `fp8_params` among a device's weights to their FP8 copies once a step."""
    traffic = params * (2 * grad_bytes + ADAM_STATE_TRAFFIC + weight_bytes)
    traffic += weight_cast_bytes(fp8_params, weight_bytes, precision)
    return traffic / (hw.memory_bandwidth * hw.memory_efficiency)


class LayoutCosts:
    """Per-layer estimates and profiles of one job's layouts, built once per (TP, CP,
    microbatch size, recomputation, hardware)."""

    def __init__(self, job: Job):
        self.job = job
        self.arch = load_architecture(job.config)
        self._layers: dict[tuple, list[LayerEstimate]] = {}
        self._profiles: dict[tuple, Profile] = {}
        self._exposed: dict[JobShape, list[float]] = {}  # ZeRO-2/3's per layer and microbatch
        self._ep_across: dict[tuple, dict[int, int]] = {}
        self._expert_rings: dict[tuple, DataParallel] = {}

    def settings(self, layout: JobShape) -> Settings:
        cluster = self.job.cluster
        return layer_settings(
            tp=layout.tp,
            cp=layout.cp,
            microbatch_size=layout.microbatch_size,
            recompute=layout.recompute,
            stack=self.job.stack,
            seq_len=self.job.seq_len,
            cp_across_nodes=cluster.cp_across_nodes(layout.tp, layout.cp),
            ep=layout.ep,
            ep_across_nodes=self.ep_across_nodes(layout),
            ep_node_ranks=self.ep_node_ranks(layout),
            etp=layout.etp,
        )

    def _stride(self, layout: JobShape) -> int:
        """How many TP x CP groups lie between two DP ranks of a stage: PP under OctoPipe's GPU
        numbering (PP before DP), 1 under Megatron's rank order (PP outermost)."""
        return 1 if layout.rank_order == "megatron" else layout.pp

    def ep_across_nodes(self, layout: JobShape) -> bool:
        """Whether an expert-parallel group spans nodes. MoE parallel folding lays groups of
        ETP x EP consecutive ranks over a stage's TP x CP x DP ranks (TP fastest, then CP, then
        DP: the GPU numbering of docs/FORMATS.md); an EP group is every ETP-th of them."""
        return len(self._ep_nodes(layout)) > 1

    def ep_node_ranks(self, layout: JobShape) -> int:
        """The fewest of an EP group's ranks on one of its nodes."""
        return min(self._ep_nodes(layout).values(), default=1)

    def _ep_nodes(self, layout: JobShape) -> dict[int, int]:
        """Per node an EP group touches, how many of its ranks it holds ({} without EP)."""
        if layout.ep == 1:
            return {}
        etp = layout.expert_tp
        key = (layout.tp, layout.cp, layout.ep, etp, self._stride(layout))
        if key not in self._ep_across:  # asked for every layout's layers: kept
            nodes: dict[int, int] = {}
            for i in range(0, layout.ep * etp, etp):
                node = self.job.cluster.node_of(self._stage_gpu(layout, i))
                nodes[node] = nodes.get(node, 0) + 1
            self._ep_across[key] = nodes
        return self._ep_across[key]

    def _stage_gpu(self, layout: JobShape, i: int) -> int:
        """The GPU of the i-th of pipeline device 0's TP x CP x DP ranks (TP fastest, then
        CP, then DP), in the layout's rank order."""
        tp, cp = layout.tp, layout.cp
        return layout.rank(i // (tp * cp), 0, i % tp, (i // tp) % cp)

    def expert_ring(self, layout: JobShape) -> DataParallel:
        """The ring that reduces an expert's gradients: the stage's ranks holding the same
        experts, every ETP x EP-th of its TP x CP x DP ranks (MoE parallel folding). Where
        EP fills a node, each of its steps crosses nodes on one GPU's NIC, where the dense
        ring of consecutive ranks drives every NIC of a node at once."""
        fold = layout.ep * layout.expert_tp
        key = (layout.tp, layout.cp, fold, layout.expert_data_parallel, self._stride(layout))
        if key not in self._expert_rings:  # asked for every profile and step of a layout: kept
            edp = layout.expert_data_parallel
            members = [self._stage_gpu(layout, k * fold) for k in range(edp)]
            self._expert_rings[key] = self.job.cluster.ring_of(members)
        return self._expert_rings[key]

    def _expert_grad_scale(self, layout: JobShape, ring: DataParallel) -> float:
        """The simulator reduces a stage's gradients on one ring, the dense one: an expert's
        gradient byte counts there as this many bytes, its own ring's seconds per byte over
        the dense ring's (the rings' latencies left out: a bucket's few steps). Without a
        dense ring (DP x CP = 1) there is none to scale: experts replicated over TP ranks
        (EP x ETP < TP) then reduce unpriced."""
        if self.arch.moe is None or ring.degree == 1:
            return 1.0
        experts = self.expert_ring(layout)
        if experts.degree == 1:
            return 0.0

        def per_byte(r: DataParallel) -> float:
            return (r.degree - 1) / r.degree / r.bandwidth

        return per_byte(experts) / per_byte(ring)

    def _key(self, layout: JobShape, hw: Hardware) -> tuple:
        """What a layout's layers depend on (not DP, nor the microbatch count; PP only through
        how it lays an EP group over nodes, so PP degrees that do not share one). The EP
        group's fewest ranks on a node also say whether it spans nodes (fewer than EP)."""
        return (
            layout.tp,
            layout.cp,
            self.ep_node_ranks(layout),
            layout.ep,
            layout.etp,
            layout.microbatch_size,
            layout.recompute,
            hw.name,
        )

    def hardware(self, name: str | None = None) -> Hardware:
        cluster = self.job.cluster
        if name is None:
            return cluster.reference
        return next(g.hardware for g in cluster.groups if g.hardware.name == name)

    def layers(self, layout: JobShape, hardware: str | None = None) -> list[LayerEstimate]:
        """The layers' estimates for one microbatch of `layout` on one GPU of `hardware`."""
        hw = self.hardware(hardware)
        key = self._key(layout, hw)
        if key not in self._layers:
            self._layers[key] = estimate_layers(self.arch, hw, self.settings(layout))
        return self._layers[key]

    def base_profile(self, layout: JobShape, hardware: str | None = None) -> Profile:
        """The profile of `layout`'s layers on `hardware`, before topology."""
        hw = self.hardware(hardware)
        key = self._key(layout, hw)
        if key not in self._profiles:
            self._profiles[key] = build_profile(
                self.arch, hw, self.settings(layout), estimates=self.layers(layout, hardware)
            )
        return self._profiles[key]

    def fits_degrees(self, tp: int, cp: int = 1, ep: int = 1) -> bool:
        """Whether the model's heads (and experts) split `tp` ways, the sequence `cp` ways and
        the experts `ep` ways."""
        try:
            self.layers(JobShape(tp, 1, 1, 1, 1, cp=cp, ep=ep))
        except InputError:
            return False
        return True

    def speeds(self, layout: JobShape) -> dict[str, float]:
        """Each preset's speed relative to the reference: the ratio of the model's total
        estimated work (a mixed cluster's devices differ by one factor each)."""

        def work(hw: str) -> float:
            return sum(l.work for l in self.base_profile(layout, hw).layers)

        ref = work(self.job.cluster.reference.name)
        kinds = {g.hardware.name for g in self.job.cluster.groups}
        return {hw: ref / work(hw) for hw in kinds}

    def profile(self, layout: JobShape) -> tuple[Profile, tuple[tuple, ...]]:
        """Replica 0's profile of `layout`, and every distinct replica's devices (one tuple
        on a cluster of one kind of GPU)."""
        base = self.base_profile(layout)
        cluster = self.job.cluster
        speeds = self.speeds(layout) if cluster.mixed else {}
        topo = cluster.replica_topology(
            layout.tp, layout.pp, layout.dp, speeds, layout.cp, layout.rank_order
        )
        stack = self.job.stack
        ring = topo.data_parallel.model_copy(
            update={
                "bucket_bytes": stack.grad_bucket_bytes,
                "sharded": layout.shards_optimizer,
                "at_end": stack.reduce_at_end,
            }
        )
        zero = f"-zero{layout.zero}" if layout.zero else ""
        cp = f"-cp{layout.cp}" if layout.cp > 1 else ""
        ep = f"-ep{layout.ep}" if layout.ep > 1 else ""
        usable = 1.0 - self.job.memory_headroom
        devices = tuple(
            d.model_copy(update={"memory_bytes": d.memory_bytes * usable}) for d in topo.devices
        )
        replicas = tuple(
            tuple(d.model_copy(update={"memory_bytes": d.memory_bytes * usable}) for d in r)
            for r in topo.replicas
        )
        profile = base.model_copy(
            update={
                "name": f"{base.name}{cp}-pp{layout.pp}-dp{layout.dp}{ep}{zero}",
                "devices": devices,
                "links": topo.links,
                "data_parallel": ring if ring.degree > 1 else topo.data_parallel,
                "blocking_transfers": stack.p2p == "blocking",
            }
        )
        if layout.zero <= 1:
            profile = self._expert_gradients(profile, layout, ring)
        if layout.zero == 1 and ring.degree > 1:
            profile = self._shard_optimizer(profile, layout, ring.degree)
        elif layout.zero >= 2 and ring.degree > 1:
            profile = self._shard_all(profile, layout, ring)
        return profile, replicas

    def _expert_gradients(self, profile: Profile, layout: JobShape, ring: DataParallel) -> Profile:
        """The layers' expert gradients as the bytes of the dense ring that take as long as
        their own ring's reduction (`_expert_grad_scale`)."""
        scale = self._expert_grad_scale(layout, ring)
        if scale == 1.0:
            return profile
        grad = self.settings(layout).grad_bytes
        layers = []
        for layer, e in zip(profile.layers, self.layers(layout)):
            dense = (e.params - e.expert_params) * grad
            layers.append(
                layer.model_copy(
                    update={"grad_bytes": math.ceil(dense + e.expert_params * grad * scale)}
                )
            )
        return profile.model_copy(update={"layers": tuple(layers)})

    def _sharding(self, layout: JobShape) -> Sharding:
        return sharding(
            layout.zero,
            layout.dp,
            layout.cp,
            layout.pp,
            layout.shard_group,
            held=self.job.stack.zero3_held,
        )

    def rings(self, layout: JobShape) -> tuple[DataParallel, DataParallel]:
        """ZeRO-2/3's rings of one TP rank of pipeline device 0: over its shard group (laid out
        as a DP ring of S / CP replicas, the first of them), and across HSDP's replicas."""
        cluster = self.job.cluster
        sh = self._sharding(layout)
        shard = cluster.data_parallel_ring(replace(layout, dp=sh.shards // layout.cp))
        hw = cluster.reference
        across = replica_ring(
            sh,
            layout.tp,
            self._stride(layout),
            cluster.gpus_per_node,
            min(g.hardware.tp_bandwidth for g in cluster.groups),
            min(g.hardware.link_bandwidth for g in cluster.groups),
            hw.link_latency,
        )
        return shard, across

    def _shard_all(self, profile: Profile, layout: JobShape, ring: DataParallel) -> Profile:
        """ZeRO-2/3 and HSDP (`sharded_dp.py`): the layers' held bytes and exposed gathers and
        scatters; the simulator's ring reduce-scatters over the shard group once a step (ZeRO-3
        held under PP) or all-reduces the shards across the replicas (the others)."""
        sh = self._sharding(layout)
        shard, across = self.rings(layout)
        layers, exposed = shard_layers(
            profile.layers, self.layers(layout), sh, shard, self.settings(layout), layout.ep
        )
        self._exposed[layout] = exposed
        keep = {"bucket_bytes": ring.bucket_bytes, "at_end": ring.at_end}
        if sh.held:
            dp = shard.model_copy(update={**keep, "sharded": True})
        else:
            dp = across.model_copy(update=keep) if across.degree > 1 else DataParallel()
        return profile.model_copy(update={"layers": layers, "data_parallel": dp})

    def _shard_optimizer(self, profile: Profile, layout: JobShape, ranks: int) -> Profile:
        """ZeRO-1 (Megatron-LM's distributed optimizer): the optimizer state of dense weights
        sharded over the `ranks` that hold them (DP x CP), of experts over the ranks that hold
        each expert (DP x CP / EP)."""
        s = self.settings(layout)
        per_param, state = s.bytes_per_param, s.optimizer_bytes
        dense = per_param - state + state / ranks
        expert = per_param - state + state / layout.expert_data_parallel
        layers = []
        for layer, e in zip(profile.layers, self.layers(layout)):
            bytes_ = (e.params - e.expert_params) * dense + e.expert_params * expert
            layers.append(layer.model_copy(update={"param_bytes": math.ceil(bytes_)}))
        return profile.model_copy(update={"layers": tuple(layers)})

    # --- the step ------------------------------------------------------------------------

    def device_params(
        self, layout: JobShape, plan: Plan, fp8: bool = False, experts: bool = False
    ) -> list[int]:
        """Per pipeline device: the parameters of its stages on one GPU (one TP rank); `fp8`:
        only those of FP8 linears; `experts`: only the MoE layers' experts."""
        layers = self.layers(layout)
        params = [0] * plan.num_devices
        for stage in plan.stages:
            params[stage.device] += sum(
                e.fp8_params if fp8 else e.expert_params if experts else e.params
                for e in layers[stage.start : stage.end]
            )
        return params

    def tail(self, layout: JobShape, plan: Plan, profile: Profile) -> Tail:
        """The slowest device's optimizer update after the pipeline, and the weights' all-gather
        of ZeRO-1/2 (and of ZeRO-3 held under PP, for the next step, with HSDP's all-reduce of
        the gradient shards across the replicas)."""
        s = self.settings(layout)
        hw = self.hardware()
        ring = profile.data_parallel
        shards = ring.degree if layout.shards_optimizer else 1
        across = DataParallel()
        if layout.zero >= 2 and layout.dp * layout.cp > 1:
            sh = self._sharding(layout)
            ring, across = self.rings(layout)
            shards = sh.shards
            if not sh.held:
                across = DataParallel()  # the simulator's ring did it
            if sh.stage == 3 and not sh.held:
                ring = DataParallel()  # gathered again in the next forward
        worst = Tail(0.0, 0.0)
        fp8 = self.device_params(layout, plan, fp8=True)
        experts = self.device_params(layout, plan, experts=True)
        expert_ring = self.expert_ring(layout) if layout.zero == 1 and any(experts) else None
        for params, quantized, expert, device in zip(
            self.device_params(layout, plan), fp8, experts, profile.device_list()
        ):
            update = optimizer_seconds(
                params / shards, s.grad_bytes, s.weight_bytes, hw, quantized, s.precision
            )
            gather = 0.0
            if expert_ring is not None:  # the experts' shards gather on their own ring
                gather = ring.allgather_time((params - expert) * s.weight_bytes)
                gather += expert_ring.allgather_time(expert * s.weight_bytes)
            elif layout.shards_optimizer:
                gather = ring.allgather_time(params * s.weight_bytes)
            gather += across.allreduce_time(params * s.grad_bytes / shards)
            one = Tail(update / device.speed, gather)
            worst = max(worst, one, key=lambda t: t.total)
        return worst

    def step_time(self, layout: JobShape, plan: Plan, profile: Profile, sim: SimResult) -> float:
        """The step: the simulated pipeline (its steady step when overlapped) and the tail."""
        return sim.iteration_time + self.tail(layout, plan, profile).total

    def busy_parts(self, layout: JobShape, plan: Plan, profile: Profile) -> list[TimeParts]:
        """Per device: its seconds of compute, recomputation and exposed TP/CP communication
        in one step (every stage on it runs each microbatch's F, I and W once)."""
        layers = self.layers(layout)
        exposed = self._exposed.get(layout, [0.0] * len(layers))
        devices = profile.device_list()
        parts = [TimeParts() for _ in devices]
        for stage in plan.stages:
            d = stage.device
            one = sum((e.parts for e in layers[stage.start : stage.end]), TimeParts())
            one = one + TimeParts(dp_comm=sum(exposed[stage.start : stage.end]))
            parts[d] = parts[d] + one.scaled(plan.num_microbatches / devices[d].speed)
        return parts
