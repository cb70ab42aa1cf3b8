"""The Python API: what every `octopipe` command does, callable from code.

    import octopipe as op

    profile = op.profile_from_config("llama3-8b", hardware="h100", devices=4)
    plan = op.baseline(profile, "i1f1b", "uniform", num_microbatches=16)
    print(op.simulate(profile, plan).iteration_time)
    tuned = op.tune(profile, num_microbatches=16)      # never worse than any baseline
    op.save_plan(tuned.best.plan, "plan.json")

    measured = op.measure_profile("tiny-hybrid", seq_len=128, nproc=2)   # real layers, timed
    result = op.run(plan_for_tiny_hybrid, "tiny-hybrid", steps=5)        # one process per device

The commands (`octopipe.commands`) are thin over these functions. Each imports what it needs
when called: `import octopipe` loads neither torch nor matplotlib.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from octopipe.runtime import DEFAULT_TIMEOUT_S

if TYPE_CHECKING:
    from octopipe.layouts import LayoutReport
    from octopipe.plan import Plan
    from octopipe.profile import Profile
    from octopipe.runtime.job.progress import RunNote, StepReport
    from octopipe.runtime.job.session import RunResult
    from octopipe.sim import SimResult
    from octopipe.tuner import TuneResult


def profile_from_config(
    config: str | Path,
    hardware: str = "h100",
    *,
    devices: int | None = None,
    tp: int = 1,
    seq_len: int = 4096,
    micro_batch_size: int = 1,
    sequence_parallel: bool = False,
    recompute: bool = False,
    optimizer_bytes: int = 12,
    memory_bytes: float | None = None,
    link_bandwidth: float | None = None,
    link_latency: float | None = None,
    layer_names: str = "torchtitan",
) -> Profile:
    """An analytic profile of an architecture (a shipped model name or a Hugging Face style
    `config.json`) on a hardware preset, listing `devices` devices when given
    (docs/COSTMODEL.md). Bandwidth in bytes/s, latency in seconds, memory in bytes.
    `layer_names="hf"` names the layers as transformers' causal LMs do (`model.layers.3`), so
    the plan runs on `--model hf:PATH` (an InputError for a family `hf:` does not run); the
    default is torchtitan's (`layers.3`)."""
    from pydantic import ValidationError

    from octopipe.costmodel import load_architecture
    from octopipe.costmodel.build import build_profile
    from octopipe.costmodel.hardware import hardware_preset
    from octopipe.costmodel.hf_config import check_hf_runnable
    from octopipe.costmodel.settings import Settings
    from octopipe.errors import InputError
    from octopipe.limits import MAX_ESTIMATED_TOKENS, check_microbatch_tokens
    from octopipe.profile import first_error

    check_microbatch_tokens(seq_len, micro_batch_size, MAX_ESTIMATED_TOKENS)
    preset = hardware_preset(
        hardware,
        memory_bytes=memory_bytes,
        link_bandwidth=link_bandwidth,
        link_latency=link_latency,
    )
    settings = Settings(
        seq_len=seq_len,
        micro_batch_size=micro_batch_size,
        tensor_parallel=tp,
        sequence_parallel=sequence_parallel,
        recompute=recompute,
        optimizer_bytes=optimizer_bytes,
    )
    arch = load_architecture(str(config))
    if layer_names == "hf":  # transformers' names for a model `hf:` cannot run: plans for nothing
        check_hf_runnable(arch.model_type, "--layer-names hf", "model_type")
    try:
        profile = build_profile(arch, preset, settings, devices)
    except ValidationError as exc:  # a figure beyond the profile format's bounds
        place, message = first_error(exc)
        raise InputError("settings", f"the estimate is out of range: {message}", place) from None
    return _renamed(profile, layer_names) if layer_names != "torchtitan" else profile


