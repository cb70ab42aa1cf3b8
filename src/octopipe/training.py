"""`octopipe.run`: train a plan on torch.distributed from Python, with the job config's settings.

    import octopipe as op
    from octopipe.config import JobConfig

    result = op.run(plan, "tiny-llama", steps=5, lr=3e-4)     # keywords: one setting each
    result = op.run(plan, JobConfig(...), steps=10)            # a whole config, keywords on top
    result = op.run(None, from_file("job.toml"))               # the job file names the plan too

Every keyword that is a setting is the job config's (`octopipe.config`, docs/FORMATS.md "The
job config"); the rest are what only code can give: a factory for the model, data as objects,
a loss function, callbacks. This module resolves them into the ranks' `RunConfig` and launches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from octopipe.config import JobConfig

if TYPE_CHECKING:
    from octopipe.plan import JobShape, Plan
    from octopipe.runtime.job.progress import RunNote, StepReport
    from octopipe.runtime.job.result import RunResult
    from octopipe.runtime.job.run_config import RunConfig


def run(
    plan: Plan | str | Path | None,
    model: Any = None,
    *,
    data: Any = None,
    val_data: Any = None,
    loss: Callable | None = None,
    on_step: Callable[[StepReport], None] | None = None,
    on_note: Callable[[RunNote], None] | None = None,
    where: str | None = None,
    **settings: Any,
) -> RunResult | None:
    """Train `model` with `plan` on spawned processes (one per rank: TP x devices x DP; gloo on
    CPU, NCCL with a GPU per rank) and return what was measured: losses, per-action records,
    iteration time, peak memory.

    `plan`: a `Plan`, a plan.json path, or None for the config's `plan.file`. `model`: a
    `JobConfig`, or what `--model` names (a bundled name, a config.json, `hf:PATH`,
    `module:factory`), or a factory (a picklable function returning an `nn.Module`).
    `settings`: the job config's keywords (`steps=`, `lr=`, `checkpoint_dir=`, ...: the
    `keyword` column of docs/FORMATS.md's settings table), over the config's values.
    `data` and `val_data`: a token file's path (a setting), a
    `octopipe.runtime.data.batches.DataSource`, or the global batches themselves (a list, or
    any iterable, of `(inputs, targets)` holding dp x M x b sequences each). `loss(outputs,
    target)`: None for the model's own (next-token cross-entropy by default).

    `on_step(report)` is called with every step's `StepReport` (loss, learning rate, gradient
    norm, step time, tokens/s, MFU, held-out loss) as the steps finish, where the result comes
    back; `on_note(note)` with each `RunNote` saying what the run is doing (start-up stages,
    checkpoints saved and resumed).

    Inside a torchrun job this process is one rank instead (ranks meet by
    `launch.init_method`) and only rank 0 gets the result (the others None). A failing rank
    raises `octopipe.runtime.failures.RankFailure` (a loss turned nan or inf: its
    `NonFiniteLoss`); SIGTERM or Ctrl-C stops every spawned rank and raises `Stopped` (a
    KeyboardInterrupt)."""
    from octopipe.config.sources import from_keywords
    from octopipe.runtime.job.run_config import Job
    from octopipe.runtime.launch.launcher import execute

    config = model if isinstance(model, JobConfig) else JobConfig()
    model_spec = config.model.name if isinstance(model, JobConfig) else model
    for keyword, given in (("data", data), ("val_data", val_data)):
        if isinstance(given, str | Path):
            settings[keyword] = given
    config = from_keywords(config, **settings)
    if model_spec is None:
        model_spec = config.model.name
    plan, where = _the_plan(plan, config, where)
    objects = {"data": _object(data), "val_data": _object(val_data)}
    config.check(val_data_given=objects["val_data"] is not None)
    run_config = runtime_config(config, plan, model_spec, loss=loss, **objects)
    results = execute(
        [Job(plan, run_config, where)],
        config.launch.nproc or run_config.shape.world_size,
        config.launch.backend,
        config.launch.timeout,
        config.launch.init_method,
        _reports_to(on_step, on_note),
    )
    return None if results is None else results[0]


def runtime_config(
    config: JobConfig, plan: Plan, model: Any, *, data=None, val_data=None, loss=None
) -> RunConfig:
    """What every rank gets: the job's settings resolved against the plan (degrees, sequence
    length and microbatch size it was made for), the data as sources, the optimizer built.
    Refuses here, before any rank starts, what cannot run."""
    from octopipe.errors import InputError
    from octopipe.runtime.job.run_config import Checkpointing, Evaluating, RunConfig, Stepping
    from octopipe.runtime.step.optim import OptimizerConfig

    if model is None:
        raise InputError("--model", "must be given (--model, [model] name in --config, or model=)")
    _check_loss(loss)
    if callable(model):
        _check_picklable("model", model)
    if config.checkpoint.dir is not None:
        from octopipe.runtime.checkpoint.folder import check_folder

        check_folder(config.checkpoint.dir)
    t, opt, sched = config.training, config.optimizer, config.lr_schedule
    seq_len, micro_batch_size = run_shape(plan, config.data.seq_len, config.data.micro_batch_size)
    seed, dtype = config.model.seed, config.data.dtype
    shape = run_job_shape(config, plan, seq_len, micro_batch_size)
    return RunConfig(
        model,
        seed,
        t.steps,
        OptimizerConfig(
            opt.name,
            opt.lr,
            opt.momentum if opt.name == "sgd" else 0.0,
            opt.weight_decay,
            sched.warmup(t.steps),
            sched.decay,
            sched.floor(opt.lr),
            t.steps,
            opt.clip_norm,
        ),
        seq_len=seq_len,
        shape=shape,
        data=_data_source(
            data if data is not None else config.data.path, seq_len, seed, dtype, t.steps
        ),
        loss=loss,
        stepping=Stepping(
            config.launch.lookahead,
            autocast="bf16" if t.bf16 else None,
            fp8=plan.made_for_value("precision") == "fp8",
            overlap_steps=t.overlap_steps,
            accumulation=_accumulation(config, plan, shape),
        ),
        checkpoint=Checkpointing(
            config.checkpoint.dir,
            config.checkpoint.every,
            config.checkpoint.keep_last,
            resume=config.checkpoint.resume != "no",
            required=config.checkpoint.resume == "require",
        ),
        evaluation=Evaluating(
            _data_source(
                val_data if val_data is not None else config.evaluation.data,
                seq_len,
                seed,
                dtype,
                config.evaluation.batches,
                "--val-data",
            ),
            config.evaluation.every,
            config.evaluation.batches,
        ),
        peak_flops=None if (tflops := config.logging.peak_tflops) is None else tflops * 1e12,
    )


def _accumulation(config: JobConfig, plan: Plan, shape: JobShape) -> int:
    """Passes of the plan per optimizer step: the global batch over one pass's sequences."""
    from octopipe.errors import InputError

    wanted = config.data.global_batch
    dp, micro_batch_size = shape.dp, shape.microbatch_size
    one_pass = shape.sequences_per_step
    if wanted is None or wanted == one_pass:
        return 1
    if wanted % one_pass:
        raise InputError(
            "--global-batch",
            f"{wanted} sequences are not a multiple of one pass of the plan: {dp} replicas x "
            f"{plan.num_microbatches} microbatches x {micro_batch_size} sequences = {one_pass}",
        )
    for flag, on in (
        ("--overlap-steps", config.training.overlap_steps),
        ("--zero 3", shape.zero == 3),
    ):
        if on:
            raise InputError(
                "--global-batch", f"accumulating passes is not supported with {flag} yet"
            )
    return wanted // one_pass


