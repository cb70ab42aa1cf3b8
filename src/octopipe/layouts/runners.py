"""The engines a `plan --gpus` answer is for (`--runner`): what each carries out of a layout and
of a plan, so that the search answers only with what that engine runs, priced as it runs it.

    runner = get_runner("torchtitan")   # Runner (OctoPipe's), TorchtitanRunner, MegatronRunner
    runner.layouts(layout, gpus_per_node)      # the layout's variants it runs (HSDP groups)
    runner.layout_refusal(layout, arch)        # why it cannot run a layout, or None
    runner.plan_refusal(plan, layout)          # why it cannot run a plan of it, or None

- **octopipe** (`octopipe run`): every schedule, placement and partition; ZeRO-0 and 1 where
  the executor builds them (`runnable.py`). Its ZeRO-3 (FSDP2 over all DP x CP ranks) holds a
  stage's gathered weights and gradients across the step, so it is priced exactly as ZeRO-1
  (the same peak, one gather and one reduce-scatter a step): the search offers ZeRO-1 in its
  place rather than screen every layout twice (tests/test_plan_runners.py holds the prices
  equal).
- **torchtitan** (0.3, through `octopipe_torchtitan.py`): FSDP over all DP x CP ranks or over
  shard groups of a node's GPUs (HSDP), DDP without CP; no ZeRO-1. Any order (its CSV runtime)
  and any placement (`octopipe_torchtitan_stages.py`), but activation checkpointing is one
  setting for every block and survives no split backward; its selective checkpointing is not
  the one priced, so none or full. EP over dp_shard x CP x TP. `export/titan_layout.py` says
  the same of a written plan; tests/test_plan_runners.py holds the two together. Without PP
  its export accumulates M passes of one microbatch, reducing gradients after each: priced
  under FSDP (per microbatch), so replicas without PP take one microbatch.
- **megatron** (Megatron-LM, Megatron-Core 0.20, through `megatron_args.sh`): 1F1B and
  interleaved 1F1B in its own order over the looped placement, any partition (its
  `--pipeline-model-parallel-layout`), whole backwards, the distributed optimizer (ZeRO-1) or
  none, one recomputation for every stage, EP folded over TP x CP x DP
  (`export/megatron.py`).

Neither torchtitan nor Megatron-LM overlaps steps; both number ranks with PP outermost.
Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from octopipe.costmodel.arch import Architecture
from octopipe.errors import InputError
from octopipe.layouts.layout import Job
from octopipe.layouts.runnable import run_refusal
from octopipe.plan import Plan, split_backwards
from octopipe.plan.shape import JobShape

DEFAULT_RUNNER = "octopipe"

Schedules = tuple[tuple[str, str, int | None], ...]  # (schedule, partition, chunks)
# The screening baselines of runners that run only whole backwards (1F1B's family).
WHOLE_BACKWARD_SCREEN: Schedules = (("i1f1b", "balanced", None), ("1f1b", "balanced", None))
# torchtitan 0.3's named schedules OctoPipe generates (its InterleavedZeroBubble is not one).
TORCHTITAN_STANDARD: Schedules = (
    ("1f1b", "uniform", None),
    ("i1f1b", "uniform", 2),
    ("gpipe", "uniform", None),
    ("zbv", "uniform", None),
    ("dualpipev", "uniform", None),
)
MEGATRON_STANDARD: Schedules = (("1f1b", "uniform", None), ("i1f1b", "uniform", 2))
_WHOLE = frozenset(("gpipe", "1f1b", "i1f1b"))  # schedules with no I/W split


@dataclass(frozen=True)
class Runner:
    """An engine's rules. This class is OctoPipe's own executor's (`octopipe run`); the
    other engines override what they carry out otherwise."""

    name: str = "octopipe"
    engine: str = "octopipe run"
    zero_stages: tuple[int, ...] = (0, 1)
    """The ZeRO stages the layout search offers it."""
    fold_experts: bool = False
    """EP over TP x CP x DP (torchtitan, Megatron-Core), not only over DP x CP."""
    overlaps_steps: bool = True
    """Whether it runs steps back to back (`--overlap-steps`): OctoPipe's executor only."""
    rank_order: str = "octopipe"
    """How its ranks are numbered (`JobShape.rank_order`): PP outermost in both others."""

    def tunes(self, layout: JobShape) -> bool:
        """Whether the tuner can find it a better plan of `layout` than the named ones."""
        return True

    def priced(self, job: Job) -> Job:
        """The job with its stack as this runner runs it. OctoPipe's executor holds a stage's
        gathered FSDP weights across the step's microbatches even without PP
        (`runtime/parallel/fsdp.py`)."""
        return self._with_stack(job, zero3_held=True)

    def layouts(self, layout: JobShape, gpus_per_node: int) -> list[JobShape]:
        """The layout's variants it runs."""
        return [layout]

    def layout_refusal(
        self, layout: JobShape, arch: Architecture, overlap_steps: bool = False
    ) -> str | None:
        """Why it cannot run `layout` of `arch`, or None where it can."""
        return run_refusal(layout, arch, overlap_steps)

    def plan_refusal(self, plan: Plan, layout: JobShape) -> str | None:
        """Why it cannot run `plan` (of `layout`) as planned, or None where it can."""
        return None

    def schedules(self, names: Schedules, layout: JobShape) -> Schedules:
        """The named baselines it runs, of `names`."""
        return names

    def screen_baselines(self, names: Schedules, layout: JobShape) -> Schedules:
        """A layout's screening baselines (`names`: OctoPipe's), or its own."""
        kept = self.schedules(names, layout)
        return kept if kept == names else WHOLE_BACKWARD_SCREEN

    def standard_schedules(self, names: Schedules) -> Schedules:
        """The schedules its users run as they come (`names`: OctoPipe's standard ones)."""
        return names

    def _with_stack(self, job: Job, **changes: object) -> Job:
        stack = replace(job.stack, **changes)
        return job if stack == job.stack else replace(job, stack=stack)


