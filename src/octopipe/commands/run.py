"""`octopipe run`: train a model with a plan on real processes and report what was measured."""

from __future__ import annotations

import argparse
import os
import sys
from contextlib import contextmanager, nullcontext

from octopipe.jsonfile import dumps
from octopipe.units import fmt_bytes, fmt_eta, fmt_time

NAME = "run"
HELP = "Run a plan on torch.distributed (spawned processes or inside torchrun) and measure it."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # Every flag is a setting of the job config (octopipe.config: its doc, bounds and default),
    # and `--config job.toml` gives them all from a file.
    from octopipe.config.sources import add_flags

    add_flags(parser)


def run(args: argparse.Namespace) -> int:
    from octopipe.config.sources import from_flags
    from octopipe.outfiles import JSON, PICTURE, check_output_file, check_output_folder
    from octopipe.plan import load_plan
    from octopipe.runtime.launch import spawn

    config = from_flags(args)
    _require(config)
    out = config.logging
    check_output_file("--trace", out.trace, JSON)
    check_output_file("--png", out.png, PICTURE)
    if out.dir is not None:
        check_output_folder("--log-dir", out.dir, ("log.jsonl",))
    plan = load_plan(config.plan.file)
    try:
        _start_ranks_early(config, plan)
        return _run(config, plan)
    finally:
        spawn.stop_early()  # a run refused before its ranks started takes its starter along


def _run(config, plan) -> int:
    """The run once its starter is on its way: checked, trained, reported."""
    from octopipe.commands._run_progress import RunProgress
    from octopipe.runtime.failures import RankFailure, Stopped
    from octopipe.runtime.launch.launcher import under_torchrun
    from octopipe.trace import from_records, write_trace
    from octopipe.training import run as train
    from octopipe.training import run_shape

    out, plan_file = config.logging, config.plan.file
    profile = _prediction_profile(config, plan)
    logs = _logs(out.dir)
    steps = config.training.steps
    ran_on = _device_kind(config, plan)
    notes = _before_the_first_step(config, plan, plan_file, ran_on)
    try:
        with (
            logs or nullcontext(),
            RunProgress(steps, out.json, logs, notes) as progress,
            _warnings_held(progress),
        ):
            result = train(plan, config, where=plan_file, on_step=progress, on_note=progress)
    except RankFailure as exc:  # a non-finite loss too; under torchrun every rank raises it
        if under_torchrun():
            _leave_rank(1, f"octopipe run: {exc}" if os.environ["RANK"] == "0" else None)
        print(f"octopipe run: {exc}", file=sys.stderr)
        return 2 if exc.bad_input else 1
    except Stopped as exc:
        print(f"octopipe run: {exc}", file=sys.stderr)
        return 128 + exc.signum
    if result is None:  # a rank other than 0 under torchrun: rank 0 reports
        _leave_rank()
    # After the run, so that a refused run's error stays its only line.
    layout = result.shape
    degrees = (("dp", "data-parallel replicas"), ("tp", "tensor-parallel ranks a device"))
    for flag, what in degrees:
        planned, ran = _planned(plan, flag), getattr(layout, flag)
        if planned not in (None, ran):
            print(
                f"octopipe run: note: {plan_file} was planned for {planned} {what} "
                f"(its parallelism key); this ran {ran} (--{flag})",
                file=sys.stderr,
            )
    if out.trace:
        write_trace(out.trace, from_records(result.records), "measured")
    if out.png:
        _draw_last_step(result, out.png, plan, profile, layout)
    same_shape = _note_other_shape(config, plan)
    summary = result.summary()
    comparable = not _other_device(plan, plan_file, summary, ran_on) and same_shape
    summary["seq_len"], summary["micro_batch_size"] = run_shape(
        plan, config.data.seq_len, config.data.micro_batch_size
    )
    summary["predicted_for"] = dict(plan.profile) if plan.profile else None
    if out.json:
        print(dumps(summary))
    else:
        _print_human(summary, comparable, same_shape)
        if layout.dp > 1 or layout.tp > 1 or layout.cp > 1:
            print(layout.rank_rule())
        if out.trace and summary["predicted_iteration_time"] is not None:
            given = out.profile  # --profile, when the run was given the plan's profile
            calibrated = "CALIBRATED" if given is None else _calibrated_name(given)
            print(
                "to fit the profile to this run: octopipe calibrate --profile "
                f"{given or 'PROFILE'} --plan {plan_file} --trace {out.trace} -o {calibrated}"
            )
    if under_torchrun():
        _leave_rank()
    return 0


