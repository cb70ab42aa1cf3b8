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
    _plans_of_other_models(root, made)
    (root / "link-loop-a").symlink_to(root / "link-loop-b")
    (root / "link-loop-b").symlink_to(root / "link-loop-a")
    made["link-loop"] = str(root / "link-loop-a")
    return made


def with_checksums(folder: Path, marker: str, **changes) -> None:
    """The checkpoint `folder`'s marker with the checksums a save records (or `changes`)."""
    import json

    from octopipe.runtime.checkpoint.checksums import digests, hashed_files

    path = folder / marker
    data = json.loads(path.read_text())
    data["checksums"] = digests(folder, hashed_files(folder, marker))
    path.write_text(json.dumps({**data, **changes}))


def flip_byte(path: Path, at: float = 0.5) -> None:
    """One byte of `path` changed in place, its length kept."""
    data = bytearray(path.read_bytes())
    data[int(len(data) * at)] ^= 0x01
    path.write_bytes(bytes(data))


# Checkpoints (the toy model's, one `step-2` each) whose bytes are not what their marker says,
# as `--resume` and `export-hf` see them: made by `test_bad_inputs._checkpoints`.
CHECKSUM_DAMAGES = {
    "ckpt~shard byte flipped": ("shard", 0.5, None),
    "ckpt~shard first byte flipped": ("shard", 0.0, None),
    "ckpt~shard last byte flipped": ("shard", 0.9999999, None),
    "ckpt~index byte flipped": (".metadata", 0.9, None),
    "ckpt~checksum not hex": (None, 0, {".metadata": "sha256:xyz"}),
    "ckpt~checksum names a path": (None, 0, {"../x": "sha256:" + "0" * 64}),
    "ckpt~checksums as text": (None, 0, "sha256:" + "0" * 64),
    "ckpt~checksums lack the shard": (None, 0, "index only"),
}
CHECKSUM_EXPECT = {
    "ckpt~shard byte flipped": "its bytes changed since the save (sha256 ",
    "ckpt~shard first byte flipped": "its bytes changed since the save",
    "ckpt~shard last byte flipped": "its bytes changed since the save",
    "ckpt~index byte flipped": "step-2/.metadata: ",  # unreadable, or its checksum differs
    "ckpt~checksum not hex": "checksums: .metadata: expected sha256:<64 hex digits>",
    "ckpt~checksum names a path": "checksums: '../x' is not a file of the checkpoint's folder",
    "ckpt~checksums as text": "checksums: Input should be a valid dictionary",
    "ckpt~checksums lack the shard": "has no checksum in the marker",
}


def damage_checksummed(folder: Path, marker: str, name: str) -> None:
    """Give the checkpoint `folder` its checksums, then the damage `name` of CHECKSUM_DAMAGES."""
    target, at, checksums = CHECKSUM_DAMAGES[name]
    if checksums is None:
        with_checksums(folder, marker)
    elif checksums == "index only":
        with_checksums(folder, marker)
        import json

        data = json.loads((folder / marker).read_text())
        data["checksums"] = {".metadata": data["checksums"][".metadata"]}
        (folder / marker).write_text(json.dumps(data))
    else:
        with_checksums(folder, marker, checksums=checksums)
    if target == "shard":
        flip_byte(next(folder.glob("*.distcp")), at)
    elif target is not None:
        flip_byte(folder / target, at)


def checkpoint_cases() -> list[tuple[str, Argv, str]]:
    """Each damaged checkpoint resumed (its folder) and exported (its `step-2`, and its folder
    for the first)."""
    cases: list[tuple[str, Argv, str]] = []
    for name, expect in CHECKSUM_EXPECT.items():
        cases.append(
            (
                f"run --resume {name}",
                lambda f, n=name: _toy_run(f, "--steps", "4", "--resume", "--checkpoint-dir", f[n]),
                expect,
            )
        )
        cases.append(
            (
                f"export-hf {name}",
                lambda f, n=name: [
                    "export-hf",
                    "--checkpoint",
                    str(Path(f[n]) / "step-2"),
                    "--model",
                    f["hf-llama"],
                    "-o",
                    _out(f, "hf"),
                ],
                expect,
            )
        )
    cases.append(
        (
            "export-hf a folder whose only checkpoint has a flipped byte",
            lambda f: [
                "export-hf",
                "--checkpoint",
                f["ckpt~shard byte flipped"],
                "--model",
                f["hf-llama"],
                "-o",
                _out(f, "hf"),
            ],
            "no complete checkpoint in",
        )
    )
    return cases


