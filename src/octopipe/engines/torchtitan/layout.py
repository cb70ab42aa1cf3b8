"""A plan's whole layout in torchtitan 0.3's terms: its degrees (TP, CP, PP, EP and the data
parallelism as `dp_replicate` x `dp_shard`), the activation checkpointing, and where torchtitan
runs the plan otherwise than it was priced (one line each), or why it cannot run it at all.

    lay = titan_layout(plan, profile)        # TitanLayout; InputError: what 0.3 cannot express
    lay.parallelism(), lay.world, lay.notes

What torchtitan 0.3.0 does, from its source (`torchtitan/distributed/parallel_dims.py`,
`models/llama3/parallelize.py`, `config/configs.py`):

- data parallelism is FSDP2 over `dp_shard` x `cp` (it always shards the weights, gradients and
  optimizer state over the CP ranks too) and replication over `dp_replicate`: whole replicas
  when both `dp_shard` and `cp` are 1 (its docs say DDP; its llama3 applies FSDP2 over a
  dp_replicate x 1 mesh and logs "Applied HSDP": whole weights, gradients and optimizer state
  on every rank, gradients all-reduced, as checked by benchmarks/titan_check.py), HSDP when
  both sides are > 1. There is no ZeRO-1 (optimizer state sharded alone, Megatron-LM's
  distributed optimizer);
- expert parallelism borrows its ranks from `dp_shard` x `cp` x `tp` (experts are not
  tensor-parallel once EP > 1); `dp_replicate` and `pp` lie outside it;
- activation checkpointing is one setting for every block: none, selective (per op: every
  second matmul's output saved) or full, and none is possible under a split backward (a
  checkpointed block cannot be backpropagated twice, "Trying to backward an extra time").

Nothing here writes a file or imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from octopipe.engines.answer import planned_shape
from octopipe.engines.torchtitan.plan import splits_backward
from octopipe.errors import InputError
from octopipe.plan import RECOMPUTE_KINDS, JobShape, Plan
from octopipe.profile import Profile

RUNNER_HINT = "`octopipe plan --gpus N --runner torchtitan` plans only what torchtitan runs"


@dataclass(frozen=True)
class TitanLayout:
    """How torchtitan 0.3 runs a plan of `shape`: its data parallelism as `dp_replicate` x
    `dp_shard`, its activation checkpointing, and where it departs from the plan's costs."""

    shape: JobShape  # the plan's (microbatches of 1 sample where nothing records their size)
    dp_replicate: int
    dp_shard: int
    activation_checkpoint: str  # none, selective or full: torchtitan's setting
    notes: tuple[str, ...] = field(default=())  # where torchtitan departs from the plan's costs

    @property
    def tp(self) -> int:
        return self.shape.tp

    @property
    def cp(self) -> int:
        return self.shape.cp

    @property
    def pp(self) -> int:
        return self.shape.pp

    @property
    def ep(self) -> int:
        return self.shape.ep

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def microbatch_size(self) -> int:
        return self.shape.microbatch_size

    @property
    def num_microbatches(self) -> int:
        return self.shape.num_microbatches

    @property
    def world(self) -> int:
        """GPUs (processes) one run takes."""
        return self.shape.world_size

    @property
    def local_batch_size(self) -> int:
        """Samples a rank's forward-backward pass takes: under PP the step's M microbatches
        (torchtitan cuts them itself); without PP one microbatch, accumulated M times."""
        return self.microbatch_size * (self.num_microbatches if self.pp > 1 else 1)

    @property
    def global_batch_size(self) -> int:
        """Samples a step takes over all replicas: torchtitan accumulates gradients over
        global / (local x DP) passes."""
        return self.num_microbatches * self.microbatch_size * self.dp

    @property
    def accumulation(self) -> int:
        return self.global_batch_size // (self.local_batch_size * self.dp)

    def parallelism(self) -> dict[str, int]:
        """torchtitan 0.3's `parallelism` degrees (its ParallelismConfig's field names)."""
        return {
            "pipeline_parallel_degree": self.pp,
            "tensor_parallel_degree": self.tp,
            "context_parallel_degree": self.cp,
            "data_parallel_replicate_degree": self.dp_replicate,
            "data_parallel_shard_degree": self.dp_shard,
            "expert_parallel_degree": self.ep,
        }

    def describe(self) -> str:
        return (
            f"TP {self.tp}, CP {self.cp}, PP {self.pp}, DP {self.dp_replicate} replicated x "
            f"{self.dp_shard} sharded, EP {self.ep}"
        )


def titan_layout(plan: Plan, profile: Profile, gpus_per_node: int | None = None) -> TitanLayout:
    """How torchtitan 0.3 runs `plan`; an InputError (one line, naming the plan) where it
    cannot run it as planned at all. Given `gpus_per_node`, a note also says where torchtitan's
    rank order puts other groups of ranks in a node than the plan's (`node_groups_note`)."""
    shape = planned_shape(plan, profile)
    tp, dp, cp, ep = shape.tp, shape.dp, shape.cp, shape.ep
    notes: list[str] = []
    replicate, shard = _data_parallel(dp, cp, shape.zero, shape.shard_group, notes)
    if ep > 1:
        expert_ranks = shard * cp * tp
        if expert_ranks % ep:
            raise InputError(
                "plan.json",
                f"parallelism.ep: torchtitan 0.3 spreads experts over dp_shard x CP x TP = "
                f"{shard} x {cp} x {tp} ranks, which EP {ep} does not divide; {RUNNER_HINT}",
            )
        # torchtitan's EP groups take TP ranks first (its mesh has TP innermost), as the cost
        # model lays them (layouts/costs.py, `ep_across_nodes`): nothing to note.
    if gpus_per_node is not None:
        moved = node_groups_note(shape, gpus_per_node)
        notes += [moved] if moved else []
    return TitanLayout(
        shape,
        dp_replicate=replicate,
        dp_shard=shard,
        activation_checkpoint=_checkpointing(plan, shape.recompute, notes),
        notes=tuple(notes),
    )