def _renamed(profile: Profile, naming: str) -> Profile:
    from octopipe.costmodel.arch import LAYER_NAMINGS, hf_layer_name
    from octopipe.errors import InputError

    if naming not in LAYER_NAMINGS:
        raise InputError("--layer-names", f"expected one of {LAYER_NAMINGS}, got {naming!r}")
    try:
        layers = tuple(
            layer.model_copy(update={"name": hf_layer_name(layer.name)}) for layer in profile.layers
        )
    except ValueError as exc:
        raise InputError("--layer-names", str(exc)) from None
    return profile.model_copy(update={"layers": layers})


def baseline(
    profile: Profile,
    schedule: str,
    partition: str,
    num_microbatches: int,
    num_devices: int | None = None,
    chunks: int | None = None,
) -> Plan:
    """A named schedule (gpipe, 1f1b, i1f1b, zbh1, zbh2, zbv, dualpipev) over a named partition
    (uniform, titan, balanced), its `predicted` figures filled by the simulator."""
    from octopipe.baselines import make_baseline

    P = len(profile.device_list(num_devices))
    return make_baseline(profile, schedule, partition, P, num_microbatches, chunks)


def all_baselines(
    profile: Profile,
    num_microbatches: int,
    num_devices: int | None = None,
    time_limit: float = math.inf,
) -> list[tuple[str, Plan]]:
    """Every schedule with every partitioner, labelled "schedule/partition" (combinations the
    counts do not support are left out; none is started after `time_limit` seconds)."""
    from octopipe.baselines import all_baselines as every

    P = len(profile.device_list(num_devices))
    return every(profile, P, num_microbatches, time_limit)


def simulate(profile: Profile, plan: Plan, *, action_overhead: float = 0.0) -> SimResult:
    """Iteration time, bubbles, peak memory and critical path of `plan` (docs/FORMATS.md's
    default semantics; `action_overhead` seconds per action goes beyond them)."""
    from octopipe.sim import Simulator

    return Simulator(profile, action_overhead).run(plan)


def tune(
    profile: Profile,
    num_microbatches: int,
    num_devices: int | None = None,
    *,
    with_baselines: bool = True,
    time_budget: float = 30.0,
    **options,
) -> TuneResult:
    """The bubble-aware tuner over partition, placement and schedule. With `with_baselines`
    (the default, as `octopipe plan` does) every baseline is evaluated too and seeds the
    search, so the result is never worse than any of them. `time_budget` (seconds) covers
    both: the baselines take at most a third of it, the search what is left. `options`:
    those of `octopipe.tuner.tune` (max_chunks, seed, progress, torchtitan, action_overhead)."""
    from octopipe.tuner import check_plan_size
    from octopipe.tuner import tune as search

    started = time.perf_counter()
    P = len(profile.device_list(num_devices))
    check_plan_size(profile, num_microbatches, P)
    extra: Sequence[tuple[str, Plan]] = (
        all_baselines(profile, num_microbatches, P, time_budget / 3) if with_baselines else ()
    )
    left = max(0.0, time_budget - (time.perf_counter() - started))
    result = search(profile, num_microbatches, P, baselines=extra, time_budget=left, **options)
    best = replace(result.best, plan=result.best.plan.made_for(profile))
    return replace(result, best=best)


def plan_layout(
    config: str | Path,
    gpus: str | int,
    *,
    global_batch: int,
    gpus_per_node: int = 8,
    hardware: str = "h100",
    seq_len: int = 4096,
    stack=None,
    memory_headroom: float | None = None,
    **options,
) -> LayoutReport:
    """The parallel layout of a model on a cluster, as `octopipe plan --gpus` chooses it:
    `gpus` a count of `hardware` GPUs or a spec such as "4xh100,4xa100"; `stack` the
    training framework's settings (`octopipe.layouts.stack.Stack`, default OctoPipe's);
    `memory_headroom` the fraction of each GPU's memory a plan leaves free (default 5%).
    Megatron-LM's usual layout is planned and tuned first, every layout screened best bound
    first and the best tuned; `.rows` best first, `.reference` Megatron-LM's layout. `options`:
    those of `octopipe.layouts.plan_cluster` (time_budget, finalists, tune_evaluations,
    max_screened, seed, max_chunks, progress, overlap_steps, from_layout, torchtitan)."""
    from octopipe.layouts import Cluster, Job, parse_gpus, plan_cluster
    from octopipe.layouts.layout import DEFAULT_HEADROOM
    from octopipe.layouts.stack import Stack

    cluster = Cluster(parse_gpus(str(gpus), hardware), gpus_per_node)
    headroom = DEFAULT_HEADROOM if memory_headroom is None else memory_headroom
    job = Job(str(config), cluster, global_batch, seq_len, stack or Stack(), headroom)
    return plan_cluster(job, **options)