def _the_plan(plan, config: JobConfig, where: str | None) -> tuple[Plan, str]:
    """The plan given (or the config's `plan.file`), and how errors name it."""
    from octopipe.errors import InputError
    from octopipe.plan import Plan, load_plan

    if isinstance(plan, Plan):
        return plan, where or "<plan>"
    path = plan if plan is not None else config.plan.file
    if path is None:
        raise InputError("--plan", "must be given (--plan, [plan] file in --config, or plan=)")
    return load_plan(path), where or str(path)


def _object(given: Any) -> Any:
    """Data given as an object (a source, batches), not as a file's path (a setting)."""
    return None if given is None or isinstance(given, str | Path) else given


def _check_loss(loss) -> None:
    """A loss is called `loss(outputs, target)` in the ranks: refused before any starts if it
    cannot be, or cannot be sent to them."""
    import inspect

    from octopipe.errors import InputError

    if loss is None:
        return
    if not callable(loss):
        raise InputError("loss", f"expected a function loss(outputs, target), got {loss!r}")
    _check_picklable("loss", loss)
    try:
        inspect.signature(loss).bind(None, None)
    except TypeError:
        raise InputError(
            "loss",
            f"{getattr(loss, '__qualname__', loss)} cannot be called as loss(outputs, target)",
        ) from None
    except ValueError:  # no signature to read: calling it will tell
        pass


