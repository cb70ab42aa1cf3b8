"""Held-out evaluation during a run (`--val-data FILE --eval-every N`): the loss of the model on
held-out sequences, forward only, through the same pipeline.

Every `every` steps (and after the run's last step) each rank runs the forward of its stages
over `batches` global batches of the held-out data, each cut as a training batch is (D replicas
x M microbatches x b sequences; batch i is drawn from (seed, i), the same sequences at every
evaluation), in a forward-only order that cannot deadlock: microbatch by microbatch, each
device's stages in model order. No graph is kept and nothing is updated. The losses travel
with the step's report (`progress`), which averages them as it averages the training loss.
"""

from __future__ import annotations

from collections.abc import Callable

from octopipe.plan import Plan
from octopipe.runtime.data.batches import Batch, DataSource, replica_batch
from octopipe.runtime.step.worker import Worker


class Evaluation:
    """When and on what one rank evaluates; `after_step` on every rank after every step."""

    def __init__(
        self,
        worker: Worker,
        data: DataSource,
        plan: Plan,
        *,
        every: int,
        batches: int,
        last_step: int,
        replica: int,
        sequences: int,
        micro_batch_size: int,
        needs_data: bool,
        part: Callable[[Batch], Batch] = lambda batch: batch,
    ) -> None:
        """`part`: the rank's part of a replica's batch (its share of each sequence under
        context parallelism)."""
        self.worker, self.data, self.plan = worker, data, plan
        self.every, self.batches, self.last_step = every, batches, last_step
        self.replica, self.sequences, self.b = replica, sequences, micro_batch_size
        self.needs_data, self.part = needs_data, part

    def due(self, step: int) -> bool:
        done = step + 1
        return done == self.last_step or (self.every > 0 and done % self.every == 0)

    def after_step(self, step: int) -> tuple[float, ...] | None:
        """None when no evaluation is due after `step`; else this rank's microbatch losses
        over every held-out batch (none off the last stage)."""
        if not self.due(step):
            return None
        losses: list[float] = []
        for i in range(self.batches):
            losses += self.worker.evaluate(self._batch(i))
        return tuple(losses)

    def _batch(self, index: int) -> Batch:
        if not self.needs_data:
            return Batch([], [])
        sequences = self.data.global_batch(index, self.sequences)
        return self.part(replica_batch(sequences, self.replica, self.plan.num_microbatches, self.b))
