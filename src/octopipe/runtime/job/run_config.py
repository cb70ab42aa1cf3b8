"""What a rank is told of its job: the plan, the model, and every setting resolved against the
plan (`RunConfig`), built by `octopipe.training.runtime_config` from the job config.

The user's settings are spelled once, in `octopipe.config`; `RunConfig.settings` carries them
whole to every rank. Its other fields are what the ranks use, resolved: degrees and sizes from
the plan where not given, data as sources, the optimizer built, and test-only switches.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from octopipe.config import JobConfig
from octopipe.plan import JobShape, Plan
from octopipe.plan.shape import DEFAULT_RANK_ORDER
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
class RunConfig:
    """How to train a plan; identical on every rank."""

    model: ModelSpec  # a bundled name, config.json, `hf:PATH`, `module:factory`, or a factory
    seed: int = 0  # weights and data
    steps: int = 1
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    lookahead: int = 8  # how many actions ahead receives are posted
    collect_state: bool = False  # return every parameter and its last gradient (tests, fuzzing)
    order_matched: bool = (
        False  # gloo: match transfers by order on a group per channel, as NCCL must
    )
    seq_len: int = DEFAULT_SEQ_LEN  # tokens per sequence of the synthetic data or --data
    micro_batch_size: int = DEFAULT_MICRO_BATCH_SIZE  # sequences per microbatch
    dp: int = 1  # data-parallel replicas of the plan
    zero: int = 0  # 1: optimizer state sharded across the replicas (ZeRO-1); 3: FSDP2
    tp: int = 1  # tensor-parallel ranks per pipeline device
    cp: int = 1  # context parallelism: each sequence divided over this many ranks per device
    ep: int = 1  # expert parallelism: each MoE layer's experts over this many of a device's ranks
    data: DataSource | None = None  # None: the model's synthetic sequences
    loss: Loss | None = None  # None: the model's loss (next-token cross-entropy by default)
    reduce_at_end: bool = False  # all-reduces after the last action, not each stage's last B/W
    autocast: str | None = None  # "bf16": forwards under torch.autocast to bfloat16
    checkpoint_dir: str | None = None  # where DIR/step-N checkpoints go
    checkpoint_every: int = 0  # save after every this many steps (0: never)
    resume: bool = False  # start from the latest checkpoint in checkpoint_dir, if any
    resume_required: bool = False  # `--resume=require`: no checkpoint to resume is refused
    resume_checkpoint: str | None = None  # the one chosen before the ranks start (preflight)
    resume_at_start: bool = False  # an earlier job of the launch writes it: choose at the start
    overlap_steps: bool = False  # no barrier between steps; post-validated per-stage updates
    val_data: DataSource | None = None  # held-out sequences to evaluate on (`evaluate.py`)
    eval_every: int = 0  # evaluate after every this many steps (0: after the last only)
    eval_batches: int = 4  # global batches of held-out data per evaluation
    keep_last: int = 0  # checkpoints kept in checkpoint_dir after each save (0: all)
    peak_flops: float | None = None  # one rank's dense peak FLOP/s for MFU (None: its GPU's)
    accumulation: int = 1  # pipeline passes (of D x M x b sequences) per optimizer step
    # The user's settings as given (`octopipe.config`), whole; the fields above are those the
    # ranks use, resolved against the plan. Read a new setting from here.
    settings: JobConfig = field(default_factory=JobConfig)

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return {None: None, "bf16": torch.bfloat16}[self.autocast]

    def recipe(self) -> ModelRecipe:
        return load_recipe(self.model)

    def data_source(self, recipe: ModelRecipe) -> DataSource:
        if self.data is not None:
            return self.data.for_vocabulary(vocabulary_size(recipe))
        return SyntheticData(recipe.synthetic_sequence, self.seq_len, self.seed)

    def val_source(self, recipe: ModelRecipe) -> DataSource | None:
        return (
            None if self.val_data is None else self.val_data.for_vocabulary(vocabulary_size(recipe))
        )

    def global_sequences(self, plan: Plan) -> int:
        """Sequences per step, over all replicas: D x M x b, times the passes accumulated."""
        return self.pass_sequences(plan) * self.accumulation

    def pass_sequences(self, plan: Plan) -> int:
        """Sequences of one pass of the plan over all replicas: D x M x b."""
        return self.dp * plan.num_microbatches * self.micro_batch_size

    def layout(self, plan: Plan) -> JobShape:
        """The job's shape: which global rank runs what (docs/FORMATS.md, plan `parallelism`),
        in the plan's rank order."""
        return JobShape(
            self.tp,
            plan.num_devices,
            self.dp,
            self.micro_batch_size,
            plan.num_microbatches,
            cp=self.cp,
            ep=self.ep,
            zero=self.zero,
            rank_order=plan.shape.rank_order if plan.shape is not None else DEFAULT_RANK_ORDER,
        )


@dataclass(frozen=True)
class Job:
    plan: Plan
    config: RunConfig
    source: str = "<plan>"  # where the plan came from, for error messages
