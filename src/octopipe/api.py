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
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from octopipe.engines.answer import Exports

if TYPE_CHECKING:
    from octopipe.layouts import LayoutReport
    from octopipe.plan import Plan
    from octopipe.profile import Profile
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
    precision: str = "bf16",
    fp8_scaling: str = "delayed",
) -> Profile:
    """An analytic profile of an architecture (a shipped model name or a Hugging Face style
    `config.json`) on a hardware preset, listing `devices` devices when given
    (docs/COSTMODEL.md). Bandwidth in bytes/s, latency in seconds, memory in bytes.
    `layer_names="hf"` names the layers as transformers' causal LMs do (`model.layers.3`), so
    the plan runs on `--model hf:PATH` (an InputError for a family `hf:` does not run); the
    default is torchtitan's (`layers.3`). `precision` (`bf16`, `fp8`, `mxfp8`) and
    `fp8_scaling` (`delayed`, `current`) as docs/COSTMODEL.md, "Precision"; a profile of another
    precision than BF16 is named with it (`...-fp8`)."""
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
        precision=precision,
        fp8_scaling=fp8_scaling,
    )
    arch = load_architecture(str(config))
    if layer_names == "hf":  # transformers' names for a model `hf:` cannot run: plans for nothing
        check_hf_runnable(arch.model_type, "--layer-names hf", "model_type")
    try:
        profile = build_profile(arch, preset, settings, devices)
    except ValidationError as exc:  # a figure beyond the profile format's bounds
        place, message = first_error(exc)
        raise InputError("settings", f"the estimate is out of range: {message}", place) from None
    if precision != "bf16":
        profile = profile.model_copy(update={"name": f"{profile.name}-{precision}"})
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
    rank_order: str | None = None,
    output: str | Path | None = None,
    exports: Exports | None = None,
    pictures: bool = True,
    **options,
) -> LayoutReport:
    """The parallel layout of a model on a cluster, as `octopipe plan --gpus` chooses it:
    `gpus` a count of `hardware` GPUs or a spec such as "4xh100,4xa100"; `stack` the
    training framework's settings (`octopipe.layouts.stack.Stack`, default OctoPipe's);
    `memory_headroom` the fraction of each GPU's memory a plan leaves free (default 5%);
    `rank_order` how ranks are numbered ("octopipe" or "megatron"; default: every order the
    runner runs, each priced).
    With `output`, a folder, the answer is written there as `plan --gpus` writes it (the
    profile, plan.json, schedule.csv, the engine's exports as `exports` asks, and with
    `pictures` the timelines): `.written` holds the files and the lines that launch them
    (nothing is written when no layout fits).
    Megatron-LM's usual layout is planned and tuned first, every layout screened best bound
    first and the best tuned; `.rows` best first, `.reference` Megatron-LM's layout. `options`:
    those of `octopipe.layouts.plan_cluster` (time_budget, finalists, tune_evaluations,
    max_screened, seed, max_chunks, progress, overlap_steps, from_layout, torchtitan, workers,
    runner: "octopipe", "torchtitan" or "megatron", the engine the answer is for)."""
    from octopipe.engines import Answer, check_exports, get_engine
    from octopipe.engines.files import OUTPUT_FILES, write_answer
    from octopipe.layouts import Cluster, Job, parse_gpus, plan_cluster
    from octopipe.layouts.layout import DEFAULT_HEADROOM
    from octopipe.layouts.search import DEFAULT_TIME_BUDGET, written_plan
    from octopipe.layouts.stack import Stack
    from octopipe.outfiles import check_output_folder

    engine = get_engine(options.get("runner"))
    exports = exports or Exports()
    check_exports(engine, _export_flags(exports, options.get("torchtitan", False)))
    if engine.name == "torchtitan":  # its export is the answer: refused before the search
        from octopipe.engines.torchtitan import base_config, missing_base

        if base_config(exports, str(config)) is None:
            raise missing_base(str(config))
    if output is not None:  # before the search: fails at once
        check_output_folder("--output", output, OUTPUT_FILES)
    cluster = Cluster(parse_gpus(str(gpus), hardware), gpus_per_node)
    headroom = DEFAULT_HEADROOM if memory_headroom is None else memory_headroom
    orders = (rank_order,) if rank_order else engine.rank_orders  # each priced
    job = Job(str(config), cluster, global_batch, seq_len, stack or Stack(), headroom, orders)
    report = plan_cluster(job, **options)
    if output is None or not report.best.sim.fits:
        return report
    answer = Answer(
        written_plan(report.best),
        report.best.profile,
        model=str(config),
        seq_len=seq_len,
        gpus_per_node=gpus_per_node,
        overlap_steps=options.get("overlap_steps", False),
        exports=exports,
        stack=report.job.stack,
    )
    left = options.get("time_budget", DEFAULT_TIME_BUDGET) - report.seconds
    written = write_answer(engine, answer, Path(output), pictures, left, with_profile=True)
    return replace(report, written=written)


def _export_flags(exports: Exports, torchtitan: bool) -> dict[str, object]:
    """The export settings by flag name (`engines.EXPORT_FLAGS`), `--torchtitan` with them."""
    return {
        "torchtitan": torchtitan,
        "torchtitan_config": exports.torchtitan_config,
        "torchtitan_assets": exports.torchtitan_assets,
        "torchtitan_data": exports.torchtitan_data,
        "megatron": exports.megatron,
    }


def measure_profile(model: str, *, nproc: int = 1, **options) -> Profile:
    """A measured profile of a bundled model (or config.json) on this machine, every layer
    timed in `nproc` processes at once; options as
    `octopipe.runtime.measure.profile_job.MeasureOptions` (device, seq_len, micro_batch_size,
    repeats, warmup, seed, threads, progress)."""
    from octopipe.runtime.measure.profile_job import measure_profile as measure

    return measure(model, nproc=nproc, **options)


def __getattr__(name: str):
    # `octopipe.api.run` and its shape helpers live in `octopipe.training`, loaded when asked for
    if name in ("run", "run_shape", "planned_shape"):
        from octopipe import training

        return getattr(training, name)
    raise AttributeError(f"module 'octopipe.api' has no attribute {name!r}")