def _plans_of_other_models(root: Path, made: dict[str, str]) -> None:
    """Plans whose `profile` key says what they were made for, at odds with a run's model."""
    import json

    import octopipe as op
    from octopipe.plan import save_plan

    gemma = op.baseline(op.profile_from_config("tiny-gemma", devices=2), "1f1b", "uniform", 4)
    save_plan(gemma, root / "gemma-plan.json")
    made["gemma-plan.json"] = str(root / "gemma-plan.json")
    llama = op.baseline(
        op.profile_from_config("tiny-llama", devices=2, seq_len=128), "1f1b", "uniform", 4
    )
    save_plan(llama, root / "llama-plan-128.json")
    from executor_helpers import one_f_one_b

    save_plan(one_f_one_b(2, 2, num_layers=6), root / "hf-plan.json")  # the hf: Llama's 6
    made["hf-plan.json"] = str(root / "hf-plan.json")
    made["llama-plan-128.json"] = str(root / "llama-plan-128.json")
    for name, change in PLAN_CHANGES.items():
        data = json.loads((root / "llama-plan-128.json").read_text())
        change(data)
        (root / name).write_text(json.dumps(data))
        made[name] = str(root / name)
    job = root / "job~resume maybe.toml"
    job.write_text("[checkpoint]\nresume = 'maybe'\ndir = 'x'\n")
    made["job~resume maybe"] = str(job)
    job = root / "job~resume as number.toml"
    job.write_text("[checkpoint]\nresume = 1\ndir = 'x'\n")
    made["job~resume as number"] = str(job)
    (root / "resume~step-4 a file").mkdir()
    (root / "resume~step-4 a file" / "step-4").write_text("not a checkpoint")
    made["resume~step-4 a file"] = str(root / "resume~step-4 a file")


def _parallelism(**degrees):
    def change(data):
        data["parallelism"] = {"tp": 1, "pp": 2, "dp": 1, "microbatch_size": 1, **degrees}

    return change


def _profile_key(**keys):
    def change(data):
        data["profile"] = {**data["profile"], **keys}

    return change


PLAN_CHANGES = {  # the tiny Llama's plan (seq_len 128), changed one way each
    "llama-plan~zero 2": _parallelism(zero=2),
    "llama-plan~zero as text": _parallelism(zero="1"),
    "llama-plan~zero 1.0": _parallelism(zero=1.0),
    "llama-plan~recompute unknown": _parallelism(recompute="some"),
    "llama-plan~stage recompute in capitals": lambda d: d["stages"][0].update(recompute="FULL"),
    "llama-plan~made for tiny-moe": _profile_key(name="tiny-moe-tp1-h100"),
    "llama-plan~made for llama3-8b on an a100": _profile_key(name="llama3-8b-tp8-a100"),
    "llama-plan~seq_len beyond the positions": _profile_key(seq_len=257),
}


def _tiny_llama(f, plan: str, *extra) -> list[str]:
    return ["run", "--plan", f[plan], "--model", "tiny-llama", *extra]


