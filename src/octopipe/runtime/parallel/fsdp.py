"""Sharded data parallelism (`--zero 3`): each stage one FSDP2 unit over the replicas, its
all-gathers and reduce-scatters placed by the plan.

`apply_fsdp` makes a stage (its module, still on the meta device) an FSDP2 unit over the
data-parallel mesh:
its parameters, gradients and optimizer state live in shards, 1/D per replica (on top of any
tensor-parallel split). Left to itself, FSDP2 would gather a stage before each microbatch's
forward and reduce-scatter after each backward, from hooks inside autograd. Here the plan
places them instead (`ShardedStages`):

- a stage's all-gather is issued, asynchronously, one action before its first action of the
  step, and the stage stays whole until the step is done with it (no gather per microbatch);
- FSDP2's reduce-scatter is off while the step runs (`set_requires_gradient_sync(False)`): a
  split backward's W adds weight gradients outside autograd, after FSDP2's post-backward hook
  has already fired in I, so that hook cannot be the moment. After the stage's last backward
  action (its last B or W), the reduce-scatter of the gradients accumulated over every
  microbatch (averaged over the replicas) starts and the stage is resharded, by running
  FSDP2's post-backward then, as `torch.distributed.pipelining` does for its REDUCE_GRAD
  action; the rank's remaining actions run while it completes, and the step waits for it
  before the optimizer (FSDP2's final backward callback). FSDP2 has no public call for either,
  so this module reaches into its state, and only this module.

FSDP2's warning that a unit "returned a view tensor" does not apply to these units and is
silenced, exactly it (`_quiet_view_warning`).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard

from octopipe.actions import Action


def apply_fsdp(stage: nn.Module, dp_mesh: DeviceMesh) -> None:
    """Shard a stage over the replicas; it stays whole between forward and backward. `stage`
    is the module whose forward runs the stage (FSDP2's hooks sit on it)."""
    fully_shard(stage, mesh=dp_mesh, reshard_after_forward=False)
    _accumulate_without_sync(stage)  # type: ignore[arg-type]
    _quiet_view_warning(type(stage).__name__)


def _quiet_view_warning(unit: str) -> None:
    """FSDP2 warns, once per rank, when a unit's forward returns a view: an in-place op on it
    (`out += y`) would drop the pre-backward hook FSDP2 registers on it, and with it the
    all-gather before the unit's backward. A stage returns one where its last layer's output is
    a tensor-parallel module's local shard (`DTensor.to_local()` is a view): a final norm
    (`tp_plans.sequence_norm`), a Hugging Face model's embedding. It does not apply here: a
    stage's outputs go only to `step.stage.StageCompute`, which never changes them in place (it
    keeps them as the roots of the backward, sends detached copies, hands the next stage on
    this rank detached leaves), and each stage stays gathered from before its first action of a
    step to after its last backward (`ShardedStages`), never resharded after a forward. So that
    warning, of the units built here and no other, is not shown."""
    warnings.filterwarnings(
        "ignore",
        message=rf"FSDP2-wrapped module \({re.escape(unit)}\) returned a view tensor",
        category=UserWarning,
    )


class ShardedStages:
    """When the rank's FSDP2 stages gather and reduce, from its order of actions."""

    def __init__(self, units: dict[int, FSDPModule], actions: Sequence[Action]) -> None:
        self.units = units
        first: dict[int, int] = {}
        for i, act in enumerate(actions):
            first.setdefault(act.stage, i)
        # Action index -> the stages to start gathering before it runs: one action ahead of
        # each stage's first (the step's first action cannot be overlapped).
        self._gather_before: dict[int, list[int]] = {}
        for stage, i in first.items():
            self._gather_before.setdefault(max(i - 1, 0), []).append(stage)
        self._reducing: list[FSDPModule] = []

    def before_action(self, index: int) -> None:
        """Call before running action `index` of the step. The gathers run asynchronously;
        FSDP2 waits for a stage's in its forward pre-hook."""
        for stage in self._gather_before.get(index, ()):
            self.units[stage].unshard(async_op=True)

    def reduce(self, stage: int) -> None:
        """After the stage's last backward of the step: start the reduce-scatter of its
        gradients and reshard it; `finish` waits for the reduction."""
        unit = self.units[stage]
        for p in unit.parameters():  # the unsharded ones: every replica reduces the same set
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)  # a parameter no microbatch here reached
        unit.set_is_last_backward(True)
        unit.set_requires_gradient_sync(True)
        unit.set_reshard_after_backward(True)
        for inner in _state(unit)._state_ctx.all_states:
            for group in inner._fsdp_param_groups:
                group.post_backward()
        self._reducing.append(unit)

    def finish(self) -> None:
        """After the step's actions: wait for every reduction started, so the sharded
        gradients are in place for the optimizer, and accumulate without sync again."""
        for unit in self._reducing:
            _state(unit)._root_post_backward_final_callback()
            _accumulate_without_sync(unit)
        self._reducing.clear()

    def reshard_all(self) -> None:
        """Free every gathered stage (after a forward outside the schedule: shape discovery)."""
        for unit in self.units.values():
            unit.reshard()


def _state(unit: FSDPModule):
    return fully_shard.state(unit)  # type: ignore[attr-defined]


def _accumulate_without_sync(unit: FSDPModule) -> None:
    unit.set_requires_gradient_sync(False)
    unit.set_reshard_after_backward(False)
    unit.set_is_last_backward(False)


def fsdp_units(modules: dict[int, nn.Module]) -> dict[int, FSDPModule]:
    """The stage modules that are FSDP2 units."""
    return {s: m for s, m in modules.items() if isinstance(m, FSDPModule)}