def measure_profile(model: str, *, nproc: int = 1, **options) -> Profile:
    """A measured profile of a bundled model (or config.json) on this machine, every layer
    timed in `nproc` processes at once; options as
    `octopipe.runtime.measure.profile_job.MeasureOptions` (device, seq_len, micro_batch_size,
    repeats, warmup, seed, threads, progress)."""
    from octopipe.runtime.measure.profile_job import measure_profile as measure

    return measure(model, nproc=nproc, **options)


def run(
    plan: Plan,
    model,
    *,
    steps: int = 3,
    seed: int = 0,
    optimizer: str = "sgd",
    lr: float = 0.01,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    warmup_steps: int = 0,
    decay: str = "constant",
    min_lr: float = 0.0,
    clip_norm: float | None = None,
    bf16: bool = False,
    checkpoint_dir: str | Path | None = None,
    checkpoint_every: int = 0,
    resume: bool = False,
    overlap_steps: bool = False,
    dp: int | None = None,
    zero: int = 0,
    tp: int | None = None,
    data=None,
    data_dtype: str | None = None,
    loss=None,
    nproc: int | None = None,
    backend: str = "auto",
    timeout: float = DEFAULT_TIMEOUT_S,
    lookahead: int = 8,
    seq_len: int | None = None,
    micro_batch_size: int | None = None,
    init_method: str = "env://",
    where: str = "<plan>",
    on_step: Callable[[StepReport], None] | None = None,
    on_note: Callable[[RunNote], None] | None = None,
    val_data=None,
    eval_every: int = 0,
    eval_batches: int = 4,
    keep_last: int = 0,
    peak_tflops: float | None = None,
) -> RunResult | None:
    """Train `model` with `plan` for `steps` steps on spawned processes, `dp` replicas of one
    process per device (gloo on CPU, NCCL with a GPU per rank), and return what was measured:
    losses, per-action records, iteration time, peak memory.

    `model`: a bundled name, a config.json, `hf:PATH`, `module:factory`, or a factory (a
    picklable function returning an `nn.Module`; docs in the README). `data`: None (the model's
    synthetic sequences), a token file's path (little-endian `data_dtype` ids; default: what a
    meta.json beside it says, else uint16), a
    `octopipe.runtime.data.batches.DataSource`, or the global batches themselves (a list, or any
    iterable, of `(inputs, targets)` holding dp x M x b sequences each). `loss(outputs,
    target)`: None for the model's own (next-token cross-entropy by default). The learning
    rate warms up over `warmup_steps`, then stays or follows a cosine to `min_lr` at `steps`;
    `clip_norm` clips by the global norm; `bf16` runs forwards under autocast. With
    `checkpoint_dir`, `checkpoint_every` steps write `DIR/step-N`; `resume` continues from the
    latest one (under any plan and `dp`) up to step `steps`. `overlap_steps` runs steps back
    to back (no barrier; per-stage updates, post-validated clipping; docs/FORMATS.md).
    `tp` and `dp`: tensor-parallel ranks per device and data-parallel replicas (default: the
    plan's `parallelism` degrees, else 1); `zero`: 1 shards the optimizer state over the
    replicas, 3 also the weights and gradients (FSDP2).

    `val_data` (a token file's path, a `DataSource`, or global batches as for `data`) is
    evaluated (forward only, held-out loss) after every `eval_every` steps and after the last,
    on `eval_batches` global batches each time; `keep_last` keeps only that many checkpoints.
    `peak_tflops`: one rank's dense peak, for MFU (default: its GPU's preset, none on a CPU).

    `timeout` (seconds) bounds each wait of a rank (a transfer, a collective), not the whole
    run. `on_step(report)` is called with every step's `StepReport` (loss, learning rate,
    gradient norm, step time, tokens/s, MFU, held-out loss) as the steps finish, where the
    result comes back; `on_note(note)` with each `RunNote` saying what the run is doing
    (start-up stages, checkpoints saved and resumed).

    Inside a torchrun job this process is one rank instead (ranks meet by `init_method`) and only
    rank 0 gets the result (the others None). A failing rank raises
    `octopipe.runtime.RankFailure` (a loss turned nan or inf: its `NonFiniteLoss`); SIGTERM or
    Ctrl-C stops every spawned rank and raises `Stopped` (a KeyboardInterrupt)."""
    from octopipe.runtime.job.session import Job, RunConfig
    from octopipe.runtime.launch.launcher import execute
    from octopipe.runtime.launch.preflight import check_run_settings
    from octopipe.runtime.step.optim import OptimizerConfig

    _check_runnable_degrees(plan, where)
    check_run_settings(
        nproc=nproc,
        steps=steps,
        timeout=timeout,
        lr=lr,
        momentum=momentum,
        weight_decay=weight_decay,
        min_lr=min_lr,
        warmup_steps=warmup_steps,
        clip_norm=clip_norm,
        checkpoint_dir=checkpoint_dir,
        checkpoint_every=checkpoint_every,
        resume=resume,
        keep_last=keep_last,
        val_data=val_data,
        eval_every=eval_every,
        eval_batches=eval_batches,
        peak_tflops=peak_tflops,
    )
    _check_loss(loss)
    if callable(model):
        _check_picklable("model", model)
    seq_len, micro_batch_size = run_shape(plan, seq_len, micro_batch_size)
    config = RunConfig(
        model,
        seed,
        steps,
        OptimizerConfig(
            optimizer,
            lr,
            momentum if optimizer == "sgd" else 0.0,
            weight_decay,
            warmup_steps,
            decay,
            min_lr,
            steps,
            clip_norm,
        ),
        lookahead,
        seq_len=seq_len,
        micro_batch_size=micro_batch_size,
        dp=dp or _planned(plan, "dp"),
        zero=zero,
        tp=tp or _planned(plan, "tp"),
        data=_data_source(data, seq_len, seed, data_dtype, steps),
        loss=loss,
        autocast="bf16" if bf16 else None,
        checkpoint_dir=None if checkpoint_dir is None else str(checkpoint_dir),
        checkpoint_every=checkpoint_every,
        resume=resume,
        overlap_steps=overlap_steps,
        val_data=_data_source(val_data, seq_len, seed, data_dtype, eval_batches, "--val-data"),
        eval_every=eval_every,
        eval_batches=eval_batches,
        keep_last=keep_last,
        peak_flops=None if peak_tflops is None else peak_tflops * 1e12,
    )
    results = execute(
        [Job(plan, config, where)],
        nproc or config.layout(plan).size,
        backend,
        timeout,
        init_method,
        _reports_to(on_step, on_note),
    )
    return None if results is None else results[0]


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
    b = plan.parallelism.get("microbatch_size") if plan.parallelism else None
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


def _planned(plan: Plan, degree: str) -> int:
    """A degree (`tp`, `dp`) a cluster plan was made for (its `parallelism`), else 1."""
    return plan.parallelism.get(degree, 1) if plan.parallelism else 1


def _check_runnable_degrees(plan: Plan, where: str) -> None:
    """A plan laid out with degrees the executor does not run yet is refused in one line, not
    run on fewer ranks as if it had none."""
    from octopipe.errors import InputError

    for degree, what in (("cp", "context"), ("ep", "expert")):
        if _planned(plan, degree) > 1:
            raise InputError(
                where,
                f"planned with {what} parallelism ({degree} {_planned(plan, degree)}), which "
                "octopipe run does not run yet",
                f"parallelism.{degree}",
            )


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
