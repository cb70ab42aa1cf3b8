"""What every engine answers (`octopipe run`, torchtitan, Megatron-LM): four verbs, so that the
search, the commands, the API and `octopipe run`'s own checks ask one object.

    engine = get_engine("torchtitan")            # engines/__init__.py: the one lookup by name
    engine.refuse_model(arch)                    # why it cannot train a model at all, or None
    engine.refuse(shape, arch)                   # why it cannot run a shape, or None
    engine.refuse_plan(plan, shape)              # why it cannot run a plan of it, or None
    engine.price(job)                            # the job's stack as it runs it
    engine.write(answer, out)                    # its files for an answer
    engine.launch(answer, out)                   # the lines that say how to run them

How it prices a shape besides: the ZeRO stages the search offers it (`zero_stages`), whether EP
folds over TP (`fold_experts`), its rank order, its schedules (`schedules`,
`screen_baselines`, `standard_schedules`), whether the tuner can better its named schedules
(`tunes`), and the variants of a shape it runs (`variants`: HSDP groups). Nothing here imports
torch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from octopipe.plan import JobShape, Plan, split_backwards

if TYPE_CHECKING:
    from octopipe.costmodel.arch import Architecture
    from octopipe.engines.answer import Answer
    from octopipe.layouts.layout import Job

Schedules = tuple[tuple[str, str, int | None], ...]  # (schedule, partition, chunks)
# The screening baselines of engines that run only whole backwards (1F1B's family).
WHOLE_BACKWARD_SCREEN: Schedules = (("i1f1b", "balanced", None), ("1f1b", "balanced", None))
_WHOLE = frozenset(("gpipe", "1f1b", "i1f1b"))  # schedules with no I/W split


@dataclass(frozen=True)
class Refusal:
    """Why an engine cannot run something: the setting to change, and why, in one line."""

    flag: str
    why: str

    def __str__(self) -> str:
        return f"{self.flag}: {self.why}"


@dataclass(frozen=True)
class Engine:
    """An engine's rules; each engine is a subclass (`engines/octopipe.py`, `torchtitan/`,
    `megatron/`) that states what it carries out otherwise."""

    name: str = ""
    """What `--runner` calls it."""
    title: str = ""
    """What messages call it."""
    zero_stages: tuple[int, ...] = (0, 1)
    """The ZeRO stages the layout search offers it."""
    fold_experts: bool = False
    """EP over TP x CP x DP (torchtitan, Megatron-Core), not only over DP x CP."""
    overlaps_steps: bool = False
    """Whether it runs steps back to back (`--overlap-steps`)."""
    rank_orders: tuple[str, ...] = ("octopipe",)
    """The rank orders it runs (`JobShape.rank_order`), its default first: the search prices
    each."""
    accepts: tuple[str, ...] = ()
    """The engines whose exports an answer for it may carry besides its own (`--megatron`,
    the torchtitan flags)."""
    companions: tuple[str, ...] = ()
    """The engines whose exports its answers carry by default."""

    @property
    def rank_order(self) -> str:
        """Its default rank order."""
        return self.rank_orders[0]

    # --- what it refuses ---------------------------------------------------------------------

    def refuse_model(self, arch: Architecture) -> str | None:
        """Why it cannot train `arch` in any shape, or None where it can."""
        return None

    def refuse(
        self,
        shape: JobShape,
        arch: Architecture | None,
        overlap_steps: bool = False,
        precision: str = "bf16",
    ) -> str | None:
        """Why it cannot run `shape` of `arch` (with overlapped steps, its GEMMs in
        `precision`), or None where it can."""
        return None

    def refuse_plan(self, plan: Plan, shape: JobShape) -> str | None:
        """Why it cannot run `plan` (of `shape`) as planned, or None where it can."""
        return None

    # --- how it prices a shape -----------------------------------------------------------------

    def price(self, job: Job) -> Job:
        """The job with its stack as this engine runs it."""
        return job

    def variants(self, shape: JobShape, gpus_per_node: int) -> list[JobShape]:
        """The shape's variants it runs."""
        return [shape]

    def tunes(self, shape: JobShape) -> bool:
        """Whether the tuner can find it a better plan of `shape` than the named ones."""
        return True

    def schedules(self, names: Schedules, shape: JobShape) -> Schedules:
        """The named baselines it runs, of `names`."""
        return names

    def screen_baselines(self, names: Schedules, shape: JobShape) -> Schedules:
        """A shape's screening baselines (`names`: OctoPipe's), or its own."""
        kept = self.schedules(names, shape)
        return kept if kept == names else WHOLE_BACKWARD_SCREEN

    def standard_schedules(self, names: Schedules) -> Schedules:
        """The schedules its users run as they come (`names`: OctoPipe's standard ones)."""
        return names

    # --- what it writes, and how it launches ---------------------------------------------------

    def write(self, answer: Answer, out: Path) -> list[str]:
        """Write its files for `answer` into `out` (which holds the plan's plan.json and
        schedule.csv); the names written. None for a plan it cannot run: `launch` says why."""
        return []

    def launch(self, answer: Answer, out: Path) -> list[str]:
        """The lines that say how to run what `write` wrote (commands, then notes), or the one
        line why it wrote nothing."""
        return []

    # --- shared by the subclasses --------------------------------------------------------------

    @staticmethod
    def _with_stack(job: Job, **changes: object) -> Job:
        stack = replace(job.stack, **changes)
        return job if stack == job.stack else replace(job, stack=stack)


@dataclass(frozen=True)
class SynchronousEngine(Engine):
    """What torchtitan and Megatron-LM share: synchronous steps, EP folded, PP outermost, one
    recomputation for every stage."""

    fold_experts: bool = True
    rank_orders: tuple[str, ...] = ("megatron",)

    def refuse(
        self,
        shape: JobShape,
        arch: Architecture | None,
        overlap_steps: bool = False,
        precision: str = "bf16",
    ) -> str | None:
        if overlap_steps:
            return f"{self.title} runs synchronous steps, not overlapped ones"
        if shape.rank_order not in self.rank_orders:
            order = shape.rank_order
            return f"{self.title} numbers ranks in the {self.rank_order} order, not the {order}"
        return self._refuse_shape(shape)

    def _refuse_shape(self, shape: JobShape) -> str | None:
        raise NotImplementedError

    def refuse_plan(self, plan: Plan, shape: JobShape) -> str | None:
        if plan.recompute:
            return f"{self.title} recomputes the same in every stage"
        return self._refuse_plan(plan, shape, bool(split_backwards(plan)))

    def _refuse_plan(self, plan: Plan, shape: JobShape, split: bool) -> str | None:
        raise NotImplementedError

    def schedules(self, names: Schedules, shape: JobShape) -> Schedules:
        return tuple(n for n in names if n[0] in _WHOLE)