@dataclass(frozen=True)
class _OtherEngine(Runner):
    """What torchtitan and Megatron-LM share: synchronous steps, EP folded, PP outermost,
    one recomputation for every stage."""

    fold_experts: bool = True
    overlaps_steps: bool = False
    rank_order: str = "megatron"

    def layout_refusal(
        self, layout: JobShape, arch: Architecture, overlap_steps: bool = False
    ) -> str | None:
        if overlap_steps:
            return f"{self.engine} runs synchronous steps, not overlapped ones"
        return self._layout_refusal(layout, layout.dp * layout.cp)

    def _layout_refusal(self, layout: JobShape, ranks: int) -> str | None:
        raise NotImplementedError

    def plan_refusal(self, plan: Plan, layout: JobShape) -> str | None:
        if plan.recompute:
            return f"{self.engine} recomputes the same in every stage"
        return self._plan_refusal(plan, layout, bool(split_backwards(plan)))

    def _plan_refusal(self, plan: Plan, layout: JobShape, split: bool) -> str | None:
        raise NotImplementedError

    def schedules(self, names: Schedules, layout: JobShape) -> Schedules:
        return tuple(n for n in names if n[0] in _WHOLE)


@dataclass(frozen=True)
class TorchtitanRunner(_OtherEngine):
    name: str = "torchtitan"
    engine: str = "torchtitan"
    zero_stages: tuple[int, ...] = (0, 3)

    def tunes(self, layout: JobShape) -> bool:
        return layout.pp > 1  # without PP one stage: no schedule to order

    def priced(self, job: Job) -> Job:
        return self._with_stack(job, zero3_held=False)  # it reshards after each without PP

    def layouts(self, layout: JobShape, gpus_per_node: int) -> list[JobShape]:
        """The layout and its HSDP variant: FSDP within a node's GPUs (shard groups of a
        node's TP groups), replicated across nodes. One variant only: the bound order prunes
        the rest."""
        out = [layout]
        if layout.zero == 3:
            group = gpus_per_node // layout.tp
            ranks = layout.dp * layout.cp
            if 1 < group < ranks and ranks % group == 0 and group % layout.cp == 0:
                out.append(replace(layout, shard_group=group))
        return out

    def _layout_refusal(self, layout: JobShape, ranks: int) -> str | None:
        return _titan_refusal(layout, ranks)

    def _plan_refusal(self, plan: Plan, layout: JobShape, split: bool) -> str | None:
        if plan.num_stages > plan.num_devices == 1:
            return "torchtitan runs no pipeline schedule without PP (one stage)"
        if split and layout.recompute != "none":
            return "torchtitan's activation checkpointing survives no split backward"
        return None

    def schedules(self, names: Schedules, layout: JobShape) -> Schedules:
        return names if layout.recompute == "none" else super().schedules(names, layout)

    def standard_schedules(self, names: Schedules) -> Schedules:
        return TORCHTITAN_STANDARD


