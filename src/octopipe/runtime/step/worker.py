"""One rank of the executor: builds the stages placed on it and runs its action list each step.

For every action the worker gathers the inputs (from the batch, from a stage on the same rank,
or from the P2P layer), runs the stage's compute, and hands the result on the same three ways.
Receives are posted `lookahead` actions ahead so transfers overlap compute, and sends never
wait, so any plan whose dependency graph is acyclic runs to the end whatever its order. With
data parallelism a stage's gradient all-reduce starts after its last backward action
(`reduce`). After the last action: the optimizer step. Every action's wait/start/end times
are recorded.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist

from octopipe.actions import Action, B, F, I
from octopipe.plan import JobShape, Place, Plan, Stage
from octopipe.runtime.data.batches import Batch
from octopipe.runtime.model.recipe import Activation, Loss, StageModule
from octopipe.runtime.parallel.fsdp import ShardedStages
from octopipe.runtime.parallel.tensor_parallel import loss_context, settle_grads
from octopipe.runtime.step.comm import P2P
from octopipe.runtime.step.experts import ExpertGrads
from octopipe.runtime.step.optim import (
    OptimizerConfig,
    clip_factor,
    global_grad_norm,
    scale_grads,
    set_lr,
    squared_norm,
)
from octopipe.runtime.step.records import (
    COUNTED_PASSES,
    ActionRecord,
    HeldTensors,
    StepRecord,
)
from octopipe.runtime.step.reduce import GradientReducer
from octopipe.runtime.step.shapes import BoundarySpec
from octopipe.runtime.step.stage import StageCompute, as_leaves
from octopipe.runtime.step.tied import TiedGradients


@dataclass(frozen=True)
class RankPlace:
    """Where a worker runs: its place in the job's shape, its torch device and the groups the
    step settles besides its own actions."""

    shape: JobShape
    place: Place  # replica, pipeline device, TP and CP rank
    device: torch.device
    dp_group: dist.ProcessGroup | None = None  # this device's ranks of every replica and CP rank
    sharded: ShardedStages | None = None  # the stages as FSDP2 units (ZeRO-3)
    tied: TiedGradients | None = None  # tied copies whose gradients other ranks sum with
    experts: ExpertGrads | None = None  # the routed experts' parameters and groups (EP)


@dataclass(frozen=True)
class StepSettings:
    """How a worker runs its steps."""

    optimizer: OptimizerConfig
    per_channel_groups: bool  # one group per channel, matched by order (NCCL's way)
    lookahead: int = 8  # actions ahead receives are posted
    reduce_at_end: bool = False  # every all-reduce held back until the last action
    autocast: torch.dtype | None = None
    accumulation: int = 1  # passes of the plan per step, their gradients summed


class Worker:
    """The stages of `plan` placed on one pipeline device, and how to train them one step at a
    time, as one rank of the job's shape."""

    def __init__(
        self,
        plan: Plan,
        stages: dict[int, StageModule],
        loss: Loss,
        specs: dict[int, BoundarySpec],
        where: RankPlace,
        settings: StepSettings,
    ) -> None:
        """`stages[s]` holds stage s's layers, for every stage placed on this rank's device;
        `specs[b]` is the activation entering stage b, for every stage but the first. `where`
        says which rank of the shape this is and what it shares with others (the replicas'
        `dp_group`, needed when DP x CP > 1; TP when the shape's TP > 1; FSDP2 units under
        ZeRO-3); `settings.reduce_at_end` holds every all-reduce back until the last action
        (to measure what the overlap gains); `settings.accumulation` passes of the plan make a
        step, their gradients summed (the loss of a step is the mean over all their
        microbatches)."""
        shape, place, device = where.shape, where.place, where.device
        rank, sharded, experts = place.device, where.sharded, where.experts
        lookahead, accumulation = settings.lookahead, settings.accumulation
        self.plan, self.rank, self.device = plan, rank, device
        self.lookahead = lookahead
        self.actions: tuple[Action, ...] = plan.schedule.get(rank, ())
        self._forward_only = forward_only(plan)  # the order held-out batches run in
        self._last = last = plan.num_stages - 1
        # Context-parallel ranks hold the same weights and see other tokens: they average
        # their gradients as replicas do (`dp_group` is then all D x C of them).
        copies, dp_group = shape.copies, where.dp_group
        context = loss_context if shape.tp > 1 else nullcontext
        self.held = HeldTensors()  # what the rank's stages hold for their backward
        self._passes_run = 0
        self.stages = {
            s: StageCompute(
                module,
                s == last,
                loss,
                plan.num_microbatches * accumulation,
                settings.autocast,
                context,
                self.held,
            )
            for s, module in stages.items()
        }
        self.modules = stages
        self.comm = P2P(plan, specs, device, settings.per_channel_groups, shape, place)
        # A tied parameter two stages of this rank share is one parameter to the optimizer.
        self.params = list({id(p): p for st in self.stages.values() for p in st.params}.values())
        self.tied = where.tied
        self.tensor_parallel, self.sharded = shape.tp > 1, sharded
        self.stage_ranks = shape.stage_ranks  # ranks holding each stage, for the global norm
        self.experts = experts
        expert_group = experts.expert_dp_group if experts is not None else None
        self.reducer = (
            GradientReducer(
                {s: st.params for s, st in self.stages.items()},
                dp_group,
                copies,
                experts.ids if experts is not None else frozenset(),
                expert_group,
            )
            if (copies > 1 or expert_group is not None) and sharded is None
            else None
        )
        # Action index -> the stages whose gradients are final once it has run.
        self._stage_done_after = _last_backwards(self.actions)
        if settings.reduce_at_end and self._stage_done_after:
            every = [s for stages in self._stage_done_after.values() for s in stages]
            self._stage_done_after = {len(self.actions) - 1: every}
        shard = dp_group if shape.zero == 1 and copies > 1 else None
        self.optimizer_config = optimizer = settings.optimizer
        self.optimizer = (
            optimizer.build(
                self.params,
                shard,
                experts.ids if experts is not None else frozenset(),
                expert_group,
            )
            if self.params
            else None
        )
        self.grad_norm: float | None = None  # the last step's, when clipping
        self.records: list[ActionRecord] = []
        self._batch: Batch | None = None  # the step in progress: its data, index, losses
        self._step, self._origin = 0, 0.0
        self._losses: dict[int, float] = {}
        self._local_acts: dict[tuple[int, int], Activation] = {}
        self._local_grads: dict[tuple[int, int], list[torch.Tensor]] = {}

    # --- a training step ---------------------------------------------------------------------

    def train_step(self, step: int, batch: Batch | list[Batch], origin: float) -> StepRecord:
        """Run this rank's actions for one batch (or one pass per batch of a list, gradients
        accumulated; reduced after the last), then the optimizer step."""
        passes = batch if isinstance(batch, list) else [batch]
        for p in self.params:
            p.grad = None
        dist.barrier()
        began = time.perf_counter()
        losses: tuple[float, ...] = ()
        for i, part in enumerate(passes):
            last = i == len(passes) - 1
            losses += self.run_actions(step, part, origin, self.reduce_stage if last else None)
        self.comm.wait_sends()
        if self.reducer is not None:
            self.reducer.finish()
        if self.sharded is not None:
            self.sharded.finish()
        if self.tied is not None:
            self.tied.reduce()
        # This rank's share, before clipping (a tied copy counted where its first holder is).
        counted = self.tied.counted(self.params) if self.tied is not None else self.params
        squares = squared_norm(counted, self.device)
        if self.experts is not None:  # experts divided by pruning count once per EP group
            squares = squares + self.experts.extra_squares(self.device)
        self.grad_norm = self._clip(squares)
        if self.optimizer is not None:
            set_lr(self.optimizer, self.optimizer_config.lr_at(step))
            self.optimizer.step()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return StepRecord(losses, time.perf_counter() - began, float(squares))

    def evaluate(self, batch: Batch) -> tuple[float, ...]:
        """Forward only, without gradients, over a held-out batch (`evaluate.py`): each
        microbatch's loss on the rank holding the last stage, none elsewhere. Every rank of
        the job calls it at the same point, between steps."""
        self._batch, self._losses = batch, {}
        self.comm.reset(self._forward_only)
        acts = self._forward_only.schedule.get(self.rank, ())
        with torch.no_grad():
            for i, act in enumerate(acts):
                self._prefetch(acts[i + 1 : i + 1 + self.lookahead])
                inputs = self._forward_inputs(act.stage, act.mb)
                target = batch.targets[act.mb].to(self.device) if act.stage == self._last else None
                outputs, loss = self.stages[act.stage].evaluate(inputs, target)
                self._hand_on(act.stage, act.mb, outputs, loss)
        self.comm.wait_sends()
        if self.sharded is not None:
            self.sharded.reshard_all()  # gathered by the forwards; the next step gathers anew
        return tuple(self._losses[m] for m in sorted(self._losses))

    def run_actions(
        self,
        step: int,
        batch: Batch,
        origin: float,
        on_stage_done: Callable[[int], None] | None = None,
    ) -> tuple[float, ...]:
        """This rank's actions of one step, in order; `on_stage_done(stage)` runs as soon as a
        stage's gradients of the step are final. The losses of the microbatches, on the rank
        holding the last stage."""
        self._batch, self._step, self._origin = batch, step, origin
        self._losses = {}
        self.comm.reset()
        self.held.counting = self._passes_run < COUNTED_PASSES
        self._passes_run += 1
        for i, act in enumerate(self.actions):
            if self.sharded is not None:
                self.sharded.before_action(i)
            self._prefetch(self.actions[i + 1 : i + 1 + self.lookahead])
            self._run(act)
            if on_stage_done is not None:
                for stage in self._stage_done_after.get(i, ()):
                    on_stage_done(stage)
        leftover = {s: st.in_flight() for s, st in self.stages.items() if st.in_flight()}
        assert not leftover and not self._local_acts and not self._local_grads, (
            f"state left after the step: {leftover}"
        )
        return tuple(self._losses[m] for m in sorted(self._losses))

    def settle(self, stage: int) -> None:
        """The stage's gradients of the step are final: give tensor-parallel ones their
        parameters' layout (partial sums summed over the group). FSDP2 does it itself."""
        if self.tensor_parallel and self.sharded is None:
            settle_grads(self.stages[stage].params)
        if self.experts is not None:
            self.experts.sum_over_tp(stage)

    def reduce_stage(self, stage: int) -> None:
        """After the stage's last backward of the step: settle its gradients and start their
        reduction over the replicas (an all-reduce, or FSDP2's reduce-scatter)."""
        self.settle(stage)
        if self.sharded is not None:
            self.sharded.reduce(stage)
        elif self.reducer is not None:
            self.reducer.launch(stage)

    def _clip(self, squares: torch.Tensor) -> float | None:
        """Clip by the global norm (a collective: every rank takes part, stages or not);
        `squares`: this rank's share of its square."""
        max_norm = self.optimizer_config.clip_norm
        if max_norm is None:
            return None
        norm = global_grad_norm(squares, self.stage_ranks)
        scale_grads(self.params, clip_factor(norm, max_norm))
        return norm

    def peak_memory(self) -> tuple[int, str]:
        """Peak bytes, and what was measured: the CUDA allocator's peak, or the process's RSS."""
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device), "cuda_max_memory_allocated"
        return resource.getrusage(
            resource.RUSAGE_SELF
        ).ru_maxrss * 1024, "cpu_max_rss"  # Linux: KiB

    # --- one action ----------------------------------------------------------------------------

    def _run(self, act: Action) -> None:
        wait_start = time.perf_counter()
        if act.kind == F:
            inputs = self._forward_inputs(act.stage, act.mb)
            start = time.perf_counter()
            self._forward(act.stage, act.mb, inputs)
        elif act.kind in (B, I):
            grads = self._backward_inputs(act.stage, act.mb)
            start = time.perf_counter()
            self._backward(act.stage, act.mb, grads, split=act.kind == I)
        else:
            start = time.perf_counter()
            self.stages[act.stage].backward_weight(act.mb)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # so the recorded end is when the work finished
        end = time.perf_counter()
        o = self._origin
        self.records.append(ActionRecord(self._step, str(act), wait_start - o, start - o, end - o))

    def _forward(self, stage: int, mb: int, inputs: Activation) -> None:
        assert self._batch is not None
        target = self._batch.targets[mb].to(self.device) if self.stages[stage].is_last else None
        outputs, loss = self.stages[stage].forward(mb, inputs, target)
        self._hand_on(stage, mb, outputs, loss)

    def _hand_on(self, stage: int, mb: int, outputs: Activation, loss: float | None) -> None:
        """A forward's result: the loss kept, or the outputs to the next stage."""
        if loss is not None:
            self._losses[mb] = loss
        elif self._on_this_rank(stage + 1):
            self._local_acts[(stage + 1, mb)] = as_leaves(outputs)
        else:
            self.comm.send_forward(stage, mb, outputs)

    def _backward(
        self, stage: int, mb: int, output_grads: list[torch.Tensor] | None, split: bool
    ) -> None:
        compute = self.stages[stage]
        if split:
            input_grads = compute.backward_input(mb, output_grads)
        else:
            input_grads = compute.backward(mb, output_grads)
        if stage == 0:
            return
        if self._on_this_rank(stage - 1):
            self._local_grads[(stage - 1, mb)] = input_grads
        else:
            self.comm.send_backward(stage, mb, input_grads)

    # --- where inputs come from ----------------------------------------------------------------

    def _forward_inputs(self, stage: int, mb: int) -> Activation:
        if stage == 0:
            assert self._batch is not None
            return tuple(t.to(self.device) for t in self._batch.inputs[mb])
        if self._on_this_rank(stage - 1):
            return self._local_acts.pop((stage, mb))
        return as_leaves(self.comm.recv_forward(stage, mb))

    def _backward_inputs(self, stage: int, mb: int) -> list[torch.Tensor] | None:
        if stage == self.plan.num_stages - 1:
            return None
        if self._on_this_rank(stage + 1):
            return self._local_grads.pop((stage, mb))
        return self.comm.recv_backward(stage, mb)

    def _prefetch(self, upcoming: tuple[Action, ...]) -> None:
        for act in upcoming:
            if act.kind == F and act.stage > 0 and not self._on_this_rank(act.stage - 1):
                self.comm.prefetch_forward(act.stage, act.mb)
            elif (
                act.kind in (B, I)
                and act.stage + 1 < self.plan.num_stages
                and not self._on_this_rank(act.stage + 1)
            ):
                self.comm.prefetch_backward(act.stage, act.mb)

    def _on_this_rank(self, stage: int) -> bool:
        return self.plan.stages[stage].device == self.rank


def _last_backwards(actions: tuple[Action, ...]) -> dict[int, list[int]]:
    """Index in the order of each stage's last backward action (B, I or W) -> that stage: after
    it the stage's gradients of the step are final."""
    last: dict[int, int] = {}
    for i, act in enumerate(actions):
        if act.kind != F:
            last[act.stage] = i
    return {i: [stage] for stage, i in last.items()}


def forward_only(plan: Plan) -> Plan:
    """The plan's stages with forwards only, microbatch by microbatch and each device's stages
    in model order: an order that cannot deadlock (it follows one global order in which every
    forward comes after the one feeding it). Not a trainable plan: no backward."""
    M = plan.num_microbatches
    schedule = {
        d: tuple(Action(s, F, m) for m in range(M) for s in plan.stages_on(d))
        for d in range(plan.num_devices)
    }
    return Plan(plan.num_devices, M, tuple(Stage(*st) for st in plan.stages), schedule)