MISMATCH_CASES: list[tuple[str, Argv, str]] = [
    (
        "run tiny-gemma's plan on tiny-llama",
        lambda f: _tiny_llama(f, "gemma-plan.json"),
        "profile.name: a plan made for tiny-gemma (its profile 'tiny-gemma-tp1-h100'), not "
        "tiny-llama",
    ),
    (
        "run a plan made for tiny-moe",
        lambda f: _tiny_llama(f, "llama-plan~made for tiny-moe"),
        "a plan made for tiny-moe",
    ),
    (
        "run a plan made for llama3-8b",
        lambda f: _tiny_llama(f, "llama-plan~made for llama3-8b on an a100"),
        "a plan made for llama3-8b (its profile 'llama3-8b-tp8-a100'), not tiny-llama",
    ),
    (
        "run a plan of 4,096 tokens on 256 positions",
        lambda f: _tiny_llama(f, "plan.json"),
        "--seq-len: 4,096 tokens (what the plan was made for) are more than tiny-llama's 256 "
        "positions",
    ),
    (
        "run a plan of 257 tokens on 256 positions",
        lambda f: _tiny_llama(f, "llama-plan~seq_len beyond the positions"),
        "257 tokens (what the plan was made for) are more than",
    ),
    (
        "run --seq-len 512 on 256 positions",
        lambda f: _tiny_llama(f, "llama-plan-128.json", "--seq-len", "512"),
        "--seq-len: 512 tokens are more than tiny-llama's 256 positions",
    ),
    (
        "run --seq-len 4096 on an hf: model of 64 positions",
        lambda f: [
            "run",
            "--plan",
            f["hf-plan.json"],
            "--model",
            f["hf-llama"],
            "--seq-len",
            "4096",
        ],
        "--seq-len: 4,096 tokens are more than",
    ),
    (
        "run a plan of ZeRO-2",
        lambda f: _tiny_llama(f, "llama-plan~zero 2"),
        "parallelism.zero: expected 0, 1 or 3 (ZeRO-2 is neither planned nor run), got 2",
    ),
    (
        "run a plan of ZeRO '1'",
        lambda f: _tiny_llama(f, "llama-plan~zero as text"),
        "parallelism.zero: expected 0, 1 or 3",
    ),
    (
        "run a plan of ZeRO 1.0",
        lambda f: _tiny_llama(f, "llama-plan~zero 1.0"),
        "parallelism.zero: expected 0, 1 or 3",
    ),
    (
        "simulate a plan of ZeRO-2",
        lambda f: ["simulate", "--profile", f["profile.json"], "--plan", f["llama-plan~zero 2"]],
        "parallelism.zero: expected 0, 1 or 3",
    ),
    (
        "run a plan of an unknown recompute",
        lambda f: _tiny_llama(f, "llama-plan~recompute unknown"),
        "parallelism.recompute: expected one of",
    ),
    (
        "run a plan whose stage recomputes FULL",
        lambda f: _tiny_llama(f, "llama-plan~stage recompute in capitals"),
        "stages[0].recompute: expected one of none, selective, full, got 'FULL'",
    ),
    (
        "run --resume=require, no folder",
        lambda f: _toy_run(f, "--resume=require", "--checkpoint-dir", _out(f, "none")),
        "--resume: require: no checkpoint in",
    ),
    (
        "run --resume require, step-4 a file",
        lambda f: _toy_run(f, "--resume", "require", "--checkpoint-dir", f["resume~step-4 a file"]),
        "--resume: require: no checkpoint in",
    ),
    (
        "run --resume=maybe",
        lambda f: _toy_run(f, "--resume=maybe", "--checkpoint-dir", "x"),
        "argument --resume: invalid choice: 'maybe'",
    ),
    (
        "run --resume=require alone",
        lambda f: _toy_run(f, "--resume=require"),
        "--resume: needs --checkpoint-dir",
    ),
    (
        "run a job file of resume 'maybe'",
        lambda f: ["run", "--config", f["job~resume maybe"]],
        "checkpoint.resume: expected one of no, yes, require, got 'maybe'",
    ),
    (
        "run a job file of resume 1",
        lambda f: ["run", "--config", f["job~resume as number"]],
        "checkpoint.resume: expected text, got 1",
    ),
]


def all_times_zero(data):
    for layer in data["layers"]:
        layer.update(f=0.0, b=0.0, w=0.0)
    return data


def _hf_config(**changes):
    """The tiny Llama's config.json with `changes` (None deletes a key)."""

    def change(config):
        config = {**config, **changes}
        return {k: v for k, v in config.items() if v is not None}

    return change


