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
    LAUNCH_FILE,
    MEGATRON_TARGET,
    megatron_arguments,
    megatron_notes,
    megatron_world,
    write_megatron_args,
    write_megatron_launch,
)
from octopipe.engines.megatron.model import model_arguments, model_refusal
from octopipe.errors import InputError
from octopipe.plan import JobShape, Plan

if TYPE_CHECKING:
    from octopipe.costmodel.arch import Architecture
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

    def refuse_model(self, arch: Architecture) -> str | None:
        return model_refusal(arch)

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
        """megatron_args.sh and, where the model is known, megatron_launch.sh; nothing for a
        plan Megatron-LM cannot run (`launch` says why)."""
        arch = _architecture(answer)
        try:
            write_megatron_args(
                answer.plan, answer.profile, out / ARGS_FILE, arch, _tp_comm_overlap(answer)
            )
        except InputError:
            return []
        if arch is None:
            return [ARGS_FILE]
        gpn = answer.gpus_per_node or megatron_world(answer.plan, answer.profile)
        write_megatron_launch(answer.plan, answer.profile, arch, gpn, out / LAUNCH_FILE)
        return [ARGS_FILE, LAUNCH_FILE]

    def launch(self, answer: Answer, out: Path) -> list[str]:
        """How to start each node, with a line wherever Megatron-LM runs the plan otherwise;
        or the one line why Megatron-LM cannot run it."""
        plan, profile = answer.plan, answer.profile
        arch = _architecture(answer)
        try:
            if arch is not None:
                model_arguments(arch)
            megatron_arguments(plan, profile)
        except InputError as exc:
            return [f"Megatron-LM: no {ARGS_FILE}: {exc}"]
        world = megatron_world(plan, profile)
        if arch is None:
            return [
                f"Megatron-LM ({MEGATRON_TARGET}), {world} GPUs: wrote {ARGS_FILE}; source it "
                "and pass \"${MEGATRON_ARGS[@]}\" to pretrain_gpt.py with the model's, data's "
                "and optimizer's arguments (a profile names no model)",
                *(f"note: {n}" for n in megatron_notes(plan)),
            ]
        per_node = min(answer.gpus_per_node or world, world)
        nodes = -(-world // per_node)
        where = f"r (0 to {nodes - 1})" if nodes > 1 else "0"
        return [
            f"Megatron-LM ({MEGATRON_TARGET}), {world} GPUs: on node {where}, "
            f"MASTER_ADDR=<node 0> MEGATRON_LM=<Megatron-LM> TOKENIZER_MODEL=<tokenizer> "
            f"DATA_PATH=<prefix> TRAIN_ITERS=<steps> LR=<peak> bash {out / LAUNCH_FILE} "
            f"{'r' if nodes > 1 else '0'}",
            *(f"note: {n}" for n in megatron_notes(plan)),
        ]


def _architecture(answer: Answer) -> Architecture | None:
    """The answer's model, where it names one (a profile names none)."""
    if answer.from_profile:
        return None
    from octopipe.costmodel import load_architecture

    try:
        return load_architecture(answer.model)
    except InputError:
        return None


def _tp_comm_overlap(answer: Answer) -> bool:
    return answer.stack is not None and answer.stack.tp_comm_overlap


__all__ = [
    "ARGS_FILE",
    "LAUNCH_FILE",
    "MEGATRON_STANDARD",
    "MEGATRON_TARGET",
    "MegatronEngine",
    "megatron_arguments",
    "megatron_notes",
    "megatron_world",
    "write_megatron_args",
]
