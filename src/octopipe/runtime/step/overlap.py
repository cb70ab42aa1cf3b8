"""Overlapped steps: no barrier between steps, each stage updated right after its last backward.

Step k+1's actions on a rank start as soon as its step-k actions are done, so the pipeline's
fill for step k+1 overlaps its drain for step k (the simulator's `--overlap-steps`). A stage's
optimizer steps the moment the rank has run the stage's last backward action (B, I or W) of the
step, before the global gradient norm is known: optimistically, with the gradients unclipped.

Post-validation makes that exact, as the zero-bubble paper's does. Each rank adds its stages'
squared gradient norms and, after its last stage of the step, launches an asynchronous
all-reduce of the sum; it waits for step k's result at its first update of step k+1 (by then
every rank has finished step k, so the wait is short). If the step was valid (a finite norm,
and no clipping needed) the saved copies of step k's weights and optimizer state are dropped.
If not, the rank runs the rest of step k+1 without updating anything, then rolls every stage
back to before step k's update, and either applies step k's update again with the gradients
clipped (it kept them) or, for a non-finite gradient, runs step k again; then step k+1 again.
Every rank sees the same norm, so all of them make the same choice and replay the same steps.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from octopipe.runtime.data.batches import Batch
from octopipe.runtime.step.optim import clip_factor, scale_grads, set_lr, squared_norm
from octopipe.runtime.step.records import StepRecord
from octopipe.runtime.step.worker import Worker


@dataclass
class _Saved:
    """One stage as it was before its optimistic update of a step, and the step's gradients."""

    params: list[torch.Tensor]
    state: dict
    grads: list[torch.Tensor | None]


@dataclass
class _Step:
    """What an optimistic step leaves until it is validated."""

    index: int
    batch: Batch
    saved: dict[int, _Saved] = field(default_factory=dict)
    squares: torch.Tensor | None = None  # the rank's sum of squared gradients, on its device
    norm_work: dist.Work | None = None
    norm: float | None = None  # once known


