"""What a rank is told of its job: the plan, the model, and every setting resolved against the
plan (`RunConfig`), built by `octopipe.training.runtime_config` from the job config.

The user's settings are spelled once, in `octopipe.config`; `training.py` resolves them into
what the ranks use: the job's shape (degrees and sizes from the plan where not given), data as
sources, the optimizer built, and test-only switches.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from torch import nn

from octopipe.errors import InputError
from octopipe.plan import JobShape, Plan
from octopipe.runtime.data.batches import DataSource, SyntheticData
from octopipe.runtime.model.load import load_recipe
from octopipe.runtime.model.recipe import (
    DEFAULT_MICRO_BATCH_SIZE,
    DEFAULT_SEQ_LEN,
    Loss,
    ModelRecipe,
    ModelSpec,
    vocabulary_size,
)
from octopipe.runtime.step.optim import OptimizerConfig


@dataclass(frozen=True)
class Stepping:
    """How each step runs."""

    lookahead: int = 8  # how many actions ahead receives are posted
    reduce_at_end: bool = False  # all-reduces after the last action, not each stage's last B/W
    autocast: str | None = None  # "bf16": forwards under torch.autocast to bfloat16
    fp8: bool = False  # the blocks' linears in FP8 (torchao's float8), as the plan was priced
    overlap_steps: bool = False  # no barrier between steps; post-validated per-stage updates
    accumulation: int = 1  # pipeline passes (of D x M x b sequences) per optimizer step

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return {None: None, "bf16": torch.bfloat16}[self.autocast]


@dataclass(frozen=True)
class Checkpointing:
    """Where checkpoints go, how often, and which to resume."""

    dir: str | None = None  # where DIR/step-N checkpoints go
    every: int = 0  # save after every this many steps (0: never)
    keep_last: int = 0  # checkpoints kept in `dir` after each save (0: all)
    resume: bool = False  # start from the latest checkpoint in `dir`, if any
    required: bool = False  # `--resume=require`: no checkpoint to resume is refused
    chosen: str | None = None  # the one to resume, chosen before the ranks start (preflight)
    at_start: bool = False  # an earlier job of the launch writes it: choose at the start


@dataclass(frozen=True)
class Evaluating:
    """Held-out evaluation (`evaluate.py`)."""

    data: DataSource | None = None  # held-out sequences; None: no evaluation
    every: int = 0  # evaluate after every this many steps (0: after the last only)
    batches: int = 4  # global batches of held-out data per evaluation


@dataclass(frozen=True)
class RunConfig:
    """How to train a plan; identical on every rank."""

    model: ModelSpec  # a bundled name, config.json, `hf:PATH`, `module:factory`, or a factory
    seed: int = 0  # weights and data
    steps: int = 1
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    seq_len: int = DEFAULT_SEQ_LEN  # tokens per sequence of the synthetic data or --data
    # The job's shape: TP, CP, DP, EP, the ZeRO stage (1: ZeRO-1, 3: FSDP2), the sequences per
    # microbatch and the rank order; its PP and microbatch count are the plan's (`Job` sets
    # them from it).
    shape: JobShape = field(default_factory=lambda: JobShape(1, 1, 1, DEFAULT_MICRO_BATCH_SIZE))
    data: DataSource | None = None  # None: the model's synthetic sequences
    loss: Loss | None = None  # None: the model's loss (next-token cross-entropy by default)
    stepping: Stepping = field(default_factory=Stepping)
    checkpoint: Checkpointing = field(default_factory=Checkpointing)
    evaluation: Evaluating = field(default_factory=Evaluating)
    peak_flops: float | None = None  # one rank's dense peak FLOP/s for MFU (None: its GPU's)
    collect_state: bool = False  # return every parameter and its last gradient (tests, fuzzing)
    order_matched: bool = False  # gloo: match transfers by order, a group per channel (NCCL's)

    def recipe(self) -> ModelRecipe:
        """The model's recipe. An expert-parallel degree the model's experts cannot take is
        refused here (`check_experts`), so before any rank starts: the launcher's checks
        begin by loading the recipe."""
        recipe = load_recipe(self.model)
        check_experts(recipe, self.shape.ep)
        return recipe

    def data_source(self, recipe: ModelRecipe) -> DataSource:
        if self.data is not None:
            return self.data.for_vocabulary(vocabulary_size(recipe))
        return SyntheticData(recipe.synthetic_sequence, self.seq_len, self.seed)

    def val_source(self, recipe: ModelRecipe) -> DataSource | None:
        held_out = self.evaluation.data
        return None if held_out is None else held_out.for_vocabulary(vocabulary_size(recipe))

    def global_sequences(self, plan: Plan) -> int:
        """Sequences per step, over all replicas: D x M x b, times the passes accumulated."""
        return self.pass_sequences(plan) * self.stepping.accumulation

    def pass_sequences(self, plan: Plan) -> int:
        """Sequences of one pass of the plan over all replicas: D x M x b."""
        return self.shape.dp * plan.num_microbatches * self.shape.microbatch_size


def check_experts(recipe: ModelRecipe, ep: int) -> None:
    """`--ep` above 1 needs routed experts to divide, and an expert count it divides in every
    MoE layer: the rule each rank applies when it divides them (`parallel.experts.apply_ep`),
    asked of the meta model, in the words `octopipe estimate` refuses a model without
    experts with. A dense model (or a MoE family's config whose every layer is dense) would
    otherwise run EP as plain data parallelism and report the EP asked for."""
    if ep <= 1:
        return
    if recipe.expert_tp_plan is None:
        raise InputError("--ep", f"{recipe.name} has no experts OctoPipe can divide")
    from octopipe.runtime.parallel.experts import _check_count

    counts = expert_counts(recipe.meta_model)
    if not counts:
        raise InputError("--ep", f"{recipe.name} has no MoE experts to spread over {ep} ranks")
    for fqn, count in counts.items():
        _check_count(fqn, count, ep)


def expert_counts(model: nn.Module) -> dict[str, int]:
    """The routed experts of each MoE layer `apply_ep` divides, by the layer's FQN: OctoPipe's
    bundled `MoE` blocks and transformers' fused 3-D expert weights."""
    from octopipe.models.feedforward import MoE
    from octopipe.runtime.parallel.experts import _is_fused

    counts = {}
    for fqn, block in model.named_modules():
        inner = getattr(block, "experts", None)
        if isinstance(block, MoE):
            counts[fqn] = len(block.experts)
        elif isinstance(inner, nn.Module) and _is_fused(inner):
            counts[f"{fqn}.experts"] = inner.gate_up_proj.shape[0]
    return counts


@dataclass(frozen=True)
class Job:
    """A plan and how to train it; the config's shape takes the plan's PP and microbatch
    count, so that on the ranks `config.shape` says which global rank runs what
    (docs/FORMATS.md, plan `parallelism`)."""

    plan: Plan
    config: RunConfig
    source: str = "<plan>"  # where the plan came from, for error messages

    def __post_init__(self) -> None:
        shape, plan = self.config.shape, self.plan
        if (shape.pp, shape.num_microbatches) != (plan.num_devices, plan.num_microbatches):
            shape = replace(shape, pp=plan.num_devices, num_microbatches=plan.num_microbatches)
            object.__setattr__(self, "config", replace(self.config, shape=shape))
