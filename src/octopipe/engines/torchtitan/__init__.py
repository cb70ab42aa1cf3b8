"""torchtitan (0.3, through `octopipe_torchtitan.py`; 0.2 through `torchtitan.toml`).

- **refuses**: ZeRO-1 and -2 (it has FSDP over all DP x CP ranks or over shard groups of a
  node's GPUs, HSDP, and DDP without CP), selective recomputation (its selective checkpointing
  is per op, not the one priced), checkpointing under a split backward, EP not dividing
  dp_shard x CP x TP; `layout.py` says the same of a written plan (tests/test_plan_runners.py
  holds the two together).
- **prices**: any order (its CSV runtime) and any placement (`octopipe_torchtitan_stages.py`);
  without PP its export accumulates M passes of one microbatch, reducing gradients after each:
  priced under FSDP (per microbatch), so replicas without PP take one microbatch. It reshards
  FSDP's weights after each microbatch without PP. Ranks PP outermost (its mesh).
- **writes**: `torchtitan.toml` (0.2) and, where a torchtitan base config is known
  (`--torchtitan-config`, else torchtitan's own of the model's shape: `registry.py`),
  `octopipe_torchtitan.py` (+ `octopipe_torchtitan_stages.py` for a free placement): `config.py`,
  `toml.py`, `layout.py`, `names.py`, `plan.py`. As `--runner torchtitan`, a model without one
  is an error (one line); beside `octopipe run`'s answer, a hint.
- **launches**: the torchrun command of `config.py`, with a note wherever it runs the plan
  otherwise than planned.

Nothing here imports torch or torchtitan.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from octopipe.engines.base import Schedules, SynchronousEngine
from octopipe.engines.torchtitan.config import (
    CONFIG_MODULE,
    SHIPPED_BASES,
    TorchtitanBase,
    torchtitan_launch_command,
    write_torchtitan_config,
)
from octopipe.engines.torchtitan.layout import TitanLayout, titan_layout
from octopipe.engines.torchtitan.names import torchtitan_names
from octopipe.engines.torchtitan.plan import module_fqns_per_model_part, placement_style
from octopipe.engines.torchtitan.registry import model_base, no_base_reason
from octopipe.engines.torchtitan.toml import (
    to_toml,
    toml_string,
    torchtitan_settings,
    write_torchtitan_toml,
)
from octopipe.errors import InputError
from octopipe.plan import JobShape, Plan

if TYPE_CHECKING:
    from octopipe.costmodel.arch import Architecture
    from octopipe.engines.answer import Answer, Exports
    from octopipe.layouts.layout import Job

# torchtitan 0.3's named schedules OctoPipe generates (its InterleavedZeroBubble is not one).
TORCHTITAN_STANDARD: Schedules = (
    ("1f1b", "uniform", None),
    ("i1f1b", "uniform", 2),
    ("gpipe", "uniform", None),
    ("zbv", "uniform", None),
    ("dualpipev", "uniform", None),
)
TOML_FILE = "torchtitan.toml"


@dataclass(frozen=True)
class TorchtitanEngine(SynchronousEngine):
    name: str = "torchtitan"
    title: str = "torchtitan"
    zero_stages: tuple[int, ...] = (0, 3)
    accepts: tuple[str, ...] = ("torchtitan",)

    def tunes(self, shape: JobShape) -> bool:
        return shape.pp > 1  # without PP one stage: no schedule to order

    def price(self, job: Job) -> Job:
        # It reshards after each forward without PP; its FP8 recipes (tensorwise up to 0.2,
        # rowwise in 0.3) compute each scale at the cast: current scaling. Its tensor
        # parallelism is torch's: a column-parallel linear keeps its gathered input.
        scaling = "current" if job.stack.precision == "fp8" else job.stack.fp8_scaling
        return self._with_stack(job, zero3_held=False, fp8_scaling=scaling, tp_keeps_gathered=True)

    def variants(self, shape: JobShape, gpus_per_node: int) -> list[JobShape]:
        """The shape and its HSDP variant: FSDP within a node's GPUs (shard groups of a node's
        TP groups), replicated across nodes. One variant only: the bound order prunes the
        rest."""
        out = [shape]
        if shape.zero == 3:
            group = gpus_per_node // shape.tp
            ranks = shape.copies
            if 1 < group < ranks and ranks % group == 0 and group % shape.cp == 0:
                out.append(replace(shape, shard_group=group))
        return out

    def _refuse_shape(self, shape: JobShape) -> str | None:
        return _titan_refusal(shape)

    def _refuse_plan(self, plan: Plan, shape: JobShape, split: bool) -> str | None:
        if plan.num_stages > plan.num_devices == 1:
            return "torchtitan runs no pipeline schedule without PP (one stage)"
        if split and shape.recompute != "none":
            return "torchtitan's activation checkpointing survives no split backward"
        return None

    def schedules(self, names: Schedules, shape: JobShape) -> Schedules:
        return names if shape.recompute == "none" else super().schedules(names, shape)

    def standard_schedules(self, names: Schedules) -> Schedules:
        return TORCHTITAN_STANDARD

    # --- what it writes, and how it launches ---------------------------------------------------

    def write(self, answer: Answer, out: Path) -> list[str]:
        """torchtitan.toml, and the 0.3 config module where a base config is known and
        torchtitan 0.3 runs the plan (`launch` says why not otherwise)."""
        # Absolute: torchtitan reads the CSV from wherever it is started.
        csv_path = str((out / "schedule.csv").resolve())
        base = base_config(answer.exports, answer.model, answer.from_profile)
        if base is None and _planned_for_torchtitan(answer):
            raise missing_base(answer.model)
        write_torchtitan_toml(answer.plan, answer.profile, out / TOML_FILE, csv_path)
        written = [TOML_FILE]
        if base is not None and not isinstance(_runs(answer), str):
            written += write_torchtitan_config(
                answer.plan,
                answer.profile,
                out,
                base,
                answer.model,
                answer.gpus_per_node,
                *answer.exports.titan_paths,
            )
        return written

    def launch(self, answer: Answer, out: Path) -> list[str]:
        """The 0.3 launch command of the config `write` wrote and a note for each place
        torchtitan runs it otherwise than planned, or why there is none."""
        base = base_config(answer.exports, answer.model, answer.from_profile)
        if base is None:
            return [
                "torchtitan: torchtitan.toml is for torchtitan up to 0.2; for a 0.3 config, give "
                "--torchtitan-config MODULE:CONFIG (the torchtitan config to start from, e.g. "
                "llama3:llama3_8b)"
            ]
        lay = _runs(answer)
        if isinstance(lay, str):
            return [f"torchtitan 0.3: no {CONFIG_MODULE}.py: {lay}"]
        paths = answer.exports.titan_paths
        command = torchtitan_launch_command(out, lay.world, answer.gpus_per_node, *paths)
        free = placement_style(answer.plan) == "free"
        placed = " (stages placed by octopipe_torchtitan_stages.py)" if free else ""
        nodes = lay.world // (answer.gpus_per_node or lay.world)
        # The module names its schedule.csv by absolute path, as torchtitan's flags do.
        shared = (
            [f"  (on each of the {nodes} nodes, with {out.resolve()} at that same path)"]
            if nodes > 1
            else []
        )
        return [
            f"torchtitan 0.3{placed}, from {base.module}.{base.config}, {lay.describe()}:",
            f"  {command}",
            *shared,
            *(f"note: {n}" for n in lay.notes),
        ]


def base_config(exports: Exports, model: str, from_profile: bool = False) -> TorchtitanBase | None:
    """The torchtitan config the 0.3 export starts from: `--torchtitan-config`, else
    torchtitan's own config of a model of `model`'s shape (a shipped name or a config.json;
    `registry.py`); none for a profile, or a model of no torchtitan config's shape."""
    if exports.torchtitan_config is not None:
        return TorchtitanBase.parse(exports.torchtitan_config)
    if from_profile:
        return None
    if model in SHIPPED_BASES:
        return SHIPPED_BASES[model]
    arch = _architecture(model)
    return None if arch is None else model_base(arch)