def _data_parallel(dp: int, cp: int, zero: int, group: int, notes: list[str]) -> tuple[int, int]:
    """(dp_replicate, dp_shard) for the plan's ZeRO stage; a note where torchtitan's memory
    technique is not the plan's."""
    if zero == 3:
        group = group or dp * cp
        if group % cp or (dp * cp) % group:
            raise InputError(
                "plan.json",
                f"parallelism.shard_group: torchtitan 0.3 shards over dp_shard x CP, so a shard "
                f"group of {group} must be a multiple of CP {cp} dividing DP x CP {dp * cp}",
            )
        return dp * cp // group, group // cp
    if zero == 1 and dp * cp > 1:
        notes.append(
            f"torchtitan has no ZeRO-1: the plan's optimizer-state sharding over DP x CP runs "
            f"as FSDP (data_parallel_shard_degree {dp}), which also shards weights and gradients "
            f"and all-gathers the weights each step: memory and time are not the plan's; "
            f"{RUNNER_HINT}."
        )
        return 1, dp
    if cp > 1:
        notes.append(
            f"torchtitan shards weights, gradients and optimizer state over the CP ranks "
            f"(FSDP over CP {cp}) where the plan replicates them: memory and time are not the "
            f"plan's; {RUNNER_HINT}."
        )
    return dp, 1


def _checkpointing(plan: Plan, layout_recompute: str, notes: list[str]) -> str:
    """torchtitan's one activation-checkpointing setting for the plan: the plan's (the
    layout's, or what its stages recompute: the heaviest, so that the plan's memory holds);
    refused under a split backward, which no checkpointing survives in torchtitan 0.3."""
    stage_kinds = [plan.recompute_of(s) for s in range(plan.num_stages)]
    kinds = {layout_recompute, *stage_kinds} - {"none"}
    kind = max(kinds, key=RECOMPUTE_KINDS.index, default="none")
    if kind != "none" and splits_backward(plan):
        raise InputError(
            "plan.json",
            f"the plan recomputes ({kind}) under a split backward (I/W actions), which "
            "torchtitan 0.3's activation checkpointing cannot run (a checkpointed block is "
            f"backpropagated once); {RUNNER_HINT}",
        )
    uneven = layout_recompute == "none" and any(k != kind for k in stage_kinds)
    if kind != "none" and uneven:
        some = sum(k != "none" for k in stage_kinds)
        notes.append(
            f"torchtitan's activation checkpointing is one setting for every block: {kind} "
            f"everywhere, where the plan recomputes in {some} of {plan.num_stages} stages; "
            "memory is at most the plan's, time more."
        )
    if kind == "selective":
        notes.append(
            "torchtitan's selective checkpointing saves every second matmul's output per op, "
            "where the plan priced Megatron-LM's (attention's core recomputed): memory and "
            "time differ from the plan's."
        )
    return kind


def node_groups_note(shape: JobShape, gpus_per_node: int) -> str | None:
    """Where torchtitan's rank order (mesh pp, dp_replicate, dp_shard, cp, tp: PP outermost,
    the "megatron" order) puts other ranks together in a node than the plan's, one line saying
    which links change: the pipeline's hops between nodes and the nodes each data-parallel
    group spans; None where both put the same groups in a node (the plan priced in
    torchtitan's own order, as `plan --gpus --runner torchtitan` prices)."""
    tp, cp, pp, dp = shape.tp, shape.cp, shape.pp, shape.dp
    priced, titan = shape, replace(shape, rank_order="megatron")

    def links(numbering: JobShape) -> tuple[int, int]:
        def node(t: int, c: int, p: int, r: int) -> int:
            return numbering.rank(r, p, t, c) // gpus_per_node

        tc = [(t, c) for t in range(tp) for c in range(cp)]
        hops = sum(
            node(t, c, p, r) != node(t, c, p + 1, r)
            for t, c in tc
            for p in range(pp - 1)
            for r in range(dp)
        )
        spans = max(len({node(t, c, p, r) for r in range(dp)}) for t, c in tc for p in range(pp))
        return hops, spans

    if tp * cp * pp * dp <= gpus_per_node or pp == 1 or dp == 1:
        return None  # one node, or one of the two orders' outer axes alone: the same groups
    (plan_hops, plan_spans), (titan_hops, titan_spans) = links(priced), links(titan)
    if (plan_hops, plan_spans) == (titan_hops, titan_spans):
        return None
    total = tp * cp * (pp - 1) * dp
    return (
        f"torchtitan numbers ranks with PP outermost (mesh pp, dp_replicate, dp_shard, cp, tp), "
        f"the plan DP outermost (TP, CP, PP, DP): on nodes of {gpus_per_node}, {titan_hops} of "
        f"the {total} pipeline hops cross nodes in torchtitan ({plan_hops} in the plan) and "
        f"each data-parallel group spans {titan_spans} node{'s' * (titan_spans > 1)} "
        f"({plan_spans} in the plan): the links are not those the plan's step time was priced on."
    )