CONFIG_CHANGES = {  # config.json faults, read by profile-arch and by run --model hf:
    "cfg~hidden 66 over 4 heads": (
        _hf_config(hidden_size=66),
        "num_attention_heads: 4 heads do not divide hidden_size 66 (a head of 16.5 dimensions)",
    ),
    "cfg~heads beyond the hidden size": (
        _hf_config(num_attention_heads=128, num_key_value_heads=128),
        "num_attention_heads: 128 heads do not divide hidden_size 64",
    ),
    "cfg~odd head size": (
        _hf_config(hidden_size=36, num_attention_heads=4, num_key_value_heads=2),
        "a head of 9 dimensions: rotary embeddings need an even head size",
    ),
    "cfg~head_dim as text": (_hf_config(head_dim="16"), "head_dim: expected an integer >= 1"),
    "cfg~head_dim 0": (_hf_config(head_dim=0), "head_dim: expected an integer >= 1 (got 0)"),
    "cfg~rope_scaling as text": (
        _hf_config(rope_scaling="linear"),
        "rope_scaling: expected an object such as",
    ),
    "cfg~rope_scaling as list": (_hf_config(rope_scaling=[2.0]), "rope_scaling: expected an"),
    "cfg~rope_type unknown": (
        _hf_config(rope_scaling={"rope_type": "nosuch", "factor": 2.0}),
        "rope_scaling.rope_type: unknown rope_type 'nosuch'; transformers knows default",
    ),
    "cfg~rope type as number": (
        _hf_config(rope_scaling={"type": 2, "factor": 2.0}),
        "rope_scaling.rope_type: unknown rope_type 2",
    ),
    "cfg~linear without factor": (
        _hf_config(rope_scaling={"rope_type": "linear"}),
        "rope_scaling.factor: rope_type 'linear' needs factor",
    ),
    "cfg~linear factor as text": (
        _hf_config(rope_scaling={"rope_type": "linear", "factor": "2"}),
        "rope_scaling.factor: expected a positive number (got '2')",
    ),
    "cfg~linear factor below 1": (
        _hf_config(rope_scaling={"rope_type": "linear", "factor": 0.5}),
        "rope_scaling.factor: expected a number >= 1 (got 0.5)",
    ),
    "cfg~llama3 without high_freq_factor": (
        _hf_config(
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "original_max_position_embeddings": 64,
            }
        ),
        "rope_scaling.high_freq_factor: rope_type 'llama3' needs high_freq_factor",
    ),
    "cfg~llama3 original positions as float": (
        _hf_config(
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64.0,
            }
        ),
        "rope_scaling.original_max_position_embeddings: expected an integer >= 1",
    ),
    "cfg~longrope factors as text": (
        _hf_config(
            rope_scaling={"rope_type": "longrope", "short_factor": "1", "long_factor": [1.0]}
        ),
        "rope_scaling.short_factor: expected a list of positive numbers",
    ),
    "cfg~rope_parameters unknown type": (
        _hf_config(rope_parameters={"rope_type": "spiral", "rope_theta": 1e4}),
        "rope_parameters.rope_type: unknown rope_type 'spiral'",
    ),
    "cfg~yarn beta_fast as text": (
        _hf_config(rope_scaling={"rope_type": "yarn", "factor": 2.0, "beta_fast": "x"}),
        "rope_scaling.beta_fast: expected a number >= 0 (got 'x')",
    ),
    "cfg~yarn mscale as text": (
        _hf_config(rope_scaling={"rope_type": "yarn", "factor": 2.0, "mscale": "a"}),
        "rope_scaling.mscale: expected a number >= 0",
    ),
    "cfg~llama3 high_freq_factor below low": (
        _hf_config(
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 4.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            }
        ),
        "rope_scaling.high_freq_factor: must be above low_freq_factor 4.0 (got 4.0)",
    ),
    "cfg~longrope factors of the wrong length": (
        _hf_config(
            rope_scaling={
                "rope_type": "longrope",
                "short_factor": [1.0] * 3,
                "long_factor": [1.0] * 3,
            }
        ),
        "rope_scaling.short_factor: expected 8 factors, one per rotary frequency (got 3)",
    ),
    "cfg~partial_rotary_factor as text": (
        _hf_config(partial_rotary_factor="half"),
        "partial_rotary_factor: expected a number in (0, 1] (got 'half')",
    ),
    "cfg~partial_rotary_factor 2": (
        _hf_config(partial_rotary_factor=2.0),
        "partial_rotary_factor: expected a number in (0, 1] (got 2.0)",
    ),
    "cfg~a million layers": (
        _hf_config(num_hidden_layers=1_000_000),
        "num_hidden_layers: 1,000,000 layers in all; at most 4,096 are estimated or built",
    ),
    "cfg~4,097 layers": (
        _hf_config(num_hidden_layers=4097),
        "num_hidden_layers: 4,097 layers in all; at most 4,096",
    ),
    "cfg~text and vision layers beyond the cap": (
        _hf_config(
            text_config={"num_hidden_layers": 3000}, vision_config={"num_hidden_layers": 2000}
        ),
        "vision_config.num_hidden_layers: 5,004 layers in all",
    ),
}