def missing_base(model: str) -> InputError:
    """The one-line error of `--runner torchtitan` for a model torchtitan 0.3 has no config
    of: what it lacks, and the flag that gives one."""
    arch = _architecture(model)
    why = f" ({no_base_reason(arch)})" if arch is not None else ""
    name = arch.name if arch is not None else model
    return InputError(
        "--runner torchtitan",
        f"torchtitan 0.3 has no config of {name}'s shape{why}; give --torchtitan-config "
        "MODULE:CONFIG, the torchtitan config octopipe_torchtitan.py starts from (e.g. "
        "llama3:llama3_8b)",
    )


def _architecture(model: str) -> Architecture | None:
    from octopipe.costmodel import load_architecture

    try:
        return load_architecture(model)
    except InputError:
        return None


def _planned_for_torchtitan(answer: Answer) -> bool:
    """Whether `answer` is `plan --gpus --runner torchtitan`'s, not `octopipe run`'s (whose
    answers carry torchtitan's export beside, with a hint where it has no config). An answer
    names no runner; its stack does: priced as torchtitan runs FSDP (`price`: weights gathered
    per microbatch), where `octopipe run`'s holds them across the step, and a single pipeline's
    answer carries none."""
    return answer.stack is not None and not answer.stack.zero3_held


def _runs(answer: Answer) -> TitanLayout | str:
    """How torchtitan 0.3 runs the answer's plan, or the one line that says why it cannot."""
    try:
        return titan_layout(answer.plan, answer.profile, answer.gpus_per_node)
    except InputError as exc:
        return str(exc)


