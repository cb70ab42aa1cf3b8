"""The second hardening pass's bad inputs, for `test_bad_inputs.py`'s table: outputs that are no
regular file (devices, FIFOs, sockets, folders, links to nowhere), checkpoints that do not prove
their bytes, plans and profiles of other models, configs out of their bounds, and work beyond
any machine. Each is `(id, argv from the files' paths, a part of the one line)`; the files are
made by `second_pass_files` beside the first pass's, and `specials_changed` says afterwards that
none of the special files changed kind."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

from executor_helpers import TOY

NOT_REGULAR = "not a regular file; OctoPipe writes over none"

Argv = Callable[[dict[str, str]], list[str]]


def _out(f, name: str) -> str:
    return str(Path(f["OUT"]) / name)


def second_pass_files(root: Path) -> dict[str, str]:
    """The special files the cases name: FIFOs, a socket's stand-in, links to nowhere, output
    folders with something other than a regular file where a file goes."""
    made: dict[str, str] = {}

    def fifo(name: str) -> str:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(path)
        made[name] = str(path)
        return str(path)

    def folder(name: str) -> str:
        path = root / name
        path.mkdir(parents=True)
        made[name] = str(path)
        return str(path)

    fifo("fifo")
    fifo("fifo.png")
    fifo("fifo.json")
    fifo("fifo.html")
    loop = root / "self-link"
    loop.symlink_to(loop)
    made["self-link"] = str(loop)
    (root / "to-full.json").symlink_to("/dev/full")
    made["to-full.json"] = str(root / "to-full.json")
    (root / "to-nowhere.json").symlink_to(root / "no" / "such" / "file")
    made["to-nowhere.json"] = str(root / "to-nowhere.json")
    fifo("plan-out~plan.json fifo/plan.json")
    made["plan-out~plan.json fifo"] = str(root / "plan-out~plan.json fifo")
    folder("plan-out~timeline.png folder/timeline.png")
    made["plan-out~timeline.png folder"] = str(root / "plan-out~timeline.png folder")
    (root / "plan-out~schedule.csv to full").mkdir()
    (root / "plan-out~schedule.csv to full" / "schedule.csv").symlink_to("/dev/full")
    made["plan-out~schedule.csv to full"] = str(root / "plan-out~schedule.csv to full")
    folder("prep-out~train.bin folder/train.bin")
    made["prep-out~train.bin folder"] = str(root / "prep-out~train.bin folder")
    fifo("prep-out~meta.json fifo/meta.json")
    made["prep-out~meta.json fifo"] = str(root / "prep-out~meta.json fifo")
    fifo("logs~log.jsonl fifo/log.jsonl")
    made["logs~log.jsonl fifo"] = str(root / "logs~log.jsonl fifo")
    fifo("ckpts~lock fifo/.octopipe.lock")
    made["ckpts~lock fifo"] = str(root / "ckpts~lock fifo")
    (root / "link-loop-a").symlink_to(root / "link-loop-b")
    (root / "link-loop-b").symlink_to(root / "link-loop-a")
    made["link-loop"] = str(root / "link-loop-a")
    return made


def specials_changed(files: dict[str, str]) -> list[str]:
    """The special files that are no longer what `second_pass_files` made (empty: all are)."""
    wrong = []
    for name, path in files.items():
        if name.startswith(("fifo", "plan-out~plan.json", "prep-out~meta", "logs~", "ckpts~")):
            inner = {
                "plan-out~plan.json fifo": "plan.json",
                "prep-out~meta.json fifo": "meta.json",
                "logs~log.jsonl fifo": "log.jsonl",
                "ckpts~lock fifo": ".octopipe.lock",
            }.get(name)
            target = Path(path) / inner if inner else Path(path)
            if not stat.S_ISFIFO(os.lstat(target).st_mode):
                wrong.append(name)
    if not stat.S_ISCHR(os.stat("/dev/full").st_mode):
        wrong.append("/dev/full")
    if not stat.S_ISCHR(os.stat("/dev/null").st_mode):
        wrong.append("/dev/null")
    for name in ("to-full.json", "self-link", "to-nowhere.json", "link-loop"):
        if not os.path.islink(files[name]):
            wrong.append(name)
    return wrong


def _toy_run(f, *extra) -> list[str]:
    return ["run", "--plan", f["toy-plan.json"], "--model", TOY, *extra]


def _simulate(f, *extra) -> list[str]:
    return ["simulate", "--profile", f["profile.json"], "--plan", f["plan.json"], *extra]


def _prepare(f, out: str) -> list[str]:
    return ["prepare-data", "--tokenizer", "byte", "--input", f["text.txt"], "-o", out]


def _plan(f, out: str) -> list[str]:
    return [
        "plan",
        "--profile",
        f["profile.json"],
        "--microbatches",
        "4",
        "--time-budget",
        "1",
        "--quiet",
        "-o",
        out,
    ]


def _baseline(f, out: str) -> list[str]:
    return ["baseline", "--profile", f["profile.json"], "--schedule", "1f1b"] + [
        "--partition",
        "uniform",
        "--microbatches",
        "4",
        "-o",
        out,
    ]


OUTPUT_CASES: list[tuple[str, Argv, str]] = [
    (
        "profile-arch -o /dev/full",
        lambda f: ["profile-arch", "tiny-llama", "-o", "/dev/full"],
        "/dev/full is a character device, " + NOT_REGULAR,
    ),
    (
        "profile-arch -o /dev/null",
        lambda f: ["profile-arch", "tiny-llama", "-o", "/dev/null"],
        "/dev/null is a character device",
    ),
    (
        "profile-arch -o a FIFO",
        lambda f: ["profile-arch", "tiny-llama", "-o", f["fifo"]],
        "is a FIFO (named pipe), " + NOT_REGULAR,
    ),
    (
        "profile-arch -o a link to itself",
        lambda f: ["profile-arch", "tiny-llama", "-o", f["self-link"]],
        "is a broken symbolic link",
    ),
    (
        "profile-arch -o a link to /dev/full",
        lambda f: ["profile-arch", "tiny-llama", "-o", f["to-full.json"]],
        "to-full.json is a character device",
    ),
    (
        "profile-arch -o a link to nowhere",
        lambda f: ["profile-arch", "tiny-llama", "-o", f["to-nowhere.json"]],
        "to-nowhere.json is a broken symbolic link",
    ),
    ("baseline -o /dev/full", lambda f: _baseline(f, "/dev/full"), "is a character device"),
    ("baseline -o a FIFO", lambda f: _baseline(f, f["fifo.json"]), "is a FIFO (named pipe)"),
    (
        "simulate --trace /dev/full",
        lambda f: _simulate(f, "--trace", "/dev/full"),
        "--trace: /dev/full is a character device",
    ),
    ("simulate --png a FIFO", lambda f: _simulate(f, "--png", f["fifo.png"]), "--png: "),
    (
        "simulate --html a FIFO",
        lambda f: _simulate(f, "--html", f["fifo.html"]),
        "is a FIFO (named pipe)",
    ),
    (
        "simulate --memory-png a FIFO",
        lambda f: _simulate(f, "--memory-png", f["fifo.png"]),
        "fifo.png is a FIFO (named pipe)",
    ),
    (
        "simulate --trace a link to /dev/full",
        lambda f: _simulate(f, "--trace", f["to-full.json"]),
        "is a character device",
    ),
    (
        "calibrate -o /dev/full",
        lambda f: [
            "calibrate",
            "--profile",
            f["profile.json"],
            "--plan",
            f["plan.json"],
            "--trace",
            f["other-trace.json"],
            "-o",
            "/dev/full",
        ],
        "--output: /dev/full is a character device",
    ),
    (
        "profile -o /dev/full",
        lambda f: ["profile", "--model", "tiny-llama", "-o", "/dev/full"],
        "--output: /dev/full is a character device",
    ),
    (
        "profile -o a FIFO",
        lambda f: ["profile", "--model", "tiny-llama", "-o", f["fifo.json"]],
        "is a FIFO (named pipe)",
    ),
    ("plan -o a FIFO", lambda f: _plan(f, f["fifo"]), "is a FIFO (named pipe), not a folder"),
    ("plan -o /dev/full", lambda f: _plan(f, "/dev/full"), "is a character device, not a folder"),
    (
        "plan -o a folder whose plan.json is a FIFO",
        lambda f: _plan(f, f["plan-out~plan.json fifo"]),
        "plan.json is a FIFO (named pipe), " + NOT_REGULAR,
    ),
    (
        "plan -o a folder whose timeline.png is a folder",
        lambda f: _plan(f, f["plan-out~timeline.png folder"]),
        "timeline.png is a folder, " + NOT_REGULAR,
    ),
    (
        "plan -o a folder whose schedule.csv links to /dev/full",
        lambda f: _plan(f, f["plan-out~schedule.csv to full"]),
        "schedule.csv is a character device",
    ),
    (
        "plan -o a link loop",
        lambda f: _plan(f, f["link-loop"]),
        "is a symbolic link that leads nowhere",
    ),
    (
        "prepare-data -o a folder whose train.bin is a folder",
        lambda f: _prepare(f, f["prep-out~train.bin folder"]),
        "train.bin is a folder, " + NOT_REGULAR,
    ),
    (
        "prepare-data -o a folder whose meta.json is a FIFO",
        lambda f: _prepare(f, f["prep-out~meta.json fifo"]),
        "meta.json is a FIFO (named pipe)",
    ),
    ("prepare-data -o a FIFO", lambda f: _prepare(f, f["fifo"]), "not a folder"),
    (
        "run --trace /dev/full",
        lambda f: _toy_run(f, "--trace", "/dev/full"),
        "--trace: /dev/full is a character device",
    ),
    ("run --png a FIFO", lambda f: _toy_run(f, "--png", f["fifo.png"]), "is a FIFO (named pipe)"),
    (
        "run --log-dir whose log.jsonl is a FIFO",
        lambda f: _toy_run(f, "--log-dir", f["logs~log.jsonl fifo"]),
        "log.jsonl is a FIFO (named pipe)",
    ),
    (
        "run --checkpoint-dir whose lock is a FIFO",
        lambda f: _toy_run(f, "--checkpoint-dir", f["ckpts~lock fifo"], "--checkpoint-every", "1"),
        ".octopipe.lock is a FIFO (named pipe)",
    ),
    (
        "run --checkpoint-dir a link to itself",
        lambda f: _toy_run(f, "--checkpoint-dir", f["self-link"], "--checkpoint-every", "1"),
        "is a symbolic link that leads nowhere",
    ),
    (
        "run --checkpoint-dir a link loop, --resume",
        lambda f: _toy_run(f, "--checkpoint-dir", f["link-loop"], "--resume"),
        "is a symbolic link that leads nowhere",
    ),
    ("run --log-dir a FIFO", lambda f: _toy_run(f, "--log-dir", f["fifo"]), "not a folder"),
    (
        "export-hf -o /dev/full",
        lambda f: [
            "export-hf",
            "--checkpoint",
            f["ckpt~another seed"],
            "--model",
            f["hf-llama"],
            "-o",
            "/dev/full",
        ],
        "--output: /dev/full is a character device, not a folder",
    ),
]
