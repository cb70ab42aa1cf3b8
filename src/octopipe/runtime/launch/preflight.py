"""The settings of a run that are refused before any rank starts, one line each: numbers out
of range, combinations not built yet, a tensor-parallel plan that does not fit the model, a
checkpoint that cannot be resumed.

Each would otherwise fail late, inside every rank at once (a timeout of 0 or inf, an optimizer
refusing its learning rate), or not at all: a nan learning rate trains nan weights.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from octopipe.errors import InputError
from octopipe.limits import (
    MAX_EVAL_BATCHES,
    MAX_MICROBATCH_TOKENS,
    MAX_PROCESSES,
    MAX_RATE,
    MAX_SECONDS,
    MAX_STEPS,
    MIN_TIMEOUT_S,
    check_microbatch_tokens,
)

if TYPE_CHECKING:
    from octopipe.runtime.job.session import RunConfig
    from octopipe.runtime.model.recipe import ModelRecipe


def check_run_settings(
    *,
    nproc: int | None,
    steps: int,
    timeout: float,
    lr: float,
    momentum: float,
    weight_decay: float,
    min_lr: float = 0.0,
    warmup_steps: int = 0,
    clip_norm: float | None = None,
    checkpoint_dir: object = None,
    checkpoint_every: int = 0,
    resume: bool = False,
    keep_last: int = 0,
    val_data: object = None,
    eval_every: int = 0,
    eval_batches: int = 1,
    peak_tflops: float | None = None,
) -> None:
    if nproc is not None and not 1 <= nproc <= MAX_PROCESSES:
        raise InputError("--nproc", f"must be 1 to {MAX_PROCESSES:,}, got {nproc}")
    if not 1 <= steps <= MAX_STEPS:
        raise InputError("--steps", f"must be 1 to {MAX_STEPS:,}, got {steps}")
    if not (math.isfinite(timeout) and MIN_TIMEOUT_S <= timeout <= MAX_SECONDS):
        raise InputError(
            "--timeout",
            f"must be {MIN_TIMEOUT_S:g} to {MAX_SECONDS:g} seconds, got {timeout}",
        )
    for flag, value in (
        ("--lr", lr),
        ("--weight-decay", weight_decay),
        ("--min-lr", min_lr),
    ):
        if not (math.isfinite(value) and 0 <= value <= MAX_RATE):
            raise InputError(flag, f"must be a finite number from 0 to {MAX_RATE:g}, got {value}")
    if not (math.isfinite(momentum) and 0 <= momentum < 1):
        raise InputError("--momentum", f"must be in [0, 1), got {momentum}")
    if min_lr > lr:
        raise InputError("--min-lr", f"{min_lr} is above --lr {lr}: the cosine would rise")
    if clip_norm is not None and not (math.isfinite(clip_norm) and 0 < clip_norm <= MAX_RATE):
        raise InputError("--clip-norm", f"must be a positive number, got {clip_norm}")
    for flag, count in (
        ("--lr-warmup", warmup_steps),
        ("--checkpoint-every", checkpoint_every),
        ("--keep-last", keep_last),
        ("--eval-every", eval_every),
    ):
        if not 0 <= count <= MAX_STEPS:
            raise InputError(flag, f"must be 0 to {MAX_STEPS:,}, got {count}")
    if not 1 <= eval_batches <= MAX_EVAL_BATCHES:
        raise InputError("--eval-batches", f"must be 1 to {MAX_EVAL_BATCHES:,}, got {eval_batches}")
    if peak_tflops is not None and not (math.isfinite(peak_tflops) and 0 < peak_tflops <= 1e6):
        raise InputError("--peak-tflops", f"must be a positive number, got {peak_tflops}")
    if (checkpoint_every or resume) and checkpoint_dir is None:
        flag = "--resume" if resume else "--checkpoint-every"
        raise InputError(flag, "needs --checkpoint-dir")
    if keep_last and not checkpoint_every:
        raise InputError("--keep-last", "needs --checkpoint-every (and --checkpoint-dir)")
    if eval_every and val_data is None:
        raise InputError("--eval-every", "needs --val-data (the held-out tokens)")
    if checkpoint_dir is not None:
        from octopipe.runtime.checkpoint.folder import check_folder

        check_folder(checkpoint_dir)


def check_overlap(config: RunConfig) -> None:
    """What overlapped steps do not combine with yet, refused in one line."""
    if not config.overlap_steps:
        return
    for flag, used in (
        ("--zero", config.zero),
        ("--checkpoint-every", config.checkpoint_every),
        ("--resume", config.resume),
        ("--val-data", config.val_data is not None),
    ):
        if used:
            raise InputError(flag, "not supported with --overlap-steps yet")


def check_parallelism(config: RunConfig, recipe: ModelRecipe) -> None:
    """Tensor parallelism needs a plan that applies to the model; neither it nor FSDP2 (`--zero
    3`) combines with every other setting yet."""
    if config.zero not in (0, 1, 3):
        raise InputError("--zero", f"must be 0, 1 or 3, got {config.zero}")
    if config.tp == 1:
        return
    if config.zero == 1:
        raise InputError("--zero", "1 is not supported with --tp > 1 yet; use --zero 3 (FSDP2)")
    if recipe.tp_plan is None:
        raise InputError(
            "--tp",
            f"{recipe.name} has no tensor-parallel plan: give the model a tp_plan "
            "(docs/FORMATS.md, tensor parallelism) or run it with --tp 1",
        )
    if config.seq_len % config.tp:
        raise InputError(
            "--seq-len",
            f"{config.seq_len} tokens do not split into {config.tp} equal shares "
            "(tensor parallelism splits the sequence between layers)",
        )
    from octopipe.runtime.parallel.tensor_parallel import check_plan

    check_plan(recipe.tp_plan(config.tp), recipe.meta_model)


def check_resumable(config: RunConfig, recipe: ModelRecipe) -> RunConfig:
    """The config with the checkpoint to resume chosen (the newest complete one; damaged newer
    ones are skipped with a warning), which must be of this model, seed and optimizer, and
    before the run's last step."""
    if not (config.resume and config.checkpoint_dir):
        return config
    from octopipe.runtime.checkpoint.folder import choose, model_identity
    from octopipe.runtime.checkpoint.store import check_compatible

    found = choose(config.checkpoint_dir)
    if found is None:
        return config
    check_compatible(
        found,
        recipe.layers,
        recipe.meta_model,
        seed=config.seed,
        optimizer=config.optimizer.name,
        model_id=model_identity(config.model),
    )
    if found.step >= config.steps:
        raise InputError(
            "--steps", f"{found.path} is at step {found.step}; --steps {config.steps} is done"
        )
    return replace(config, resume_checkpoint=str(found.path))


