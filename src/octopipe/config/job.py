"""The training job's settings: one frozen dataclass per section, one `setting` per field.

This is the only place a setting of `octopipe run` is spelled. `run`'s flags, the `--config`
job file's keys (`[section] name = value`), `octopipe.run`'s keywords and the settings table
of docs/FORMATS.md are read off these classes (`octopipe.config.sources`, `.docs`).
Cross-setting rules (a cosine ending above the peak, checkpoints without a folder) are
`JobConfig.check`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from octopipe.config.fields import Setting, setting, settings_of
from octopipe.errors import InputError
from octopipe.limits import (
    DEFAULT_TIMEOUT_S,
    MAX_EVAL_BATCHES,
    MAX_GLOBAL_BATCH,
    MAX_MICRO_BATCH_SIZE,
    MAX_PARALLEL_DEGREE,
    MAX_PROCESSES,
    MAX_RATE,
    MAX_SECONDS,
    MAX_SEED,
    MAX_SEQ_LEN,
    MAX_STEPS,
    MIN_TIMEOUT_S,
)
from octopipe.plan.shape import ZERO_STAGES


@dataclass(frozen=True)
class PlanSection:
    file: str | None = setting(None, "plan.json (octopipe.plan/1) to run", flag="--plan")


@dataclass(frozen=True)
class ModelSection:
    name: str | None = setting(
        None,
        "the model: a bundled model's name or a config.json; `run` also takes hf:PATH (a "
        "transformers config) and module:factory (a function returning an nn.Module)",
        flag="--model",
        keyword="model",
    )
    seed: int = setting(0, "seed of the weights and the data", flag="--seed", low=0, high=MAX_SEED)


@dataclass(frozen=True)
class DataSection:
    path: str | None = setting(
        None,
        "flat file of little-endian token ids (nanoGPT style), or prepare-data's folder (its "
        "train.bin); default: synthetic data",
        flag="--data",
        keyword="data",
    )
    dtype: str | None = setting(
        None,
        "the token files' id type (default: what the meta.json beside the file says, else uint16)",
        flag="--data-dtype",
        choices=("uint16", "uint32"),
    )
    seq_len: int | None = setting(
        None,
        "tokens per sequence (default: what the plan was made for, its profile's; else 4096 to "
        "plan or price, 32 to run)",
        flag="--seq-len",
        low=1,
        high=MAX_SEQ_LEN,
    )
    micro_batch_size: int | None = setting(
        None,
        "sequences per microbatch (default: what the plan was made for, its parallelism or "
        "profile key; else 1 to plan or price, 2 to run)",
        flag="--micro-batch-size",
        low=1,
        high=MAX_MICRO_BATCH_SIZE,
    )
    global_batch: int | None = setting(
        None,
        "sequences (of --seq-len tokens) per optimizer step over all replicas: DP x "
        "microbatches x the microbatch size, times the passes accumulated (default: one pass "
        "of the plan; with no plan yet, 512); `run` accumulates gradients over a multiple of "
        "one pass",
        flag="--global-batch",
        low=1,
        high=MAX_GLOBAL_BATCH,
    )


@dataclass(frozen=True)
class TrainingSection:
    steps: int = setting(
        3,
        "the run's last step: training steps, or where a resumed run stops",
        flag="--steps",
        low=1,
        high=MAX_STEPS,
    )
    bf16: bool = setting(False, "forwards under torch.autocast to bfloat16", flag="--bf16")
    overlap_steps: bool = setting(
        False,
        "no barrier between steps: each stage updates right after its last backward, clipping "
        "and the non-finite check validated afterwards (a failed step is redone)",
        flag="--overlap-steps",
    )


@dataclass(frozen=True)
class ParallelismSection:
    dp: int | None = setting(
        None,
        "data-parallel replicas of the plan (default: the plan's parallelism.dp; else 1 to run, "
        "the GPUs left to price)",
        flag="--dp",
        low=1,
        high=MAX_PARALLEL_DEGREE,
    )
    tp: int | None = setting(
        None,
        "tensor-parallel ranks per pipeline device (default: the plan's parallelism.tp, else "
        "1); ranks numbered as docs/FORMATS.md's plan `parallelism` says",
        flag="--tp",
        low=1,
        high=MAX_PARALLEL_DEGREE,
    )
    cp: int | None = setting(
        None,
        "context parallelism: each sequence divided over this many ranks per pipeline device "
        "(ring attention; default: the plan's parallelism.cp, else 1)",
        flag="--cp",
        low=1,
        high=MAX_PARALLEL_DEGREE,
    )
    ep: int | None = setting(
        None,
        "expert parallelism: each MoE layer's routed experts divided over this many of a "
        "device's TP x CP x DP ranks, tokens sent by all-to-all (default: the plan's "
        "parallelism.ep, else 1)",
        flag="--ep",
        low=1,
        high=MAX_PARALLEL_DEGREE,
    )
    zero: int | None = setting(
        None,
        "the ZeRO stage over the DP x CP ranks: 1 the optimizer state sharded (the distributed "
        "optimizer), 2 also the gradients, 3 also the weights (FSDP; held across microbatches "
        "under PP); 0 neither. `run` runs 0, 1 and 3 (FSDP2) (default: the plan's "
        "parallelism.zero, else 0)",
        flag="--zero",
        choices=ZERO_STAGES,
    )


@dataclass(frozen=True)
class OptimizerSection:
    name: str = setting(
        "adamw",
        "optimizer of every stage",
        flag="--optimizer",
        keyword="optimizer",
        choices=("sgd", "adam", "adamw"),
    )
    lr: float = setting(3e-4, "the peak learning rate", flag="--lr", low=0, high=MAX_RATE)
    momentum: float = setting(
        0.0, "SGD momentum, in [0, 1)", flag="--momentum", low=0, high=1, open_high=True
    )
    weight_decay: float = setting(0.0, "weight decay", flag="--weight-decay", low=0, high=MAX_RATE)
    clip_norm: float | None = setting(
        None,
        "clip gradients to this global norm (all stages, replicas)",
        flag="--clip-norm",
        low=0,
        high=MAX_RATE,
        open_low=True,
    )


@dataclass(frozen=True)
class LRScheduleSection:
    warmup_steps: int | None = setting(
        None,
        "steps of linear learning-rate warm-up (default: a tenth of the steps)",
        flag="--lr-warmup",
        keyword="warmup_steps",
        low=0,
        high=MAX_STEPS,
    )
    decay: str = setting(
        "cosine",
        "after warm-up: constant, or cosine down to the minimum at the run's last step",
        flag="--lr-decay",
        keyword="decay",
        choices=("constant", "cosine"),
    )
    min_lr: float | None = setting(
        None,
        "where the cosine ends, at most the peak (default: a tenth of the peak)",
        flag="--min-lr",
        low=0,
        high=MAX_RATE,
    )

    def warmup(self, steps: int) -> int:
        """The warm-up steps of a run of `steps` steps."""
        return steps // 10 if self.warmup_steps is None else self.warmup_steps

    def floor(self, peak: float) -> float:
        """Where the cosine ends under the peak learning rate `peak`."""
        return peak / 10 if self.min_lr is None else self.min_lr


@dataclass(frozen=True)
class CheckpointSection:
    dir: str | None = setting(None, "write checkpoints here (DIR/step-N)", flag="--checkpoint-dir")
    every: int = setting(
        0,
        "save after every N steps (0: never)",
        flag="--checkpoint-every",
        low=0,
        high=MAX_STEPS,
    )
    keep_last: int = setting(
        0,
        "after each save, keep only the newest K checkpoints in the folder (0: all)",
        flag="--keep-last",
        low=0,
        high=MAX_STEPS,
    )
    resume: str = setting(
        "no",
        "continue from the newest intact checkpoint in the folder (any plan, any --dp): `yes` "
        "(the flag alone; true in a job file) starts from step 0 with a warning when there is "
        "none, `require` refuses then; `no` (false) starts from step 0",
        flag="--resume",
        choices=("no", "yes", "require"),
        flag_const="yes",
        aliases=((True, "yes"), (False, "no")),
    )


@dataclass(frozen=True)
class EvaluationSection:
    data: str | None = setting(
        None,
        "held-out token file (as --data), or prepare-data's folder (its val.bin): its loss and "
        "perplexity after every N steps and after the last",
        flag="--val-data",
    )
    every: int = setting(
        0,
        "evaluate on the held-out data after every N steps (0: after the last step only)",
        flag="--eval-every",
        low=0,
        high=MAX_STEPS,
    )
    batches: int = setting(
        4,
        "global batches of held-out data per evaluation (the same ones each time)",
        flag="--eval-batches",
        low=1,
        high=MAX_EVAL_BATCHES,
    )


@dataclass(frozen=True)
class LoggingSection:
    dir: str | None = setting(
        None,
        "write DIR/log.jsonl (every step's JSON line) and TensorBoard event files (with the "
        "tensorboard package: pip install 'octopipe[logs]')",
        flag="--log-dir",
    )
    json: bool = setting(
        False,
        "print one JSON line per step as it finishes, then the summary object (last line)",
        flag="--json",
    )
    trace: str | None = setting(
        None, "write a Chrome/Perfetto trace of every rank's actions here", flag="--trace"
    )
    png: str | None = setting(
        None, "draw the last step's measured timeline here (.png or .svg)", flag="--png"
    )
    profile: str | None = setting(
        None,
        "the profile the plan was made from: the picture then sets the measured timeline above "
        "the predicted one, on one time axis",
        flag="--profile",
    )
    peak_tflops: float | None = setting(
        None,
        "one rank's dense peak TFLOP/s, for MFU (default: an A100/H100/H200/H800's BF16 peak by "
        "the GPU's name; none on a CPU)",
        flag="--peak-tflops",
        low=0,
        high=MAX_RATE,
        open_low=True,
    )


@dataclass(frozen=True)
class LaunchSection:
    nproc: int | None = setting(
        None,
        "processes to spawn (default: TP x the plan's devices x DP; ignored under torchrun)",
        flag="--nproc",
        low=1,
        high=MAX_PROCESSES,
    )
    backend: str = setting(
        "auto",
        "auto: NCCL when each rank can have its own GPU, else gloo on CPU",
        flag="--backend",
        choices=("auto", "gloo", "nccl"),
    )
    timeout: float = setting(
        DEFAULT_TIMEOUT_S,
        "seconds one wait of a rank (a transfer, a collective) may take before the run fails; "
        "the whole run has no deadline",
        flag="--timeout",
        low=MIN_TIMEOUT_S,
        high=MAX_SECONDS,
    )
    init_method: str = setting(
        "env://",
        "under torchrun: how ranks meet (env://; file:///shared/path also works)",
        flag="--init-method",
    )
    lookahead: int = setting(
        8, "actions ahead whose receives are posted early", flag="--lookahead", low=1, high=10**6
    )


@dataclass(frozen=True)
class JobConfig:
    """Every setting of a training job, by section (docs/FORMATS.md, "The job config")."""

    plan: PlanSection = field(default_factory=PlanSection)
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    training: TrainingSection = field(default_factory=TrainingSection)
    parallelism: ParallelismSection = field(default_factory=ParallelismSection)
    optimizer: OptimizerSection = field(default_factory=OptimizerSection)
    lr_schedule: LRScheduleSection = field(default_factory=LRScheduleSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    evaluation: EvaluationSection = field(default_factory=EvaluationSection)
    logging: LoggingSection = field(default_factory=LoggingSection)
    launch: LaunchSection = field(default_factory=LaunchSection)

    def check(self, *, val_data_given: bool = False) -> JobConfig:
        """The rules between settings, each refused in one line naming a flag; returns self.
        `val_data_given`: held-out data came from code (`octopipe.run(val_data=...)`)."""
        opt, lr, ckpt, ev = self.optimizer, self.lr_schedule, self.checkpoint, self.evaluation
        if lr.min_lr is not None and lr.min_lr > opt.lr:
            raise InputError(
                "--min-lr", f"{lr.min_lr} is above --lr {opt.lr}: the cosine would rise"
            )
        resume = ckpt.resume != "no"
        if (ckpt.every or resume) and ckpt.dir is None:
            raise InputError(
                "--resume" if resume else "--checkpoint-every", "needs --checkpoint-dir"
            )
        if ckpt.keep_last and not ckpt.every:
            raise InputError("--keep-last", "needs --checkpoint-every (and --checkpoint-dir)")
        if ev.every and ev.data is None and not val_data_given:
            raise InputError("--eval-every", "needs --val-data (the held-out tokens)")
        return self


SECTIONS: dict[str, type] = {f.name: f.default_factory for f in fields(JobConfig)}  # type: ignore[misc]


def all_settings() -> list[Setting]:
    """Every setting of the job config, section by section, in declaration order."""
    return [s for name, cls in SECTIONS.items() for s in settings_of(name, cls)]
