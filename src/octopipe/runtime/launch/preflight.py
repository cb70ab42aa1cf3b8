"""The settings of a run that are refused before any rank starts, one line each: combinations
not built yet, a tensor-parallel plan that does not fit the model, a checkpoint that cannot be
resumed. (Each setting's own range is the job config's to check: `octopipe.config`.)

Each would otherwise fail late, inside every rank at once, or not at all.
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from octopipe.errors import InputError, OctoPipeWarning
from octopipe.limits import (
    MAX_MICROBATCH_TOKENS,
    MAX_PROCESSES,
    check_microbatch_tokens,
)

if TYPE_CHECKING:
    from octopipe.plan import Plan
    from octopipe.runtime.job.run_config import RunConfig
    from octopipe.runtime.model.recipe import ModelRecipe


def check_overlap(config: RunConfig) -> None:
    """What overlapped steps do not combine with yet, refused in one line."""
    if not config.stepping.overlap_steps:
        return
    for flag, used in (  # --zero's is the shape's rule (`engines.octopipe.shape_refusal`)
        ("--checkpoint-every", config.checkpoint.every),
        ("--resume", config.checkpoint.resume),
        ("--val-data", config.evaluation.data is not None),
    ):
        if used:
            raise InputError(flag, "not supported with --overlap-steps yet")


def check_fp8(config: RunConfig) -> None:
    """A plan priced in FP8 trains so (`runtime/model/fp8.py`): refused in one line without
    torchao or on a GPU without FP8 GEMMs; on a CPU it runs emulated, said in one line."""
    if not config.stepping.fp8:
        return
    from octopipe.runtime.model.fp8 import fp8_support, require_torchao

    require_torchao()
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    why = fp8_support(device)
    if why is not None and device.type == "cuda":
        raise InputError("plan.json", f"profile.precision: the plan was priced in FP8; {why}")
    if why is not None:
        warnings.warn(f"plan.json was priced in FP8; {why}", OctoPipeWarning, stacklevel=2)


def check_parallelism(config: RunConfig, recipe: ModelRecipe, plan: Plan) -> None:
    """What `octopipe run` does not run of the job's shape (`engines.octopipe.shape_refusal`,
    the rules the layout search keeps to); tensor parallelism needs a plan that applies to the
    model and a sequence it splits."""
    from octopipe.engines.octopipe import shape_refusal

    precision = "fp8" if config.stepping.fp8 else "bf16"
    refusal = shape_refusal(config.shape, config.stepping.overlap_steps, precision)
    if refusal is not None:
        raise InputError(refusal.flag, refusal.why)
    if config.shape.tp == 1:
        return
    if recipe.tp_plan is None:
        raise InputError(
            "--tp",
            f"{recipe.name} has no tensor-parallel plan: give the model a tp_plan "
            "(docs/FORMATS.md, tensor parallelism) or run it with --tp 1",
        )
    if config.seq_len % config.shape.tp:
        raise InputError(
            "--seq-len",
            f"{config.seq_len} tokens do not split into {config.shape.tp} equal shares "
            "(tensor parallelism splits the sequence between layers)",
        )
    from octopipe.runtime.parallel.tensor_parallel import check_plan

    check_plan(recipe.tp_plan(config.shape.tp), recipe.meta_model)


def check_resumable(config: RunConfig, recipe: ModelRecipe) -> RunConfig:
    """The config with the checkpoint to resume chosen (the newest complete one; damaged newer
    ones are skipped with a warning), which must be of this model, seed and optimizer, and
    before the run's last step."""
    if not (config.checkpoint.resume and config.checkpoint.dir):
        return config
    from octopipe.runtime.checkpoint.folder import choose, model_identity
    from octopipe.runtime.checkpoint.store import check_compatible

    found = choose(config.checkpoint.dir)
    if found is None:
        where = f"no checkpoint in {config.checkpoint.dir} (no step-K folder)"
        if config.checkpoint.required:
            raise InputError("--resume", f"require: {where}")
        warnings.warn(f"--resume: {where}; starting from step 0", OctoPipeWarning, stacklevel=2)
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
    return replace(config, checkpoint=replace(config.checkpoint, chosen=str(found.path)))


def check_checkpoint_room(config: RunConfig, recipe: ModelRecipe) -> None:
    """A run that will write checkpoints has room for one before it starts."""
    if not (config.checkpoint.every and config.checkpoint.dir):
        return
    from octopipe.runtime.checkpoint.folder import check_room, checkpoint_bytes

    optimizer = config.optimizer
    nbytes = checkpoint_bytes(recipe.meta_model, optimizer.name, optimizer.momentum)
    check_room(config.checkpoint.dir, nbytes)


def check_first_batch(config: RunConfig, recipe: ModelRecipe, plan) -> None:
    """The data is read for its first step before any rank starts: ids beyond the model's
    vocabulary (a wrong --data-dtype, a file of another tokenizer), a batch of Python's of the
    wrong form or size are one line here, not an error in a rank. Later steps are checked by
    the ranks as they read them."""
    from octopipe.runtime.data.batches import GivenBatches

    for data, needed, what in (
        (config.data, config.steps, f"a run of {config.steps} steps"),
        (
            config.evaluation.data,
            config.evaluation.batches,
            f"--eval-batches {config.evaluation.batches}",
        ),
    ):
        if isinstance(data, GivenBatches):
            data.check_length(needed, what)
    if config.data is not None:  # a token file, or batches from Python
        config.data_source(recipe).global_batch(0, config.global_sequences(plan))
    if config.evaluation.data is not None:  # any source: its vocabulary check is in val_source
        config.val_source(recipe).global_batch(0, config.pass_sequences(plan))


def check_sizes(config: RunConfig) -> None:
    """What every rank allocates per microbatch, bounded before any starts (docs/FORMATS.md,
    Limits)."""
    check_microbatch_tokens(config.seq_len, config.shape.microbatch_size, MAX_MICROBATCH_TOKENS)


def check_local_processes(nproc: int) -> None:
    """Ranks spawned on this host (under torchrun, the job's own business)."""
    if not 1 <= nproc <= MAX_PROCESSES:
        raise InputError(
            "--nproc",
            f"{nproc:,} processes (the plan's devices x --dp); 1 to {MAX_PROCESSES:,} "
            "start on one host",
        )
