"""`octopipe profile`: measure a real model layer by layer on this machine, write a profile.

The measuring is `octopipe.runtime.measure.profile_job.measure_profile`; this module parses
and reports."""

from __future__ import annotations

import argparse
import sys

NAME = "profile"
HELP = "Measure a model's per-layer costs (every layer by FQN) on this device; write a profile."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from octopipe.config.flags import count
    from octopipe.config.planning import add_job_flags
    from octopipe.limits import MAX_PROCESSES

    # The job's settings, each its one definition (`octopipe.config`): measured as a run
    # would run them (a run's sequence and microbatch size where not given).
    add_job_flags(
        parser,
        ("model.name", "data.seq_len", "data.micro_batch_size", "model.seed"),
        required=("model.name",),
    )
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="where to run the layers"
    )
    parser.add_argument(
        "--repeats", type=count(1, 10_000), default=5, help="timed runs per layer (median)"
    )
    parser.add_argument(
        "--warmup", type=count(0, 10_000), default=2, help="untimed runs per layer first"
    )
    parser.add_argument(
        "--threads",
        type=count(1, 1024),
        default=1,
        help="CPU threads for torch (default 1: small layers gain nothing from more, and "
        "timings stay steady on a shared machine)",
    )
    parser.add_argument(
        "--nproc",
        type=count(1, MAX_PROCESSES),
        default=1,
        help="processes measuring at once, as many as the run will have: each layer is timed "
        "in all of them together (the median is kept), so the contention of a run's ranks on "
        "shared cores and memory is in the times; from 2 on, the link between two of them is "
        "measured too, while they compute, as in a run (gloo on CPU; NCCL with a GPU per "
        "process)",
    )
    parser.add_argument("-o", "--output", required=True, help="profile JSON to write")


def run(args: argparse.Namespace) -> int:
    from octopipe.device_kinds import local_kind
    from octopipe.limits import MAX_MICROBATCH_TOKENS, check_microbatch_tokens
    from octopipe.outfiles import check_output_file
    from octopipe.profile import save_profile
    from octopipe.runtime.measure.profile_job import check_fits, measure_profile
    from octopipe.runtime.model.recipe import DEFAULT_MICRO_BATCH_SIZE, DEFAULT_SEQ_LEN

    check_output_file("--output", args.output)
    args.seq_len = args.seq_len or DEFAULT_SEQ_LEN  # a run's, where not given
    args.micro_batch_size = args.micro_batch_size or DEFAULT_MICRO_BATCH_SIZE
    check_microbatch_tokens(args.seq_len, args.micro_batch_size, MAX_MICROBATCH_TOKENS)

    if sys.stderr.isatty():  # the processes take seconds to start before their bar shows
        check_fits(args.model, args.device)  # a refused model stays one line
        processes = f"{args.nproc} processes" if args.nproc > 1 else "a process"
        print(
            f"starting {processes} on {args.device} to time {args.model}'s layers "
            f"({args.warmup} + {args.repeats} runs each); a bar follows once they have started",
            file=sys.stderr,
            flush=True,
        )
    profile = measure_profile(
        args.model,
        nproc=args.nproc,
        device=args.device,
        seq_len=args.seq_len,
        micro_batch_size=args.micro_batch_size,
        repeats=args.repeats,
        warmup=args.warmup,
        seed=args.seed,
        threads=args.threads,
    )
    # Named after where they were measured: a plan records it, a run elsewhere says so.
    kind = local_kind(args.device)
    devices = tuple(d.model_copy(update={"name": kind}) for d in profile.devices or ())
    profile = profile.with_devices(devices) if devices else profile
    save_profile(profile, args.output)
    work = sum(layer.work for layer in profile.layers)
    link = ""
    if args.nproc > 1:
        link = (
            f"; link {profile.link.latency * 1e6:.0f} us + {profile.link.bandwidth / 1e9:.2f} GB/s"
        )
    print(
        f"wrote {args.output}: {profile.num_layers} layers, "
        f"{work * 1e3:.2f} ms of F+B+W per microbatch on {args.device}{link}"
    )
    return 0