def _start_ranks_early(config, plan) -> None:
    """Spawn the ranks' starter before this process imports torch and checks the run, so that
    the two imports share the host's cores (`spawn.start_early`); where the count cannot be
    told yet (a shape the checks will refuse), the run starts its ranks as it would."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # under torchrun: this is a rank
        return
    from octopipe.errors import OctoPipeError
    from octopipe.runtime.launch import forks, spawn
    from octopipe.training import run_job_shape

    try:
        data = config.data
        seq_len = data.seq_len or 2**20  # divides into any CP the world size may hold
        shape = run_job_shape(config, plan, seq_len, data.micro_batch_size or 1)
    except (OctoPipeError, ValueError):
        return
    spawn.start_early(config.launch.nproc or shape.world_size, "octopipe", forks.RANK_MODULES)


def _calibrated_name(profile: str) -> str:
    """tiny.json -> tiny.cal.json, beside it."""
    from pathlib import Path

    path = Path(profile)
    return str(path.with_name(f"{path.stem}.cal{path.suffix or '.json'}"))


def _require(config) -> None:
    """The two settings a run cannot do without, by flag or job file."""
    from octopipe.errors import OctoPipeError

    for flag, value, key in (
        ("--plan", config.plan.file, "[plan] file"),
        ("--model", config.model.name, "[model] name"),
    ):
        if value is None:
            raise OctoPipeError(
                f"the following arguments are required: {flag} (or {key} in --config)"
            )


def _logs(folder: str | None):
    """The run's logs, on the process that reports (rank 0 under torchrun), if asked for."""
    if folder is None or os.environ.get("RANK", "0") != "0":
        return None
    from octopipe.runtime.job.logs import RunLogs, tensorboard_available

    if not tensorboard_available():
        print(
            f"octopipe run: note: {folder}: no TensorBoard event files without the tensorboard "
            "package (pip install 'octopipe[logs]'); log.jsonl only",
            file=sys.stderr,
        )
    return RunLogs(folder)