def check_checkpoint_room(config: RunConfig, recipe: ModelRecipe) -> None:
    """A run that will write checkpoints has room for one before it starts."""
    if not (config.checkpoint_every and config.checkpoint_dir):
        return
    from octopipe.runtime.checkpoint.folder import check_room, checkpoint_bytes

    optimizer = config.optimizer
    nbytes = checkpoint_bytes(recipe.meta_model, optimizer.name, optimizer.momentum)
    check_room(config.checkpoint_dir, nbytes)


def check_first_batch(config: RunConfig, recipe: ModelRecipe, plan) -> None:
    """The data is read for its first step before any rank starts: ids beyond the model's
    vocabulary (a wrong --data-dtype, a file of another tokenizer), a batch of Python's of the
    wrong form or size are one line here, not an error in a rank. Later steps are checked by
    the ranks as they read them."""
    from octopipe.runtime.data.batches import GivenBatches

    for data, needed, what in (
        (config.data, config.steps, f"a run of {config.steps} steps"),
        (config.val_data, config.eval_batches, f"--eval-batches {config.eval_batches}"),
    ):
        if isinstance(data, GivenBatches):
            data.check_length(needed, what)
    if config.data is not None:  # a token file, or batches from Python
        config.data_source(recipe).global_batch(0, config.global_sequences(plan))
    if config.val_data is not None:  # any source: its vocabulary check is in val_source
        config.val_source(recipe).global_batch(0, config.global_sequences(plan))


def check_sizes(config: RunConfig) -> None:
    """What every rank allocates per microbatch, bounded before any starts (docs/FORMATS.md,
    Limits)."""
    check_microbatch_tokens(config.seq_len, config.micro_batch_size, MAX_MICROBATCH_TOKENS)


def check_local_processes(nproc: int) -> None:
    """Ranks spawned on this host (under torchrun, the job's own business)."""
    if not 1 <= nproc <= MAX_PROCESSES:
        raise InputError(
            "--nproc",
            f"{nproc:,} processes (the plan's devices x --dp); 1 to {MAX_PROCESSES:,} "
            "start on one host",
        )
