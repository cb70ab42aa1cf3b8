"""`octopipe run`: train a model with a plan on real processes and report what was measured."""

from __future__ import annotations

import argparse
import os
import sys
from contextlib import nullcontext

from octopipe.commands._flags import count, number
from octopipe.jsonfile import dumps
from octopipe.limits import (
    MAX_EVAL_BATCHES,
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
from octopipe.runtime import DEFAULT_TIMEOUT_S
from octopipe.units import fmt_bytes

NAME = "run"
HELP = "Run a plan on torch.distributed (spawned processes or inside torchrun) and measure it."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--plan", required=True, help="plan.json (octopipe.plan/1)")
    parser.add_argument(
        "--model",
        required=True,
        help="bundled model name, config.json, hf:PATH (a transformers config), or "
        "module:factory (a function returning an nn.Module)",
    )
    parser.add_argument(
        "--nproc",
        type=count(1, MAX_PROCESSES),
        help="processes to spawn (default: TP x the plan's devices x DP; ignored under torchrun)",
    )
    parser.add_argument(
        "--dp",
        type=count(1, MAX_PARALLEL_DEGREE),
        help="data-parallel replicas of the plan (default: the plan's parallelism.dp, else 1)",
    )
    parser.add_argument(
        "--tp",
        type=count(1, MAX_PARALLEL_DEGREE),
        help="tensor-parallel ranks per pipeline device (default: the plan's parallelism.tp, "
        "else 1); rank = tp_rank + TP x (device + PP x replica)",
    )
    parser.add_argument(
        "--zero",
        type=count(0, 3),
        choices=(0, 1, 3),
        default=0,
        help="1: shard the optimizer state across the replicas (ZeRO-1); 3: also the weights "
        "and gradients (FSDP2, gathered and reduced where the plan says)",
    )
    parser.add_argument(
        "--data",
        help="flat file of little-endian token ids (nanoGPT style); default: synthetic data",
    )
    parser.add_argument(
        "--data-dtype",
        choices=("uint16", "uint32"),
        help="--data's id type (default: what the meta.json beside the file says, else uint16)",
    )
    parser.add_argument(
        "--steps",
        type=count(1, MAX_STEPS),
        default=3,
        help="the run's last step: training steps, or where a resumed run stops",
    )
    parser.add_argument(
        "--seed", type=count(0, MAX_SEED), default=0, help="seed of the weights and the data"
    )
    parser.add_argument(
        "--optimizer",
        choices=("sgd", "adam", "adamw"),
        default="sgd",
        help="optimizer of every stage",
    )
    parser.add_argument("--lr", type=number(0, MAX_RATE), default=0.01, help="learning rate")
    parser.add_argument(
        "--momentum", type=number(0, 1, below=True), default=0.0, help="SGD momentum, in [0, 1)"
    )
    parser.add_argument(
        "--weight-decay", type=number(0, MAX_RATE), default=0.0, help="weight decay"
    )
    parser.add_argument(
        "--lr-warmup",
        type=count(0, MAX_STEPS),
        default=0,
        help="steps of linear learning-rate warm-up",
    )
    parser.add_argument(
        "--lr-decay",
        choices=("constant", "cosine"),
        default="constant",
        help="after warm-up: constant, or cosine down to --min-lr at --steps",
    )
    parser.add_argument(
        "--min-lr", type=number(0, MAX_RATE), default=0.0, help="where the cosine ends (<= --lr)"
    )
    parser.add_argument(
        "--clip-norm",
        type=number(0, MAX_RATE, above=True),
        help="clip gradients to this global norm (all stages, replicas)",
    )
    parser.add_argument(
        "--bf16", action="store_true", help="forwards under torch.autocast to bfloat16"
    )
    parser.add_argument(
        "--overlap-steps",
        action="store_true",
        help="no barrier between steps: each stage updates right after its last backward, "
        "clipping and the non-finite check validated afterwards (a failed step is redone)",
    )
    parser.add_argument("--checkpoint-dir", help="write checkpoints here (DIR/step-N)")
    parser.add_argument(
        "--checkpoint-every",
        type=count(0, MAX_STEPS),
        default=0,
        help="save after every N steps (0: never)",
    )
    parser.add_argument(
        "--keep-last",
        type=count(0, MAX_STEPS),
        default=0,
        help="after each save, keep only the newest K checkpoints in --checkpoint-dir (0: all)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue from the latest checkpoint in --checkpoint-dir (any plan, any --dp)",
    )
    parser.add_argument(
        "--val-data",
        help="held-out token file (as --data; prepare-data's val.bin): its loss and perplexity "
        "after every --eval-every steps and after the last",
    )
    parser.add_argument(
        "--eval-every",
        type=count(0, MAX_STEPS),
        default=0,
        help="evaluate on --val-data after every N steps (0: after the last step only)",
    )
    parser.add_argument(
        "--eval-batches",
        type=count(1, MAX_EVAL_BATCHES),
        default=4,
        help="global batches of --val-data per evaluation (the same ones each time)",
    )
    parser.add_argument(
        "--log-dir",
        help="write DIR/log.jsonl (every step's JSON line) and TensorBoard event files "
        "(with the tensorboard package: pip install 'octopipe[logs]')",
    )
    parser.add_argument(
        "--peak-tflops",
        type=number(0, MAX_RATE, above=True),
        help="one rank's dense peak TFLOP/s, for MFU (default: an A100/H100/H200/H800's BF16 "
        "peak by the GPU's name; none on a CPU)",
    )
    parser.add_argument(
        "--backend",
        choices=("auto", "gloo", "nccl"),
        default="auto",
        help="auto: NCCL when each rank can have its own GPU, else gloo on CPU",
    )
    parser.add_argument(
        "--lookahead",
        type=count(1, 1_000_000),
        default=8,
        help="actions ahead whose receives are posted early",
    )
    parser.add_argument(
        "--init-method",
        default="env://",
        help="under torchrun: how ranks meet (default env://; file:///shared/path also works)",
    )
    parser.add_argument(
        "--timeout",
        type=number(MIN_TIMEOUT_S, MAX_SECONDS),
        default=DEFAULT_TIMEOUT_S,
        help="seconds one wait of a rank (a transfer, a collective) may take before the run "
        "fails; the whole run has no deadline",
    )
    parser.add_argument(
        "--trace", help="write a Chrome/Perfetto trace of every rank's actions here"
    )
    parser.add_argument(
        "--seq-len",
        type=count(1, MAX_SEQ_LEN),
        help="tokens per sequence (default: what the plan was made for, its profile's, else 32)",
    )
    parser.add_argument(
        "--micro-batch-size",
        type=count(1, MAX_MICRO_BATCH_SIZE),
        help="sequences per microbatch (default: what the plan was made for, its parallelism "
        "or profile key, else 2)",
    )
    parser.add_argument("--png", help="draw the last step's measured timeline here (.png or .svg)")
    parser.add_argument(
        "--profile",
        help="the profile the plan was made from: --png then sets the measured timeline above "
        "the predicted one, on one time axis",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one JSON line per step as it finishes, then the summary object (last line)",
    )


def run(args: argparse.Namespace) -> int:
    from octopipe.api import run as train
    from octopipe.api import run_shape
    from octopipe.commands._output_paths import (
        JSON,
        PICTURE,
        check_output_file,
        check_output_folder,
    )
    from octopipe.commands._run_progress import RunProgress
    from octopipe.plan import load_plan
    from octopipe.runtime.launch.launcher import RankFailure, Stopped, under_torchrun
    from octopipe.runtime.parallel.layout import RankLayout
    from octopipe.trace import from_records, write_trace

    check_output_file("--trace", args.trace, JSON)
    check_output_file("--png", args.png, PICTURE)
    if args.log_dir is not None:
        check_output_folder("--log-dir", args.log_dir)
    plan = load_plan(args.plan)
    profile = _prediction_profile(args, plan)
    logs = _logs(args.log_dir)
    try:
        with logs or nullcontext(), RunProgress(args.steps, args.json, logs) as progress:
            result = train(
                plan,
                args.model,
                steps=args.steps,
                seed=args.seed,
                optimizer=args.optimizer,
                lr=args.lr,
                momentum=args.momentum,
                weight_decay=args.weight_decay,
                warmup_steps=args.lr_warmup,
                decay=args.lr_decay,
                min_lr=args.min_lr,
                clip_norm=args.clip_norm,
                bf16=args.bf16,
                checkpoint_dir=args.checkpoint_dir,
                checkpoint_every=args.checkpoint_every,
                resume=args.resume,
                overlap_steps=args.overlap_steps,
                dp=args.dp,
                zero=args.zero,
                tp=args.tp,
                data=args.data,
                data_dtype=args.data_dtype,
                nproc=args.nproc,
                backend=args.backend,
                timeout=args.timeout,
                lookahead=args.lookahead,
                seq_len=args.seq_len,
                micro_batch_size=args.micro_batch_size,
                init_method=args.init_method,
                where=args.plan,
                on_step=progress,
                on_note=progress,
                val_data=args.val_data,
                eval_every=args.eval_every,
                eval_batches=args.eval_batches,
                keep_last=args.keep_last,
                peak_tflops=args.peak_tflops,
            )
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
    dp, tp = args.dp or _planned(plan, "dp") or 1, args.tp or _planned(plan, "tp") or 1
    degrees = (("dp", dp, "data-parallel replicas"), ("tp", tp, "tensor-parallel ranks a device"))
    for flag, ran, what in degrees:
        if _planned(plan, flag) not in (None, ran):
            print(
                f"octopipe run: note: {args.plan} was planned for {_planned(plan, flag)} {what} "
                f"(its parallelism key); this ran {ran} (--{flag})",
                file=sys.stderr,
            )
    if args.trace:
        write_trace(args.trace, from_records(result.records), "measured")
    if args.png:
        _draw_last_step(result, args.png, plan, profile, RankLayout(tp, plan.num_devices, dp))
    comparable = _note_other_shape(args, plan)
    summary = result.summary()
    summary["seq_len"], summary["micro_batch_size"] = run_shape(
        plan, args.seq_len, args.micro_batch_size
    )
    summary["predicted_for"] = dict(plan.profile) if plan.profile else None
    if args.json:
        print(dumps(summary))
    else:
        _print_human(summary, comparable)
        if dp > 1 or tp > 1:
            print(RankLayout(tp, plan.num_devices, dp).describe())
        if args.trace and summary["predicted_iteration_time"] is not None:
            print(
                "to fit the profile to this run: octopipe calibrate --profile PROFILE "
                f"--plan {args.plan} --trace {args.trace} -o CALIBRATED"
            )
    if under_torchrun():
        _leave_rank()
    return 0


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


def _prediction_profile(args: argparse.Namespace, plan):
    """The profile `--profile` names, checked against the plan before the run, or None."""
    if args.profile is None:
        return None
    from octopipe.errors import InputError

    if args.png is None:
        raise InputError("--profile", "is for --png (it draws the prediction): give --png too")
    from octopipe.plan import check_layer_names, check_structure
    from octopipe.profile import load_profile

    profile = load_profile(args.profile)
    check_structure(plan, args.plan, profile.num_layers, layers_of=args.profile)
    check_layer_names(plan.layer_names, profile.layer_names, args.plan, of=args.profile)
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


def _note_other_shape(args: argparse.Namespace, plan) -> bool:
    """Say where the run's sequence length or microbatch size is not what the plan was made
    for (its predicted time is then another job's); whether the prediction compares."""
    from octopipe.api import planned_shape

    planned = dict(zip(("--seq-len", "--micro-batch-size"), planned_shape(plan)))
    comparable = True
    for flag, ran in (("--seq-len", args.seq_len), ("--micro-batch-size", args.micro_batch_size)):
        if ran is not None and planned[flag] not in (None, ran):
            comparable = False
            print(
                f"octopipe run: note: {args.plan} was made for {flag} {planned[flag]} (its "
                f"profile's); this ran {ran}: its predicted step time is for the other size",
                file=sys.stderr,
            )
    return comparable


def _planned(plan, key: str) -> int | None:
    return plan.parallelism.get(key) if plan.parallelism else None


def _print_human(summary: dict, comparable: bool = True) -> None:
    losses = ", ".join(f"{x:.6g}" for x in summary["losses"])
    print(f"losses per step: {losses}")
    predicted = summary["predicted_iteration_time"]
    line = f"iteration time: {summary['iteration_time'] * 1e3:.3f} ms (median after the first step)"
    if predicted is not None and comparable:
        error = summary["iteration_time"] / predicted - 1
        line += f"; plan predicted {predicted * 1e3:.3f} ms ({error:+.1%})"
    elif predicted is not None:
        line += f"; plan predicted {predicted * 1e3:.3f} ms for another size (note above)"
    print(line)
    mems = ", ".join(
        f"rank {r}: {fmt_bytes(b)}" for r, b in enumerate(summary["peak_memory_bytes"])
    )
    print(f"peak memory ({summary['peak_memory_source']}): {mems}")
    held = ", ".join(f"rank {r}: {fmt_bytes(b)}" for r, b in enumerate(summary["state_bytes"]))
    print(f"weights, gradients and optimizer state held: {held}")