def _leave_rank(code: int = 0, message: str | None = None) -> None:
    """End a torchrun rank without interpreter teardown, as spawned ranks do: at exit, torch's
    C++ threads of a finished process group can abort the process ("terminate called without
    an active exception"), turning a good run into a failed rank. A failed rank's peers may be
    gone, so teardown could also wait on them."""
    if message is not None:
        print(message, file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _prediction_profile(config, plan):
    """The profile `--profile` names, checked against the plan before the run, or None."""
    path, plan_file = config.logging.profile, config.plan.file
    if path is None:
        return None
    from octopipe.errors import InputError

    if config.logging.png is None:
        raise InputError("--profile", "is for --png (it draws the prediction): give --png too")
    from octopipe.plan import check_layer_names, check_structure
    from octopipe.profile import load_profile

    profile = load_profile(path)
    check_structure(plan, plan_file, profile.num_layers, layers_of=path)
    check_layer_names(plan.layer_names, profile.layer_names, plan_file, of=path)
    return profile


def _draw_last_step(result, path: str, plan, profile, layout) -> None:
    """The last step as measured: above the plan's prediction on its profile where there is
    one, else drawn like a simulated timeline. The first replica's ranks (and of a
    tensor-parallel group, its first), one per device (`layout` numbers the ranks)."""
    from octopipe.actions import Event
    from octopipe.trace import from_records

    last = result.first_step + len(result.losses) - 1
    device_of = {layout.rank(0, d): d for d in range(plan.num_devices)}
    events = [
        Event(device_of[t.event.device], t.event.action, t.event.start, t.event.end)
        for t in from_records(result.records)
        if t.step == last and t.event.device in device_of
    ]
    title = f"measured: the last of {len(result.losses)} steps"
    if profile is None:
        from octopipe.viz.timeline import save_timeline

        save_timeline(events, path, title=title)
        return
    from octopipe.sim import Simulator
    from octopipe.viz.compare import save_measured_and_predicted
    from octopipe.viz.style import gpu_names

    predicted = Simulator(profile).run(plan, detail=True)
    title += f"; predicted: {profile.name}"
    save_measured_and_predicted(events, predicted, path, title, gpu_names(profile))


def _note_other_shape(config, plan) -> bool:
    """Say where the run's sequence length or microbatch size is not what the plan was made
    for (its predicted time is then another job's); whether the prediction compares."""
    from octopipe.training import planned_shape

    planned = dict(zip(("--seq-len", "--micro-batch-size"), planned_shape(plan)))
    comparable = True
    given = (
        ("--seq-len", config.data.seq_len),
        ("--micro-batch-size", config.data.micro_batch_size),
    )
    for flag, ran in given:
        if ran is not None and planned[flag] not in (None, ran):
            comparable = False
            print(
                f"octopipe run: note: {config.plan.file} was made for {flag} {planned[flag]} (its "
                f"profile's); this ran {ran}: its predicted step time is for the other size",
                file=sys.stderr,
            )
    return comparable


@contextmanager
def _warnings_held(progress):
    """A checkpoint resumed without checksums is said as the run starts (`warn_later`), not
    while it is checked: a run refused after the choice keeps its one error line."""
    import warnings

    from octopipe.runtime.checkpoint.notices import CheckpointUnverified

    shown = warnings.showwarning

    def show(message, category, *args, **kwargs):
        if issubclass(category, CheckpointUnverified):
            progress.warn_later(str(message))
        else:
            shown(message, category, *args, **kwargs)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = shown


def _device_kind(config, plan) -> str | None:
    """The kind of device the ranks will compute on ("cpu", "h100", ...; `device_kinds`), as
    the launcher will choose it; None where that is not known before the run (a setting the
    run refuses, in its own order, or a rank of a torchrun job that does not report)."""
    from octopipe.device_kinds import local_kind
    from octopipe.errors import InputError
    from octopipe.runtime.launch.launcher import choose_backend, under_torchrun
    from octopipe.training import run_job_shape, run_shape

    if os.environ.get("RANK", "0") != "0":
        return None
    try:
        if under_torchrun():
            local = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
        else:
            sizes = run_shape(plan, config.data.seq_len, config.data.micro_batch_size)
            local = config.launch.nproc or run_job_shape(config, plan, *sizes).world_size
        backend = choose_backend(config.launch.backend, local)
    except (InputError, ValueError):
        return None
    return local_kind("cuda" if backend == "nccl" else "cpu")


def _before_the_first_step(config, plan, plan_file: str, ran_on: str | None) -> tuple[str, ...]:
    """What the run's settings mean that is worth knowing before its first step, said once
    the run has passed its checks (`RunProgress`): the device the plan was priced for, where
    it is not this one, and what a step of an accumulated global batch is."""
    from octopipe.device_kinds import other_device_note

    notes = []
    other = None if ran_on is None else other_device_note(plan, plan_file, ran_on)
    if other is not None:
        notes.append(other)
    priced = (plan.profile or {}).get("device")
    passes = _passes_note(config, plan, ran_on if priced == ran_on else None)
    if passes is not None:
        notes.append(passes)
    return tuple(notes)


def _passes_note(config, plan, priced_here: str | None) -> str | None:
    """`--global-batch` above one pass of the plan makes a step many passes, and no step line
    comes until all are done: how many, and, where the plan's predicted pass is for this
    device (`priced_here`), about when the first step ends."""
    from octopipe.errors import InputError
    from octopipe.training import run_job_shape, run_shape

    wanted = config.data.global_batch
    if wanted is None:
        return None
    try:
        sizes = run_shape(plan, config.data.seq_len, config.data.micro_batch_size)
        shape = run_job_shape(config, plan, *sizes)
    except InputError:
        return None  # refused by the run itself, in its order
    one_pass = shape.sequences_per_step
    if wanted % one_pass or wanted == one_pass:
        return None  # one pass, or refused by the run
    passes = wanted // one_pass
    line = (
        f"a step is {passes:,} passes of the plan (--global-batch {wanted:,} sequences, "
        f"{one_pass:,} a pass: {_count(shape.dp, 'replica')} x "
        f"{_count(shape.num_microbatches, 'microbatch')} x {shape.microbatch_size}); each step's "
        "line comes once its passes are done"
    )
    predicted = (plan.predicted or {}).get("iteration_time")
    if predicted and priced_here is not None:
        line += (
            f"; the first expected about {fmt_eta(passes * predicted)} after the start-up (the "
            f"plan's predicted {fmt_time(predicted)} a pass on {priced_here})"
        )
    return line


def _count(n: int, what: str) -> str:
    return f"{n:,} {what}" if n == 1 else f"{n:,} {what}{'es' if what.endswith('h') else 's'}"


def _other_device(plan, plan_file: str, summary: dict, ran_on: str | None) -> bool:
    """Whether the plan was priced for another kind of device than the run's: said before the
    first step where the device was known then (`_before_the_first_step`), else here."""
    from octopipe.device_kinds import local_kind, other_device_note

    if ran_on is not None:
        return other_device_note(plan, plan_file, ran_on) is not None
    ran_on = local_kind("cuda" if summary["peak_memory_source"].startswith("cuda") else "cpu")
    note = other_device_note(plan, plan_file, ran_on)
    if note is not None:
        print(f"octopipe run: note: {note}", file=sys.stderr)
    return note is not None


def _planned(plan, degree: str) -> int | None:
    """A degree (`tp`, `dp`) the plan was made for, or None for a plan without a shape."""
    return getattr(plan.shape, degree) if plan.shape is not None else None


def _high_water_line(summary: dict, comparable: bool) -> str:
    """Each rank's high-water mark, from its tensors, beside the plan's peak for its device
    (bytes: comparable on another kind of device, not for another sequence or microbatch)."""
    parts = []
    for r, (held, planned) in enumerate(
        zip(summary["high_water_bytes"], summary["predicted_peak_bytes"])
    ):
        part = f"rank {r}: {fmt_bytes(held)}"
        if planned and comparable:
            part += f" (plan {fmt_bytes(planned)}, {held / planned - 1:+.1%})"
        parts.append(part)
    what = "plus the most kept for backwards at once, from the tensors"
    tail = "" if comparable else "; the plan's peaks are for another job (note above)"
    return f"held at the high-water mark (that state {what}): {', '.join(parts)}{tail}"


def _print_human(summary: dict, comparable: bool = True, same_shape: bool = True) -> None:
    losses = ", ".join(f"{x:.6g}" for x in summary["losses"])
    print(f"losses per step: {losses}")
    predicted = summary["predicted_iteration_time"]
    line = f"iteration time: {summary['iteration_time'] * 1e3:.3f} ms (median after the first step)"
    if predicted is not None and comparable:
        error = summary["iteration_time"] / predicted - 1
        line += f"; plan predicted {fmt_time(predicted)} ({error:+.1%})"
    elif predicted is not None:
        line += f"; plan predicted {fmt_time(predicted)} for another job (note above)"
    print(line)
    mems = ", ".join(
        f"rank {r}: {fmt_bytes(b)}" for r, b in enumerate(summary["peak_memory_bytes"])
    )
    print(f"peak memory ({summary['peak_memory_source']}): {mems}")
    held = ", ".join(f"rank {r}: {fmt_bytes(b)}" for r, b in enumerate(summary["state_bytes"]))
    print(f"weights, gradients and optimizer state held: {held}")
    print(_high_water_line(summary, same_shape))