def _p(f) -> str:
    return _out(f, "p.json")


def config_files(root: Path, base: dict) -> dict[str, str]:
    """Each CONFIG_CHANGES config twice: a config.json file (profile-arch) and an hf: folder
    (run), beside an all-zero profile; and the tiny Llama made for 2^20 positions."""
    import json

    made = {"long-positions.json": str(root / "long-positions.json")}
    long = {**base, "max_position_embeddings": 2**20}
    (root / "long-positions.json").write_text(json.dumps(long))
    for name, (change, _) in CONFIG_CHANGES.items():
        folder = root / name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(change(dict(base))))
        made[name] = str(folder)
    return made


def config_cases() -> list[tuple[str, Argv, str]]:
    cases: list[tuple[str, Argv, str]] = []
    for name, (_, expect) in CONFIG_CHANGES.items():
        cases.append(
            (
                f"profile-arch {name}",
                lambda f, n=name: ["profile-arch", f"{f[n]}/config.json", "-o", _out(f, "p.json")],
                expect,
            )
        )
        cases.append(
            (
                f"run --model hf: {name}",
                lambda f, n=name: ["run", "--plan", f["hf-plan.json"], "--model", f"hf:{f[n]}"],
                expect,
            )
        )
    cases += [
        (
            "profile --seq-len beyond the model's positions",
            lambda f: ["profile", "--model", "tiny-llama", "--seq-len", "100000", "-o", _p(f)],
            "--seq-len: 100,000 tokens are more than tiny-llama's 256 positions",
        ),
        (  # 4 masks of 2^40 pairs: beyond any machine's memory
            "profile a million tokens of a model of long positions",
            lambda f: (
                ["profile", "--model", f["long-positions.json"], "--seq-len", "1048576"]
                + ["--micro-batch-size", "1", "-o", _p(f)]
            ),
            "--seq-len: measuring layers.3 at 1,048,576 tokens x 1 sample holds at least "
            "20,498.2 GiB of activations (4 microbatches at once); this cpu has",
        ),
        (
            "profile hf: of a million layers",
            lambda f: ["profile", "--model", f"hf:{f['cfg~a million layers']}", "-o", _p(f)],
            "num_hidden_layers: 1,000,000 layers in all",
        ),
    ]
    cases.append(
        (
            "simulate a profile of zero times",
            lambda f: ["simulate", "--profile", f["profile~all zero"], "--plan", f["plan.json"]],
            "layers: every layer's f, b and w is 0: nothing to plan or simulate",
        )
    )
    cases.append(
        (
            "plan a profile of zero times",
            lambda f: ["plan", "--profile", f["profile~all zero"], "-o", _out(f, "x")],
            "every layer's f, b and w is 0",
        )
    )
    return cases


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
    (
        "run --data a folder without train.bin",
        lambda f: _toy_run(f, "--data", f["OUT"]),
        "is a folder without train.bin (prepare-data's folder holds one)",
    ),
    (
        "run --data a FIFO",
        lambda f: _toy_run(f, "--data", f["fifo"]),
        "is a FIFO (named pipe), not a file of token ids",
    ),
    (
        "run --data /dev/null",
        lambda f: _toy_run(f, "--data", "/dev/null"),
        "--data: /dev/null is a character device, not a file of token ids",
    ),
    (
        "run --val-data a folder without val.bin",
        lambda f: _toy_run(f, "--val-data", f["OUT"]),
        "is a folder without val.bin (prepare-data's folder holds one)",
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