class OverlappedSteps:
    """Drives a `Worker` through steps back to back, with per-stage optimizers."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.config = worker.optimizer_config
        self.optimizers = {
            s: self.config.build(st.params) for s, st in worker.stages.items() if st.params
        }
        self.redone = 0  # steps run again after a failed validation
        self._origin = 0.0
        self._losses: tuple[float, ...] = ()
        self._applied: dict[int, list[torch.Tensor | None]] = {}  # the last update's gradients
        self._rerun: int | None = None  # the step last run again for non-finite gradients

    def run(
        self, batches: Callable[[int], Batch], first: int, last: int, origin: float
    ) -> list[StepRecord]:
        """Steps `[first, last)`; one record per step (a redone step keeps its last run). A
        step's duration runs from the end of the rank's step before."""
        self._origin = origin
        records: dict[int, StepRecord] = {}
        pending: _Step | None = None  # the last step run, not yet validated
        k, mark = first, time.perf_counter()
        while k < last or pending is not None:
            if k >= last:  # nothing left to overlap with: the last step is checked now
                if self._validate(pending):
                    break
                k, pending = self._recover(pending), None
                continue
            step = _Step(k, batches(k))
            poisoned = self._run_step(step, pending)
            now = time.perf_counter()
            records[k], mark = StepRecord(self._losses, now - mark), now
            if poisoned:
                k, pending = self._recover(pending), None
            else:
                k, pending = k + 1, step
        self.worker.comm.wait_sends()
        for stage, grads in self._applied.items():  # as a synchronous run ends: with them
            for p, grad in zip(self.worker.stages[stage].params, grads):
                p.grad = grad
        return [records[k] for k in sorted(records)]

    # --- one step ------------------------------------------------------------------------------

    def _run_step(self, step: _Step, previous: _Step | None) -> bool:
        """Run the step's actions, updating stages optimistically; True when the previous step
        turned out invalid (this one then updated nothing and must be run again)."""
        checked, poisoned = previous is None, False

        def stage_done(stage: int) -> None:
            nonlocal checked, poisoned
            self.worker.settle(stage)  # tensor-parallel gradients in their parameters' layout
            if not checked:
                checked, poisoned = True, not self._validate(previous)
            if poisoned:
                return
            if reducer is None:
                self._update(stage, step)
                return
            reducer.launch(stage)  # averaged over the replicas first, then updated
            for ready in reducer.finish_ready(block=False):
                self._update(ready, step)

        reducer = self.worker.reducer
        self._losses = self.worker.run_actions(step.index, step.batch, self._origin, stage_done)
        if not checked:  # a rank without stages still takes part in the collectives
            poisoned = not self._validate(previous)
        if not poisoned:
            for ready in reducer.finish_ready(block=True) if reducer is not None else ():
                self._update(ready, step)
            self._launch_norm(step)  # a no-op where the last stage's update launched it
        return poisoned

    def _update(self, stage: int, step: _Step) -> None:
        params = self.worker.stages[stage].params
        if not params:
            return
        optimizer = self.optimizers[stage]
        grads = [p.grad for p in params]
        step.squares = self._squares(step) + squared_norm(params, self.worker.device)
        step.saved[stage] = _Saved(
            [p.detach().clone() for p in params], copy.deepcopy(optimizer.state_dict()), grads
        )
        set_lr(optimizer, self.config.lr_at(step.index))
        optimizer.step()
        self._applied[stage] = grads
        for p in params:
            p.grad = None  # the next step's gradients start from zero
        if len(step.saved) == len(self.optimizers):  # the rank's last stage of the step
            self._launch_norm(step)

    def _squares(self, step: _Step) -> torch.Tensor:
        if step.squares is None:
            step.squares = torch.zeros(1, dtype=torch.float64, device=self.worker.device)
        return step.squares

    def _launch_norm(self, step: _Step) -> None:
        if step.norm_work is None:
            step.norm_work = dist.all_reduce(self._squares(step), async_op=True)

    def _validate(self, step: _Step | None) -> bool:
        """Whether the step's optimistic updates stand: its gradients' global norm is finite
        and needs no clipping."""
        if step is None:
            return True
        if step.norm is None:
            self._launch_norm(step)
            step.norm_work.wait()
            # Every rank holding a stage counts it (replicas, TP ranks; `squared_norm`).
            step.norm = math.sqrt(float(step.squares) / self.worker.stage_ranks)
        if not math.isfinite(step.norm):
            return False
        clip = self.config.clip_norm
        return clip is None or clip_factor(step.norm, clip) == 1.0

    def _recover(self, invalid: _Step) -> int:
        """Undo the invalid step's updates; apply them clipped, or, for a non-finite gradient,
        leave the step to be run again. The step to run next."""
        self.redone += 1
        for p in self.worker.params:  # what the step run without updates accumulated
            p.grad = None
        for stage, saved in invalid.saved.items():
            params = self.worker.stages[stage].params
            with torch.no_grad():
                for p, before in zip(params, saved.params):
                    p.copy_(before)
            self.optimizers[stage].load_state_dict(saved.state)
        if not math.isfinite(invalid.norm):
            if self._rerun == invalid.index:  # not a passing fault: the step itself is bad
                raise FloatingPointError(
                    f"step {invalid.index + 1}: the gradients are not finite, again after the step "
                    "was run a second time; stopping"
                )
            self._rerun = invalid.index
            return invalid.index  # its gradients were bad: compute them again
        factor = clip_factor(invalid.norm, self.config.clip_norm)
        for stage, saved in invalid.saved.items():
            params = self.worker.stages[stage].params
            for p, grad in zip(params, saved.grads):
                p.grad = grad
            scale_grads(params, factor)
            set_lr(self.optimizers[stage], self.config.lr_at(invalid.index))
            self.optimizers[stage].step()
            self._applied[stage] = saved.grads
            for p in params:
                p.grad = None
        return invalid.index + 1