def _check_picklable(what: str, fn) -> None:
    """Spawned ranks get functions by reference (module and name): a lambda or a function
    defined inside another cannot be sent."""
    import pickle

    from octopipe.errors import InputError

    try:
        pickle.dumps(fn)
    except (pickle.PicklingError, AttributeError, TypeError):
        name = getattr(fn, "__qualname__", repr(fn))
        raise InputError(
            what,
            f"{name} cannot be sent to the ranks: define it at the top level of a module or "
            "script (a lambda or a function inside another has no name to import it by)",
        ) from None


def _reports_to(on_step, on_note):
    """One callback for the launcher: step reports to `on_step`, notes to `on_note`."""
    from octopipe.runtime.job.progress import StepReport

    if on_step is None and on_note is None:
        return None

    def report(item) -> None:
        handler = on_step if isinstance(item, StepReport) else on_note
        if handler is not None:
            handler(item)

    return report


def planned_shape(plan: Plan) -> tuple[int | None, int | None]:
    """The sequence length and microbatch size a plan was made for (its profile's; a cluster
    plan's `parallelism` microbatch size first), each None where the plan does not say."""
    b = plan.shape.microbatch_size if plan.shape is not None else None
    return plan.made_for_value("seq_len"), b or plan.made_for_value("microbatch_size")


def run_shape(plan: Plan, seq_len: int | None, micro_batch_size: int | None) -> tuple[int, int]:
    """The tokens per sequence and sequences per microbatch a run of `plan` uses: those given,
    else what the plan was made for, else the defaults (32 and 2)."""
    from octopipe.runtime.model.recipe import DEFAULT_MICRO_BATCH_SIZE, DEFAULT_SEQ_LEN

    planned_len, planned_b = planned_shape(plan)
    return (
        seq_len or planned_len or DEFAULT_SEQ_LEN,
        micro_batch_size or planned_b or DEFAULT_MICRO_BATCH_SIZE,
    )


def run_job_shape(config: JobConfig, plan: Plan, seq_len: int, micro_batch_size: int) -> JobShape:
    """The job's shape a run of `plan` takes: each degree and the ZeRO stage as given, else
    the plan's (`parallelism`), else 1 (ZeRO 0), in the plan's rank order; refused in one line
    where `octopipe run` does not run it (`engines.octopipe.shape_refusal`, the rules the
    search keeps to) or the sequence does not split into its CP chunks."""
    from octopipe.engines.octopipe import shape_refusal
    from octopipe.errors import InputError
    from octopipe.plan import JobShape

    given, planned = config.parallelism, plan.shape

    def degree(name: str) -> int:
        value = getattr(given, name)
        if value is not None:
            return value
        return getattr(planned, name) if planned is not None else 0 if name == "zero" else 1

    zero = degree("zero")
    shape = JobShape(
        degree("tp"),
        plan.num_devices,
        degree("dp"),
        micro_batch_size,
        plan.num_microbatches,
        cp=degree("cp"),
        ep=degree("ep"),
        zero=zero,
        # HSDP's groups are a ZeRO-3 plan's: another --zero runs without them
        shard_group=planned.shard_group if planned is not None and zero == 3 else 0,
        recompute=planned.recompute if planned is not None else "none",
        rank_order=planned.rank_order if planned is not None else "octopipe",
    )
    precision = plan.made_for_value("precision") or "bf16"
    refusal = shape_refusal(shape, config.training.overlap_steps, precision)
    if refusal is not None:
        raise InputError(refusal.flag, refusal.why)
    cp, tp = shape.cp, shape.tp
    if cp > 1 and (seq_len % (2 * cp) or (seq_len // cp) % tp):
        raise InputError(
            "--seq-len",
            f"{seq_len} tokens do not split into {2 * cp} equal chunks, each rank's two of them "
            f"into {tp} tensor-parallel shares (--cp {cp} --tp {tp})",
        )
    return shape


def _data_source(
    data, seq_len: int, seed: int, dtype: str | None, steps: int, flag: str = "--data"
):
    """`steps`: how many batches an iterator is read for."""
    import itertools

    from octopipe.runtime.data.batches import DataSource, GivenBatches, TokenFile

    if data is None or isinstance(data, DataSource):
        return data
    if isinstance(data, str | Path):
        return TokenFile(data, seq_len, seed, dtype, flag)
    if not isinstance(data, Sequence):  # a generator cannot travel to spawned ranks: read it
        data = list(itertools.islice(iter(data), steps))
    return GivenBatches(data)