def _titan_refusal(shape: JobShape) -> str | None:
    ranks = shape.copies
    if shape.zero in (1, 2):
        return f"torchtitan has no ZeRO-{shape.zero} (only FSDP, HSDP or DDP: z3 or z0)"
    if shape.zero == 0 and shape.cp > 1:
        return "torchtitan shards weights over the CP ranks (FSDP) wherever CP > 1: give z3"
    if shape.pp == 1 and shape.num_microbatches > 1 and shape.zero != 3:
        # Its export accumulates M passes of one microbatch without PP, and torchtitan reduces
        # the gradients after each: FSDP's reduce-scatter per microbatch is priced so,
        # replicas' all-reduces once a step are not.
        return "torchtitan without PP reduces gradients every accumulated microbatch (FSDP)"
    if shape.recompute == "selective":
        return "torchtitan's selective checkpointing is per op, not the one priced"
    shards = shape.shards if shape.zero == 3 else 1
    if shape.zero == 3 and (shards % shape.cp or ranks % shards):
        return f"a shard group of {shards} is not CP {shape.cp} times a divisor of DP"
    if shape.ep > 1:
        expert_ranks = (shards if shape.zero == 3 else 1) * shape.tp
        if shape.zero != 3:
            expert_ranks *= shape.cp
        if expert_ranks % shape.ep:
            return f"EP {shape.ep} does not divide dp_shard x CP x TP = {expert_ranks}"
    return None


__all__ = [
    "CONFIG_MODULE",
    "SHIPPED_BASES",
    "TORCHTITAN_STANDARD",
    "TitanLayout",
    "TorchtitanBase",
    "TorchtitanEngine",
    "base_config",
    "missing_base",
    "model_base",
    "module_fqns_per_model_part",
    "titan_layout",
    "to_toml",
    "toml_string",
    "torchtitan_launch_command",
    "torchtitan_names",
    "torchtitan_settings",
    "write_torchtitan_config",
    "write_torchtitan_toml",
]