@dataclass(frozen=True)
class MegatronRunner(_OtherEngine):
    name: str = "megatron"
    engine: str = "Megatron-LM"

    def tunes(self, layout: JobShape) -> bool:
        return False  # it runs its own orders

    def priced(self, job: Job) -> Job:
        # As its export writes it (no `--overlap-grad-reduce`): every gradient reduced after
        # the step's last backward.
        return self._with_stack(job, zero3_held=False, reduce_at_end=True)

    def _layout_refusal(self, layout: JobShape, ranks: int) -> str | None:
        if layout.zero >= 2:
            return (
                f"ZeRO-{layout.zero} is Megatron-FSDP, which the Megatron-LM export does not write"
            )
        if layout.ep > 1 and (layout.tp * ranks) % layout.ep:
            return f"EP {layout.ep} does not divide TP x CP x DP = {layout.tp * ranks}"
        return None

    def _plan_refusal(self, plan: Plan, layout: JobShape, split: bool) -> str | None:
        P, S = plan.num_devices, plan.num_stages
        if split:
            return "Megatron-LM runs whole backwards, not I/W splits"
        if S % P or any(s.device != i % P for i, s in enumerate(plan.stages)):
            return f"Megatron-LM places stage s on rank s mod {P}"
        if S > P == 1:
            return "Megatron-LM interleaves virtual stages over more than one pipeline rank"
        return None

    def standard_schedules(self, names: Schedules) -> Schedules:
        return MEGATRON_STANDARD


_RUNNERS = {r.name: r for r in (Runner(), TorchtitanRunner(), MegatronRunner())}
RUNNERS = tuple(_RUNNERS)


def get_runner(name: str) -> Runner:
    if name not in _RUNNERS:
        raise InputError("--runner", f"expected one of {', '.join(RUNNERS)}, got {name!r}")
    return _RUNNERS[name]


def _titan_refusal(layout: JobShape, ranks: int) -> str | None:
    if layout.zero in (1, 2):
        return f"torchtitan has no ZeRO-{layout.zero} (only FSDP, HSDP or DDP)"
    if layout.zero == 0 and layout.cp > 1:
        return "torchtitan shards weights over the CP ranks (FSDP) wherever CP > 1"
    if layout.pp == 1 and layout.num_microbatches > 1 and layout.zero != 3:
        # Its export accumulates M passes of one microbatch without PP, and torchtitan reduces
        # the gradients after each: FSDP's reduce-scatter per microbatch is priced so,
        # replicas' all-reduces once a step are not.
        return "torchtitan without PP reduces gradients every accumulated microbatch (FSDP)"
    if layout.recompute == "selective":
        return "torchtitan's selective checkpointing is per op, not the one priced"
    shards = layout.shards if layout.zero == 3 else 1
    if layout.zero == 3 and (shards % layout.cp or ranks % shards):
        return f"a shard group of {shards} is not CP {layout.cp} times a divisor of DP"
    if layout.ep > 1:
        expert_ranks = (shards if layout.zero == 3 else 1) * layout.tp
        if layout.zero != 3:
            expert_ranks *= layout.cp
        if expert_ranks % layout.ep:
            return f"EP {layout.ep} does not divide dp_shard x CP x TP = {expert_ranks}"
    return None
