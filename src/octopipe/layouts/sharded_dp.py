"""Sharded data parallelism beyond ZeRO-1: ZeRO-2 (gradients sharded), ZeRO-3 / FSDP (weights
too), and HSDP (sharded within groups of the DP x CP ranks, replicated across the groups).

    sh = sharding(layout)                                    # stage, shard group, replicas, mode
    layers, exposed = shard_layers(profile.layers, estimates, sh, shard_ring, settings, ep)

What each stage costs (docs/COSTMODEL.md, "Sharded data parallelism"), S the shard group:

- **ZeRO-2**: each microbatch's backward reduce-scatters every layer's gradient over S as it is
  produced (DeepSpeed's stage 2 under gradient accumulation), behind the layer's weight
  gradient: only what W cannot hide is exposed. Held: weights, gradients / S, state / S.
  After the step, the updated weights are all-gathered as under ZeRO-1.
- **ZeRO-3, per microbatch** (no pipeline: FSDP2's `reshard_after_forward=True`, torchtitan's
  default without PP): every microbatch all-gathers each layer's weights before its forward
  and again before its backward, and reduce-scatters its gradient; each overlaps with the
  neighbouring layer's compute (FSDP2 prefetches one layer ahead), so a layer exposes only
  what its own phase cannot hide. Held: everything / S, plus two layers' unsharded weights and
  gradients in flight (the current and the prefetched one).
- **ZeRO-3, held across microbatches** (under PP, as torchtitan and `torch.distributed.pipelining`
  run FSDP: no reshard after forward or backward until the last microbatch): one all-gather of
  the stage's weights a step and one reduce-scatter of its gradients after its last backward,
  ZeRO-1's traffic. Held: weights and gradients unsharded during the step, state / S.
- **HSDP** (a shard group smaller than DP x CP): after the reduce-scatter, each rank's shard is
  all-reduced across the replicas (ranks S apart) once a step.

Experts of MoE layers are sharded over the expert-data-parallel ranks, S / EP of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from octopipe.costmodel.build import LayerEstimate
from octopipe.costmodel.settings import Settings
from octopipe.profile import DataParallel, LayerCost

# FSDP2 holds the layer it computes and the one it prefetches unsharded.
LAYERS_IN_FLIGHT = 2


@dataclass(frozen=True)
class Sharding:
    stage: int
    shards: int
    """S: the ranks a layer's state is sharded over."""
    replicas: int
    """DP x CP / S: the HSDP groups that all-reduce each shard (1: plain FSDP)."""
    held: bool
    """ZeRO-3 weights gathered once a step and held across microbatches (under PP)."""

    @property
    def per_microbatch(self) -> bool:
        """Whether every microbatch's backward reduce-scatters (ZeRO-2, ZeRO-3 unheld)."""
        return self.stage == 2 or (self.stage == 3 and not self.held)


def sharding(
    stage: int, dp: int, cp: int, pp: int, shard_group: int = 0, held: bool = False
) -> Sharding:
    """`held`: ZeRO-3 holds the gathered weights across microbatches even without PP (as
    OctoPipe's executor runs FSDP2); under PP it always does."""
    ranks = dp * cp
    shards = shard_group or ranks
    return Sharding(stage, shards, ranks // shards, held=stage == 3 and (pp > 1 or held))


def replica_ring(
    sh: Sharding,
    tp: int,
    stride: int,
    gpus_per_node: int,
    nvlink: float,
    nic: float,
    latency: float,
) -> DataParallel:
    """The all-reduce of each shard across HSDP's replicas: ranks tp x stride x S GPUs apart
    (stride: PP under OctoPipe's numbering, 1 under Megatron's), each over its own NIC when
    that crosses nodes (every rank reduces its shard side by side)."""
    if sh.replicas == 1:
        return DataParallel()
    across = tp * stride * sh.shards >= gpus_per_node
    return DataParallel(
        degree=sh.replicas,
        bandwidth=nic if across else nvlink,
        latency=latency if across else 0.0,
    )


def state_bytes(e: LayerEstimate, sh: Sharding, s: Settings, ep: int) -> int:
    """A layer's static bytes on one GPU under ZeRO-2/3: its weights, gradients and optimizer
    state as the stage shards them, and its FP8 weight copies where its BF16 weights stay
    whole (ZeRO-2, ZeRO-3 held). ZeRO-3 per microbatch casts the gathered weights and frees
    the copies with them: they are in flight (`fp8_copy_bytes`), not held."""
    w, g, o = s.weight_bytes, s.grad_bytes, s.optimizer_bytes
    total = 0 if sh.stage == 3 and not sh.held else fp8_copy_bytes(e, s)
    for params, shards in (
        (e.params - e.expert_params, sh.shards),
        (e.expert_params, max(1, sh.shards // ep)),
    ):
        if sh.stage == 2:
            total += params * (w + (g + o) / shards)
        elif sh.held:
            total += params * (w + g + o / shards)
        else:
            total += params * (w + g + o) / shards
    return math.ceil(total)


def fp8_copy_bytes(e: LayerEstimate, s: Settings) -> float:
    """The layer's FP8 weight copies (and their transposes, scales) beside its BF16 weights."""
    return e.param_bytes - e.params * s.bytes_per_param


def shard_layers(
    layers: tuple[LayerCost, ...],
    estimates: list[LayerEstimate],
    sh: Sharding,
    shard_ring: DataParallel,
    s: Settings,
    ep: int,
) -> tuple[tuple[LayerCost, ...], list[float]]:
    """The layers under ZeRO-2/3: their static bytes, and, where every microbatch gathers or
    scatters, the communication each phase leaves exposed added to its time. Also each
    layer's exposed seconds per microbatch (for the step's breakdown). Gradients the
    simulator's data-parallel ring still reduces are the shard HSDP all-reduces (grad / S)."""
    scatter = shard_ring.model_copy(update={"sharded": True})
    out, exposed = [], []
    for layer, e in zip(layers, estimates):
        extra = {"f": 0.0, "b": 0.0, "w": 0.0}
        if sh.stage == 3 and not sh.held:
            gather = shard_ring.allgather_time(e.params * s.weight_bytes)
            extra["f"] = max(0.0, gather - layer.f)
            extra["b"] = max(0.0, gather - layer.b)
        if sh.per_microbatch:
            extra["w"] = max(0.0, scatter.allreduce_time(e.grad_bytes) - layer.w)
        update = {k: getattr(layer, k) + v for k, v in extra.items()}
        update["param_bytes"] = state_bytes(e, sh, s, ep)
        if sh.per_microbatch:  # what is left for the ring of replicas: the shard
            update["grad_bytes"] = math.ceil(layer.grad_bytes / sh.shards)
        if layer.recompute is not None and extra["b"]:
            update["recompute"] = layer.recompute.model_copy(
                update={
                    kind: alt.model_copy(update={"b": alt.b + extra["b"]})
                    for kind, alt in layer.recompute
                    if alt is not None
                }
            )
        out.append(layer.model_copy(update=update))
        exposed.append(sum(extra.values()))
    if sh.stage == 3 and not sh.held and out:
        # The layers in flight: unsharded weights, their FP8 copies and gradients of the
        # largest, on its device.
        def gathered(e: LayerEstimate) -> float:
            return e.params * (s.weight_bytes + s.grad_bytes) + fp8_copy_bytes(e, s)

        big = max(range(len(out)), key=lambda i: gathered(estimates[i]))
        transient = LAYERS_IN_FLIGHT * gathered(estimates[big])
        out[big] = out[big].model_copy(update={"param_bytes": out[big].param_bytes + transient})
    return tuple(out), exposed
