"""Megatron-LM (Megatron-Core 0.20, through `megatron_args.sh`).

- **refuses**: I/W splits, placements other than stage s on rank s mod P, per-stage
  recomputation, ZeRO-2/3 (Megatron-FSDP, which the export does not write), EP not dividing
  TP x CP x DP;
- **prices**: 1F1B and interleaved 1F1B in its own order over the looped placement, any
  partition (its `--pipeline-model-parallel-layout`), the distributed optimizer (ZeRO-1) or
  none, EP folded over TP x CP x DP, ranks PP outermost (`tp-cp-ep-dp-pp`) or, with
  `--use-tp-pp-dp-mapping`, DP outermost (`tp-cp-ep-pp-dp`), every gradient reduced after the
  step's last backward (its export writes no `--overlap-grad-reduce`);
- **writes**: `megatron_args.sh` (`args.py`);
- **launches**: says how to pass the arguments to `pretrain_gpt.py`, with a note wherever it
  runs the plan otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from octopipe.engines.base import Schedules, SynchronousEngine
from octopipe.engines.megatron.args import (
    ARGS_FILE,
    MEGATRON_TARGET,
    megatron_arguments,
    megatron_notes,
    megatron_world,
    write_megatron_args,
)
from octopipe.errors import InputError
from octopipe.plan import JobShape, Plan

if TYPE_CHECKING:
    from octopipe.engines.answer import Answer
    from octopipe.layouts.layout import Job

MEGATRON_STANDARD: Schedules = (("1f1b", "uniform", None), ("i1f1b", "uniform", 2))


@dataclass(frozen=True)
class MegatronEngine(SynchronousEngine):
    name: str = "megatron"
    title: str = "Megatron-LM"
    # Its default `tp-cp-ep-dp-pp`, and `tp-cp-ep-pp-dp` (`--use-tp-pp-dp-mapping`).
    rank_orders: tuple[str, ...] = ("megatron", "octopipe")
    accepts: tuple[str, ...] = ("megatron",)

    def tunes(self, shape: JobShape) -> bool:
        return False  # it runs its own orders

    def price(self, job: Job) -> Job:
        # As its export writes it (no `--overlap-grad-reduce`): every gradient reduced after
        # the step's last backward.
        return self._with_stack(job, zero3_held=False, reduce_at_end=True)

    def _refuse_shape(self, shape: JobShape) -> str | None:
        if shape.zero >= 2:
            return (
                f"ZeRO-{shape.zero} is Megatron-FSDP, which the Megatron-LM export does not write"
            )
        if shape.ep > 1 and shape.stage_ranks % shape.ep:
            return f"EP {shape.ep} does not divide TP x CP x DP = {shape.stage_ranks}"
        return None

    def _refuse_plan(self, plan: Plan, shape: JobShape, split: bool) -> str | None:
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

    # --- what it writes, and how it launches ---------------------------------------------------

    def write(self, answer: Answer, out: Path) -> list[str]:
        """megatron_args.sh; nothing for a plan Megatron-LM cannot run (`launch` says why)."""
        try:
            write_megatron_args(answer.plan, answer.profile, out / ARGS_FILE)
        except InputError:
            return []
        return [ARGS_FILE]

    def launch(self, answer: Answer, out: Path) -> list[str]:
        """How to pass the written arguments on, with a line wherever Megatron-LM runs the plan
        otherwise; or the one line why Megatron-LM cannot run it."""
        plan, profile = answer.plan, answer.profile
        try:
            megatron_arguments(plan, profile)
        except InputError as exc:
            return [f"Megatron-LM: no {ARGS_FILE}: {exc}"]
        return [
            f"Megatron-LM ({MEGATRON_TARGET}), {megatron_world(plan, profile)} GPUs: wrote "
            f'{ARGS_FILE}; source it and pass "${{MEGATRON_ARGS[@]}}" to pretrain_gpt.py with '
            "the model's, data's and optimizer's arguments",
            *(f"note: {n}" for n in megatron_notes(plan)),
        ]


__all__ = [
    "ARGS_FILE",
    "MEGATRON_STANDARD",
    "MEGATRON_TARGET",
    "MegatronEngine",
    "megatron_arguments",
    "megatron_notes",
    "megatron_world",
    "write_megatron_args",
]
