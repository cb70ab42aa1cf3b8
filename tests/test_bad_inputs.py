"""Every command, given bad input, exits 2 with exactly one line on stderr, no traceback, and no
output file written or half-written.

The cases are a table: bad values for every numeric flag, generated from the flags' own types
(their bounds, `commands/_flags.py`); mutations of valid files (profiles, plans, traces, model
configs, checkpoints), each one fault; and the faults found by hand (the hardening issue's
list). Each runs `octopipe.cli.main` in this process, with its outputs in a folder of its own
that holds one old file: afterwards the folder holds that file alone, unchanged. A few run the
real entry point (`python -m octopipe`) in a fresh interpreter. None starts a rank: a run is
refused before its processes start.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from bad_inputs_second import (
    CHECKSUM_DAMAGES,
    MISMATCH_CASES,
    OUTPUT_CASES,
    all_times_zero,
    checkpoint_cases,
    config_cases,
    config_files,
    damage_checksummed,
    second_pass_files,
    specials_changed,
)
from bad_inputs_third import THIRD_CASES, third_pass_files
from executor_helpers import SGD_FLAGS, TOY, gpipe, layer_count, one_f_one_b
from model_zoo import HF_CONFIGS

import octopipe as op
from octopipe.cli import build_parser, main
from octopipe.plan import save_plan
from octopipe.profile import save_profile
from octopipe.runtime.checkpoint.folder import FORMAT, MARKER
from octopipe.runtime.model.load import load_recipe

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")

OLD = "old output, must survive\n"


@dataclass(frozen=True)
class Case:
    id: str
    argv: Callable[[dict[str, str]], list[str]]  # the files' paths -> the command line
    expect: str  # a part of the one line


# --- valid inputs, built once --------------------------------------------------------------------


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("inputs")
    paths: dict[str, str] = {}

    def put(name: str, data) -> str:
        path = root / name
        if isinstance(data, bytes):
            path.write_bytes(data)
        else:
            path.write_text(data if isinstance(data, str) else json.dumps(data))
        paths[name] = str(path)
        return str(path)

    profile = op.profile_from_config("tiny-llama", devices=2)
    save_profile(profile, root / "profile.json")
    paths["profile.json"] = str(root / "profile.json")
    plan = op.baseline(profile, "1f1b", "uniform", 4)
    save_plan(plan, root / "plan.json")
    paths["plan.json"] = str(root / "plan.json")
    other = op.baseline(profile, "zbh1", "uniform", 4)  # its backward split in I and W
    save_plan(other, root / "other-plan.json")
    paths["other-plan.json"] = str(root / "other-plan.json")
    from octopipe.sim import Simulator
    from octopipe.trace import write_trace

    write_trace(root / "other-trace.json", Simulator(profile).run(other).events)
    paths["other-trace.json"] = str(root / "other-trace.json")
    for name, data in MUTANTS.items():
        base = json.loads((root / name.split("~")[0]).read_text())
        put(name, data(base) if callable(data) else data)
    save_plan(gpipe(2, 2), root / "toy-plan.json")
    paths["toy-plan.json"] = str(root / "toy-plan.json")
    named = gpipe(2, 2).with_layer_names([f"blocks.{i}" for i in range(8)])
    save_plan(named, root / "toy-named-plan.json")
    paths["toy-named-plan.json"] = str(root / "toy-named-plan.json")
    save_plan(one_f_one_b(2, 2, num_layers=layer_count("tiny-llama")), root / "tiny-plan.json")
    paths["tiny-plan.json"] = str(root / "tiny-plan.json")
    hf = HF_CONFIGS["llama"]
    (root / "hf-llama").mkdir()
    (root / "hf-llama" / "config.json").write_text(json.dumps(hf))
    paths["hf-llama"] = f"hf:{root / 'hf-llama'}"
    for name, change in HF_MUTANTS.items():
        folder = root / name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(change(dict(hf))))
        paths[name] = f"hf:{folder}"
    arch = json.loads(
        Path(op.__file__).parent.joinpath("costmodel/configs/tiny-llama.json").read_text()
    )
    for name, change in ARCH_MUTANTS.items():
        put(name, change(dict(arch)))
    for name, config in NOT_HF.items():
        put(name, config)
    for name, content in RAW_FILES.items():
        put(f"raw~{name}", content)
    tokens = np.arange(0, 5000, dtype=np.uint16)
    put("tokens.bin", tokens.tobytes())
    put("odd.bin", tokens.tobytes()[:-1])
    paths.update(_checkpoints(root))
    paths.update(_token_folders(root))
    put("text.txt", "some text\n")
    put("latin1.txt", "caf\xe9 au lait".encode("latin-1"))
    put("no-text.jsonl", '{"text": "fine"}\n{"body": "no text key"}\n')
    put("not-a-tokenizer.json", '{"model": 3}')
    paths["ran"] = str(root / "ran")  # what the crafted checkpoints would create
    put("a-file", "not a folder")
    paths.update(second_pass_files(root))
    paths.update(config_files(root, arch))
    paths.update(third_pass_files(root))
    put("profile~all zero", all_times_zero(json.loads((root / "profile.json").read_text())))
    return paths


# Files derived from valid ones ("base~fault": the base file, one fault).
def _set(path: str, value):
    """A change of the value at `path` (dotted; list indices as numbers) to `value`."""

    def key_of(target, key: str):
        return int(key) if isinstance(target, list) else key

    def change(data):
        target, keys = data, path.split(".")
        for key in keys[:-1]:
            target = target[key_of(target, key)]
        last = key_of(target, keys[-1])
        if value is _DELETE:
            del target[last]
        else:
            target[last] = value
        return data

    return change


_DELETE = object()

PROFILE_FAULTS = {
    "f as text": ("layers.1.f", "0.1", "layers[1].f: Input should be a valid number"),
    "f as true": ("layers.1.f", True, "layers[1].f: Input should be a valid number"),
    "f negative": ("layers.1.f", -1.0, "layers[1].f: Input should be greater than or equal to 0"),
    "f beyond a million seconds": ("layers.1.f", 2e6, "layers[1].f: Input should be less than"),
    "f missing": ("layers.1.f", _DELETE, "layers[1].f: missing field"),
    "f as list": ("layers.1.f", [1], "layers[1].f: Input should be a valid number"),
    "act_bytes as float": (
        "layers.1.act_bytes",
        1.5,
        "layers[1].act_bytes: Input should be a valid integer",
    ),
    "act_bytes as text": (
        "layers.1.act_bytes",
        "4",
        "layers[1].act_bytes: Input should be a valid integer",
    ),
    "act_bytes as true": (
        "layers.1.act_bytes",
        True,
        "layers[1].act_bytes: Input should be a valid integer",
    ),
    "act_bytes negative": (
        "layers.1.act_bytes",
        -1,
        "layers[1].act_bytes: Input should be greater",
    ),
    "param_bytes beyond 2^60": (
        "layers.1.param_bytes",
        2**61,
        "layers[1].param_bytes: Input should be less",
    ),
    "wact over act": ("layers.1.wact_bytes", 10**15, "exceeds act_bytes"),
    "name as number": ("layers.1.name", 5, "layers[1].name: Input should be a valid string"),
    "name of another layer": (
        "layers.1.name",
        "tok_embeddings",
        "layers[1].name: 'tok_embeddings' is also",
    ),
    "layers empty": ("layers", [], "layers: the layer list is empty"),
    "layers as text": ("layers", "many", "layers: Input should be a valid tuple"),
    "no layers": ("layers", _DELETE, "layers: missing field"),
    "devices empty": ("devices", [], "devices: 0 devices; expected 1 to 4,096"),
    "speed 0": ("devices.0.speed", 0, "devices[0].speed: Input should be greater than or equal"),
    "speed as text": ("devices.0.speed", "1", "devices[0].speed: Input should be a valid number"),
    "speed huge": ("devices.0.speed", 1e9, "devices[0].speed: Input should be less"),
    "memory negative": (
        "devices.0.memory_bytes",
        -1,
        "devices[0].memory_bytes: Input should be greater",
    ),
    "memory beyond 2^60": (
        "devices.0.memory_bytes",
        1e300,
        "devices[0].memory_bytes: must be at most",
    ),
    "node negative": ("devices.0.node", -1, "devices[0].node: Input should be greater"),
    "node as float": ("devices.0.node", 1.0, "devices[0].node: Input should be a valid integer"),
    "bandwidth 0": (
        "link.bandwidth",
        0,
        "link.bandwidth: Input should be greater than or equal to 1",
    ),
    "bandwidth tiny": (
        "link.bandwidth",
        1e-300,
        "link.bandwidth: Input should be greater than or equal",
    ),
    "latency negative": ("link.latency", -1e-5, "link.latency: Input should be greater"),
    "latency as text": ("link.latency", "1e-5", "link.latency: Input should be a valid number"),
    "tensor_parallel as text": (
        "tensor_parallel",
        "4",
        "tensor_parallel: Input should be a valid integer",
    ),
    "tensor_parallel 0": ("tensor_parallel", 0, "tensor_parallel: Input should be greater"),
    "tensor_parallel as float": (
        "tensor_parallel",
        2.0,
        "tensor_parallel: Input should be a valid integer",
    ),
    "microbatch_size 0": ("microbatch_size", 0, "microbatch_size: Input should be greater"),
    "microbatch_size as text": (
        "microbatch_size",
        "2",
        "microbatch_size: Input should be a valid integer",
    ),
    "dp degree 0": (
        "data_parallel",
        {"degree": 0},
        "data_parallel.degree: Input should be greater",
    ),
    "dp bucket 0": (
        "data_parallel",
        {"degree": 2, "bucket_bytes": 0},
        "data_parallel.bucket_bytes",
    ),
    "dp sharded as text": (
        "data_parallel",
        {"sharded": "yes"},
        "data_parallel.sharded: Input should be a valid boolean",
    ),
    "links half": ("links", {"intra_node": {"bandwidth": 1e9}}, "links.inter_node: missing field"),
    "recompute b as text": (
        "layers.1.recompute.full.b",
        "0.1",
        "layers[1].recompute.full.b: Input should be a valid number",
    ),
    "recompute act negative": (
        "layers.1.recompute.selective.act_bytes",
        -1,
        "layers[1].recompute.selective.act_bytes: Input should be greater",
    ),
    "recompute without b": (
        "layers.1.recompute.full",
        {"act_bytes": 1, "wact_bytes": 1},
        "layers[1].recompute.full.b: missing field",
    ),
    "recompute as list": (
        "layers.1.recompute",
        ["full"],
        "layers[1].recompute: Input should be a valid dictionary",
    ),
    "format of another": ("format", "octopipe.profile/9", "format: unknown format"),
    "not an object": ("", None, ""),
}
PLAN_FAULTS = {
    "num_devices as text": (
        "num_devices",
        "2",
        "num_devices: expected a positive integer, got '2'",
    ),
    "num_devices 0": ("num_devices", 0, "num_devices: expected a positive integer, got 0"),
    "num_devices as true": ("num_devices", True, "num_devices: expected a positive integer"),
    "num_devices a billion": (
        "num_devices",
        10**9,
        "num_devices: 1,000,000,000 is more than the 4,096",
    ),
    "num_microbatches 2^40": (
        "num_microbatches",
        2**40,
        "num_microbatches: 1,099,511,627,776 is more than",
    ),
    "num_microbatches as float": (
        "num_microbatches",
        4.0,
        "num_microbatches: expected a positive integer",
    ),
    "stages empty": ("stages", [], "stages: expected a non-empty list of stages"),
    "stage range as text": ("stages.0.layers", [0, "3"], "stages[0].layers: expected [start, end)"),
    "stage range negative": ("stages.0.layers", [-1, 3], "stages[0].layers: expected [start, end)"),
    "stage device -1": ("stages.0.device", -1, "stages[0].device: device -1 out of range"),
    "stage device 9": ("stages.0.device", 9, "stages[0].device: device 9 out of range"),
    "stage device as text": ("stages.0.device", "0", "stages[0].device: expected a device index"),
    "schedule as list": ("schedule", [], "schedule: expected an object"),
    "schedule device as name": (
        "schedule",
        {"first": []},
        "schedule: device key must be a device index",
    ),
    "schedule action unknown": ("schedule.0.0", "0Q0", "schedule.0[0]"),
    "schedule action in other digits": ("schedule.0.0", "٠F٠", "schedule.0[0]"),
    "schedule action duplicated": ("schedule.0.1", "0F0", "appears twice"),
    "schedule action missing": ("schedule.1", [], "is missing"),
    "parallelism tp as text": (
        "parallelism",
        {"tp": "2", "pp": 2, "dp": 1, "microbatch_size": 1},
        "parallelism.tp: expected a positive integer",
    ),
    "parallelism pp mismatch": (
        "parallelism",
        {"tp": 1, "pp": 3, "dp": 1, "microbatch_size": 1},
        "parallelism.pp: pp is 3",
    ),
    "parallelism zero 4": (
        "parallelism",
        {"tp": 1, "pp": 2, "dp": 1, "microbatch_size": 1, "zero": 4},
        "parallelism.zero: expected 0, 1 or 3",
    ),
    "parallelism zero true": (
        "parallelism",
        {"tp": 1, "pp": 2, "dp": 1, "microbatch_size": 1, "zero": True},
        "parallelism.zero: expected 0, 1 or 3",
    ),
    "parallelism dp huge": (
        "parallelism",
        {"tp": 1, "pp": 2, "dp": 10**9, "microbatch_size": 1},
        "parallelism.dp: 1,000,000,000 is more than",
    ),
    "layer_names of another model": (
        "layer_names.0",
        "embed",
        "layer 0 is 'embed' in the plan but 'tok_embeddings' in the profile",
    ),
    "layer_names too few": ("layer_names", ["a"], "layer_names: 1 names for the stages' 7 layers"),
    "predicted time as text": (
        "predicted.iteration_time",
        "fast",
        "predicted.iteration_time: expected a number of seconds",
    ),
    "stage recompute unknown": (
        "stages.0.recompute",
        "half",
        "stages[0].recompute: expected one of none, selective, full, got 'half'",
    ),
    "stage recompute as true": (
        "stages.1.recompute",
        True,
        "stages[1].recompute: expected one of none, selective, full, got True",
    ),
    "stage recompute the profile does not price": (
        "stages",
        [
            {"layers": [0, 1], "device": 0, "recompute": "full"},  # the embedding alone
            {"layers": [1, 7], "device": 1},
        ],
        "stages[0].recompute: no layer of [0, 1) has full recomputation costs",
    ),
    "format of another": ("format", "octopipe.plan/2", "format: unknown format"),
    "profile devices not the plan's": (
        "profile.devices",
        3,
        "profile.devices: the plan's profile lists 3 devices but the plan has 2",
    ),
    "profile microbatch size 0": (
        "profile.microbatch_size",
        0,
        "profile.microbatch_size: expected a positive integer",
    ),
    "profile seq_len as text": (
        "profile.seq_len",
        "4096",
        "profile.seq_len: expected a positive integer, got '4096'",
    ),
    "profile as list": ("profile", [], "profile: expected an object"),
}
TRACE_FAULTS = {
    "events not a list": ("traceEvents", {}, "expected a trace object with a 'traceEvents' list"),
    "pid as text": ("traceEvents.6.pid", "0", "pid: expected an integer >= 0, got '0'"),
    "pid negative": ("traceEvents.6.pid", -1, "pid: expected an integer >= 0"),
    "ts as text": ("traceEvents.6.ts", "0", "ts: expected a number of microseconds"),
    "dur negative": ("traceEvents.6.dur", -5.0, "dur: expected a number of microseconds >= 0"),
    "stage as float": ("traceEvents.6.args.stage", 0.5, "stage: expected an integer >= 0"),
    "kind unknown": ("traceEvents.6.args.kind", "Q", "args.kind: expected one of F, B, I, W"),
}


def _mutants() -> dict[str, object]:
    out: dict[str, object] = {}
    for base, faults in (
        ("profile.json", PROFILE_FAULTS),
        ("plan.json", PLAN_FAULTS),
        ("other-trace.json", TRACE_FAULTS),
    ):
        for fault, (path, value, _) in faults.items():
            out[f"{base}~{fault}"] = [] if not path else _set(path, value)
    return out


MUTANTS = _mutants()

RAW_FILES = {  # whole files, whatever they are meant to be
    "NaN": '{"format": "octopipe.profile/1", "layers": [{"f": NaN}]}',
    "Infinity": '{"layers": [{"f": Infinity}]}',
    "1e400": '{"layers": [{"f": 1e400}]}',
    "key twice": '{"layers": [], "layers": []}',
    "truncated": '{"format": "octopipe.profile/1", "layers": [',
    "empty": "",
    "binary": b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe",
    "digits": '{"n": ' + "9" * 5000 + "}",
}
RAW_EXPECT = {
    "NaN": "NaN is not a JSON number",
    "Infinity": "Infinity is not a JSON number",
    "1e400": "the number 1e400 is beyond a float's range",
    "key twice": "key 'layers' is given twice in one object",
    "truncated": "malformed JSON",
    "empty": "malformed JSON",
    "binary": "not UTF-8 text",
    "digits": "a number is beyond any size OctoPipe reads",
}

HF_MUTANTS = {
    "hf~no hidden_size": lambda c: {k: v for k, v in c.items() if k != "hidden_size"},
    "hf~hidden_size as text": lambda c: {**c, "hidden_size": "32"},
    "hf~hidden_size as true": lambda c: {**c, "hidden_size": True},
    "hf~no model_type": lambda c: {k: v for k, v in c.items() if k != "model_type"},
    "hf~unknown model_type": lambda c: {**c, "model_type": "nosuch"},
    "hf~remote code": lambda c: {**c, "auto_map": {"AutoModelForCausalLM": "m.Model"}},
    "hf~heads not dividing": lambda c: {**c, "num_key_value_heads": 3},
    "hf~layers beyond a million": lambda c: {**c, "num_hidden_layers": 2_000_000},
    "hf~no causal LM": lambda c: {**c, "model_type": "bert"},
    "hf~gpt2": lambda c: {**c, "model_type": "gpt2"},
    "hf~nemotron_h": lambda c: {**c, "model_type": "nemotron_h"},
}
HF_EXPECT = {
    "hf~no hidden_size": "hidden_size: missing field",
    "hf~hidden_size as text": "hidden_size: expected an integer >= 1 (got '32')",
    "hf~hidden_size as true": "hidden_size: expected an integer >= 1 (got True)",
    "hf~no model_type": "model_type: no model_type",
    "hf~unknown model_type": "unknown model_type 'nosuch'",
    "hf~remote code": "auto_map: names code of its own",
    "hf~heads not dividing": "num_key_value_heads: 3 does not divide 4 heads",
    "hf~layers beyond a million": "num_hidden_layers: 2,000,000 layers in all; at most 4,096",
    "hf~no causal LM": "is not a decoder-only causal LM of the Llama structure",
    "hf~gpt2": "model_type: 'gpt2' models do not run on `--model hf:` (it runs Llama,",
    "hf~nemotron_h": "model_type: 'nemotron_h' models do not run on `--model hf:`",
}
ARCH_MUTANTS = {
    "arch~no hidden_size": lambda c: {k: v for k, v in c.items() if k != "hidden_size"},
    "arch~hidden_size as text": lambda c: {**c, "hidden_size": "64"},
    "arch~vocab as true": lambda c: {**c, "vocab_size": True},
    "arch~layers beyond a million": lambda c: {**c, "num_hidden_layers": 10**7},
    "arch~width beyond 2^31": lambda c: {**c, "intermediate_size": 2**40},
    "arch~unknown model_type": lambda c: {**c, "model_type": "nosuch"},
    "arch~rope as text": lambda c: {**c, "rope_theta": "1e4"},
}
ARCH_EXPECT = {
    "arch~no hidden_size": "hidden_size: missing field",
    "arch~hidden_size as text": "hidden_size: expected an integer >= 1 (got '64')",
    "arch~vocab as true": "vocab_size: expected an integer >= 1 (got True)",
    "arch~layers beyond a million": "num_hidden_layers: 10,000,000 layers in all; at most 4,096",
    "arch~width beyond 2^31": "intermediate_size: 1,099,511,627,776 is more than",
    "arch~unknown model_type": "model_type: unsupported model_type 'nosuch'",
    "arch~rope as text": "rope_theta: expected a positive number (got '1e4')",
}
# Families `hf:` does not run (no `model.layers`): `profile-arch --layer-names hf` names no
# layers for them, refused in the words `run --model hf:` uses (above), naming what it runs.
NOT_HF = {
    "not-hf~gpt2": {
        "model_type": "gpt2",
        "n_embd": 64,
        "n_layer": 2,
        "n_head": 4,
        "vocab_size": 96,
        "n_positions": 64,
    },
    "not-hf~gpt_neox": {
        "model_type": "gpt_neox",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "vocab_size": 96,
        "max_position_embeddings": 64,
    },
}
NOT_HF_TYPES = {"not-hf~gpt2": "gpt2", "not-hf~gpt_neox": "gpt_neox", "nemotron-h-8b": "nemotron_h"}
HF_FAMILIES = "(it runs Llama, Qwen2, Qwen3, Mistral, Mixtral, Qwen2-MoE, Qwen3-MoE)"


def _checkpoints(root: Path) -> dict[str, str]:
    """Checkpoint folders of the toy model, each wrong in one way (`--checkpoint-dir`s)."""
    recipe = load_recipe(TOY)
    model = recipe.whole(torch.device("cpu"), seed=0).part
    state = {f"model.{k}": p.detach() for k, p in model.named_parameters()}
    marker = {"format": FORMAT, "step": 2, "model": TOY, "model_id": TOY}
    marker.update(layers=list(recipe.layers), seed=0, optimizer="sgd")
    made = {}

    def checkpoint(name: str, tensors=state, **changes) -> Path:
        folder = root / name / "step-2"
        dcp.save(tensors, checkpoint_id=str(folder), no_dist=True)
        (folder / MARKER).write_text(json.dumps({**marker, **changes}))
        made[name] = str(root / name)
        return folder

    import os

    class Touch:
        def __reduce__(self):
            return os.system, (f"touch {root / 'ran'}",)

    checkpoint("ckpt~code in index")
    (root / "ckpt~code in index" / "step-2" / ".metadata").write_bytes(
        __import__("pickle").dumps(Touch())
    )
    checkpoint("ckpt~bytes entry", {**state, next(iter(state)): Touch()})
    checkpoint("ckpt~marker garbled").joinpath(MARKER).write_bytes(b"\x00{")
    checkpoint("ckpt~marker of another step", step=3)
    checkpoint("ckpt~marker step as text", step="2")
    checkpoint("ckpt~another seed", seed=7)
    checkpoint("ckpt~another optimizer", optimizer="adamw")
    checkpoint("ckpt~another model", model_id="sha256:00", model="m.json")
    checkpoint("ckpt~other layers", layers=["a", "b"])
    next(checkpoint("ckpt~shard gone").glob("*.distcp")).unlink()
    for name in CHECKSUM_DAMAGES:
        damage_checksummed(checkpoint(name), MARKER, name)
    return made


def _token_folders(root: Path) -> dict[str, str]:
    """Token files with a meta.json (prepare-data's), each at odds with a run in one way."""
    made = {}
    for name, vocab, extra in (
        ("tokens~vocabulary of 1000", 1000, 0),
        ("tokens~length changed", 512, 3),
    ):
        folder = root / name
        folder.mkdir()
        (np.arange(4000) % 500).astype(np.uint16).tofile(folder / "train.bin")
        meta = {"format": "octopipe.tokens/1", "vocab_size": vocab, "dtype": "uint16"}
        meta.update(tokenizer="t.json", files={"train.bin": {"tokens": 4000 + extra}})
        (folder / "meta.json").write_text(json.dumps(meta))
        made[name] = str(folder / "train.bin")
    return made


# --- the table ------------------------------------------------------------------------------------


def _out(f, name: str) -> str:
    return str(Path(f["OUT"]) / name)


BASE: dict[str, Callable[[dict[str, str]], list[str]]] = {
    "profile-arch": lambda f: [
        "profile-arch",
        "tiny-llama",
        "--devices",
        "2",
        "-o",
        _out(f, "old.json"),
    ],
    "baseline": lambda f: (
        ["baseline", "--profile", f["profile.json"], "--schedule", "1f1b"]
        + ["--partition", "uniform", "--microbatches", "4", "-o", _out(f, "old.json")]
    ),
    "simulate": lambda f: (
        ["simulate", "--profile", f["profile.json"], "--plan", f["plan.json"]]
        + ["--trace", _out(f, "old.json")]
    ),
    "plan": lambda f: (
        ["plan", "--profile", f["profile.json"], "--microbatches", "4"]
        + ["--time-budget", "1", "--no-png", "--quiet", "-o", _out(f, "new-folder")]
    ),
    "plan --gpus": lambda f: (
        ["plan", "--model", "tiny-llama", "--gpus", "8", "--seq-len", "64"]
        + ["--time-budget", "1", "--no-png", "--quiet", "-o", _out(f, "new-folder")]
    ),
    "run": lambda f: [
        "run",
        "--plan",
        f["toy-plan.json"],
        "--model",
        TOY,
        "--trace",
        _out(f, "old.json"),
    ],
    "profile": lambda f: ["profile", "--model", "tiny-llama", "-o", _out(f, "old.json")],
    "estimate": lambda f: (
        ["estimate", "--model", "tiny-llama", "--gpus", "8", "--global-batch"]
        + ["16", "--seq-len", "64"]
    ),
    "prepare-data": lambda f: (
        ["prepare-data", "--tokenizer", "byte", "--input", f["text.txt"]]
        + ["-o", _out(f, "new-folder")]
    ),
    "calibrate": lambda f: (
        ["calibrate", "--profile", f["profile.json"], "--plan", f["plan.json"]]
        + ["--trace", f["other-trace.json"], "-o", _out(f, "old.json")]
    ),
}
CLUSTER_ONLY = {"--gpus-per-node", "--global-batch"}


def _bad_values(bounds) -> list[str]:
    """Values just outside a flag's range, and ones that are no number of its kind."""
    if len(bounds) == 2:  # an integer from low to high
        low, high = bounds
        return [str(low - 1), str(high + 1), f"{low}.5", "٣", "x"]
    low, high, above, below = bounds
    return [
        "nan",
        "inf",
        f"{low:g}" if above else f"{low - 1:g}",
        f"{high:g}" if below else f"{high * 10:g}",
        "1e400",
    ]


def flag_cases() -> list[Case]:
    """Every numeric flag of every command, with each of its bad values."""
    commands = build_parser()._subparsers._group_actions[0].choices
    cases = []
    for command, parser in sorted(commands.items()):
        for action in parser._actions:
            bounds = getattr(action.type, "bounds", None)
            if not action.option_strings or bounds is None:
                continue
            flag = action.option_strings[-1]
            base = "plan --gpus" if command == "plan" and flag in CLUSTER_ONLY else command
            for value in _bad_values(bounds):
                cases.append(
                    Case(
                        f"{command} {flag} {value}",
                        lambda f, b=base, fl=flag, v=value: [*BASE[b](f), fl, v],
                        f"argument {flag}: expected ",
                    )
                )
    return cases


def file_cases() -> list[Case]:
    cases = []
    readers = {  # which commands read the faulty file, in turn
        "profile.json": [
            lambda f, p: ["simulate", "--profile", p, "--plan", f["plan.json"]],
            lambda f, p: BASE["baseline"](f)[:2] + [p] + BASE["baseline"](f)[3:],
            lambda f, p: BASE["plan"](f)[:2] + [p] + BASE["plan"](f)[3:],
            lambda f, p: BASE["calibrate"](f)[:2] + [p] + BASE["calibrate"](f)[3:],
        ],
        "plan.json": [
            lambda f, p: ["simulate", "--profile", f["profile.json"], "--plan", p],
            lambda f, p: BASE["calibrate"](f)[:4] + [p] + BASE["calibrate"](f)[5:],
        ],
        "other-trace.json": [
            lambda f, p: (
                ["calibrate", "--profile", f["profile.json"], "--plan", f["other-plan.json"]]
                + ["--trace", p, "-o", _out(f, "old.json")]
            ),
        ],
    }
    faults = {"profile.json": PROFILE_FAULTS, "plan.json": PLAN_FAULTS}
    faults["other-trace.json"] = TRACE_FAULTS
    for base, table in faults.items():
        for i, (fault, (_, _, expect)) in enumerate(table.items()):
            read = readers[base][i % len(readers[base])]
            name = f"{base}~{fault}"
            cases.append(
                Case(
                    f"{name}",
                    lambda f, r=read, n=name: r(f, f[n]),
                    expect or "expected a JSON object",
                )
            )
    for i, (fault, expect) in enumerate(RAW_EXPECT.items()):
        reader = [
            lambda f, p: ["simulate", "--profile", p, "--plan", f["plan.json"]],
            lambda f, p: ["simulate", "--profile", f["profile.json"], "--plan", p],
            lambda f, p: BASE["calibrate"](f)[:6] + [p] + BASE["calibrate"](f)[7:],
            lambda f, p: ["profile-arch", p, "-o", _out(f, "old.json")],
        ][i % 4]
        cases.append(
            Case(f"raw file: {fault}", lambda f, r=reader, n=fault: r(f, f[f"raw~{n}"]), expect)
        )
    for name, expect in HF_EXPECT.items():
        cases.append(
            Case(
                name,
                lambda f, n=name: ["run", "--plan", f["tiny-plan.json"], "--model", f[n]],
                expect,
            )
        )
    for name, expect in ARCH_EXPECT.items():
        cases.append(
            Case(name, lambda f, n=name: ["profile-arch", f[n], "-o", _out(f, "old.json")], expect)
        )
    for config, model_type in NOT_HF_TYPES.items():  # a file of NOT_HF's, or a shipped name
        cases.append(
            Case(
                f"profile-arch --layer-names hf {config}",
                lambda f, c=config: (
                    ["profile-arch", f.get(c, c), "--layer-names", "hf"]
                    + ["-o", _out(f, "old.json")]
                ),
                f"--layer-names hf: model_type: {model_type!r} models do not run on "
                f"`--model hf:` {HF_FAMILIES}",
            )
        )
    return cases


CHECKPOINT_EXPECT = {
    "ckpt~code in index": "refused to load: it names posix.system",
    "ckpt~bytes entry": "is stored as pickled bytes, which loading would run as code",
    "ckpt~marker garbled": "--resume: no complete checkpoint in",
    "ckpt~marker of another step": "says step 3, its folder step 2",
    "ckpt~marker step as text": "step: Input should be a valid integer",
    "ckpt~another seed": "--seed: ",
    "ckpt~another optimizer": "--optimizer: ",
    "ckpt~another model": "--model: ",
    "ckpt~other layers": "a checkpoint of another model: its layers differ",
    "ckpt~shard gone": "shard is missing",
}


def _run(f, *extra) -> list[str]:
    return ["run", "--plan", f["toy-plan.json"], "--model", TOY, *SGD_FLAGS, *extra]


def _run_llama(f, *extra) -> list[str]:
    """`run` of the tiny Llama, whose vocabulary the token-file cases check against."""
    return ["run", "--plan", f["tiny-plan.json"], "--model", "tiny-llama", *extra]


HAND_WRITTEN = [
    # the hardening issue's list, and their neighbours
    Case(
        "run --model os:system",
        lambda f: _run(f)[:4] + ["os:system"],
        "'os:system' needs arguments",
    ),
    Case("run --model :", lambda f: _run(f)[:4] + [":"], "':' is not module:factory"),
    Case("run --model json:loads", lambda f: _run(f)[:4] + ["json:loads"], "needs arguments"),
    Case(
        "run --model os:getpid", lambda f: _run(f)[:4] + ["os:getpid"], "built a int, no nn.Module"
    ),
    Case(
        "run --model no module", lambda f: _run(f)[:4] + ["nosuchmodule:f"], "cannot load factory"
    ),
    Case(
        "run --model unknown",
        lambda f: _run(f)[:4] + ["no-such-model"],
        "unknown model 'no-such-model'",
    ),
    Case(
        "run --model hf: nowhere", lambda f: _run(f)[:4] + ["hf:/no/such/dir"], "no config.json at"
    ),
    Case("run --model a b:c", lambda f: _run(f)[:4] + ["a b:c"], "is not module:factory"),
    Case(
        "run --data ids beyond the vocabulary",
        lambda f: _run_llama(f, "--data", f["tokens.bin"]),
        "beyond the model's vocabulary of 512",
    ),
    Case(
        "run --data-dtype of another file",
        lambda f: _run_llama(f, "--data", f["tokens.bin"], "--data-dtype", "uint32"),
        "(is --data-dtype uint32 the file's?)",
    ),
    Case(
        "run --data odd bytes",
        lambda f: _run(f, "--data", f["odd.bin"]),
        "not a whole number of uint16",
    ),
    Case("run --data nowhere", lambda f: _run(f, "--data", "/no/such.bin"), "--data: no such file"),
    Case(
        "run --dp not dividing",
        lambda f: _run(f, "--dp", "3", "--nproc", "4"),
        "3 replicas do not divide",
    ),
    Case(
        "run plan of another model",
        lambda f: ["run", "--plan", f["toy-plan.json"], "--model", "tiny-llama"],
        "stages: stages cover 8 layers but the model has 7",
    ),
    Case(
        "run plan names of another model",
        lambda f: ["run", "--plan", f["toy-named-plan.json"], "--model", TOY],
        "--plan: layer 0 is 'blocks.0' in the plan but 'embed' in the model",
    ),
    Case(
        "run --png x.gif", lambda f: _run(f, "--png", _out(f, "t.gif")), "must end in .png or .svg"
    ),
    Case("run --trace x.txt", lambda f: _run(f, "--trace", _out(f, "t.txt")), "must end in .json"),
    Case(
        "run --trace no folder", lambda f: _run(f, "--trace", "/no/such/t.json"), "does not exist"
    ),
    Case("run --png a folder", lambda f: _run(f, "--png", f["OUT"]), "is a folder, not a file"),
    Case(
        "run --checkpoint-every alone",
        lambda f: _run(f, "--checkpoint-every", "1"),
        "needs --checkpoint-dir",
    ),
    Case("run --resume alone", lambda f: _run(f, "--resume"), "needs --checkpoint-dir"),
    Case(
        "run --checkpoint-dir a file",
        lambda f: _run(f, "--checkpoint-dir", f["a-file"], "--resume"),
        "is a file, not a folder",
    ),
    Case(
        "run --checkpoint-dir under a file",
        lambda f: _run(f, "--checkpoint-dir", f["a-file"] + "/x", "--checkpoint-every", "1"),
        "is a file, not a folder",
    ),
    Case(
        "run --ep not dividing TP x CP x DP",
        lambda f: _run_llama(f, "--ep", "3", "--dp", "2"),
        "--ep: 3 does not divide a device's TP x CP x DP = 2 ranks",
    ),
    Case(
        "run --ep with --zero 3",
        lambda f: _run_llama(f, "--ep", "2", "--dp", "2", "--zero", "3"),
        "--zero: 3 is not built with expert parallelism yet",
    ),
    Case(
        "run --ep with --overlap-steps",
        lambda f: _run_llama(f, "--ep", "2", "--dp", "2", "--overlap-steps"),
        "--overlap-steps: not built with expert parallelism yet",
    ),
    Case(
        "run --cp with a sequence not in 2C chunks",
        lambda f: _run_llama(f, "--cp", "2", "--seq-len", "6"),
        "--seq-len: 6 tokens do not split into 4 equal chunks",
    ),
    Case(
        "run --cp --tp --zero 3",
        lambda f: _run_llama(f, "--cp", "2", "--tp", "2", "--seq-len", "8", "--zero", "3"),
        "--zero: 3 with --cp 2 and --tp 2 is not built yet",
    ),
    Case(
        "run --overlap-steps --zero 1",
        lambda f: _run(f, "--overlap-steps", "--zero", "1", "--dp", "2"),
        "--zero: not supported",
    ),
    Case("run --min-lr above --lr", lambda f: _run(f, "--min-lr", "0.5"), "0.5 is above --lr 0.01"),
    Case("run --momentum 5", lambda f: _run(f, "--momentum", "5"), "expected a number in [0, 1)"),
    Case(
        "run --timeout 0.000001",
        lambda f: _run(f, "--timeout", "0.000001"),
        "expected a number in [1,",
    ),
    Case(
        "run --seq-len 100000000",
        lambda f: _run(f, "--seq-len", "100000000"),
        "expected an integer",
    ),
    Case(
        "run tokens per microbatch",
        lambda f: _run(f, "--seq-len", "65536", "--micro-batch-size", "64"),
        "tokens per microbatch; at most",
    ),
    Case(
        "run --micro-batch-size 100000000",
        lambda f: _run(f, "--micro-batch-size", "100000000"),
        "expected an integer",
    ),
    Case(
        "run --step 3 (no abbreviation)",
        lambda f: _run(f, "--step", "3"),
        "unrecognized arguments: --step 3",
    ),
    Case(
        "run --zero ١ (Arabic-Indic one)", lambda f: _run(f, "--zero", "١"), "expected an integer"
    ),
    Case(
        "run no plan",
        lambda f: ["run", "--model", TOY],
        "the following arguments are required: --plan",
    ),
    Case(
        "run plan nowhere",
        lambda f: ["run", "--plan", "/no/plan.json", "--model", TOY],
        "cannot read",
    ),
    Case(
        "plan --gpus 1",
        lambda f: [
            "plan",
            "--gpus",
            "1",
            "--time-budget",
            "2",
            "--no-png",
            "--quiet",
            "-o",
            _out(f, "x"),
        ],
        "GPUs' memory (less 5% headroom): the leanest",
    ),
    Case(
        "plan --gpus 10^12",
        lambda f: BASE["plan --gpus"](f)[:4] + ["1000000000000"] + BASE["plan --gpus"](f)[5:],
        "1,000,000,000,000 GPUs; at most",
    ),
    Case(
        "plan --gpus 0",
        lambda f: BASE["plan --gpus"](f)[:4] + ["0"] + BASE["plan --gpus"](f)[5:],
        "a GPU count must be at least 1",
    ),
    Case(
        "plan --gpus Arabic-Indic",
        lambda f: BASE["plan --gpus"](f)[:4] + ["٨"] + BASE["plan --gpus"](f)[5:],
        "expected N or NxPRESET",
    ),
    Case(
        "plan --gpus unknown preset",
        lambda f: BASE["plan --gpus"](f)[:4] + ["8xnosuch"] + BASE["plan --gpus"](f)[5:],
        "unknown hardware",
    ),
    Case(
        "plan --gpus not whole nodes",
        lambda f: BASE["plan --gpus"](f) + ["--gpus-per-node", "3"],
        "do not fill whole nodes",
    ),
    Case(
        "plan --gpus with --devices",
        lambda f: BASE["plan --gpus"](f) + ["--devices", "2"],
        "the cluster layout decides this",
    ),
    Case(
        "plan --model --tp 0 (not taken as 1)",
        lambda f: ["plan", "--model", "tiny-llama", "--tp", "0", "-o", _out(f, "x")],
        "argument --tp",
    ),
    Case(
        "plan --max-chunks 0",
        lambda f: BASE["plan"](f) + ["--max-chunks", "0"],
        "argument --max-chunks",
    ),
    Case(
        "plan --max-chunks many",
        lambda f: BASE["plan"](f) + ["--max-chunks", "65"],
        "argument --max-chunks",
    ),
    Case(
        "plan --max-chunks word",
        lambda f: BASE["plan"](f) + ["--max-chunks", "deep"],
        "argument --max-chunks",
    ),
    Case(
        "plan --device 2 (no abbreviation)",
        lambda f: BASE["plan"](f) + ["--device", "2"],
        "unrecognized arguments: --device 2",
    ),
    Case(
        "plan --memory-limit lots",
        lambda f: BASE["plan"](f) + ["--memory-limit", "lots"],
        "expected a size",
    ),
    Case(
        "plan --memory-limit 1e30",
        lambda f: BASE["plan"](f) + ["--memory-limit", "1e30"],
        "must be from 1 byte to",
    ),
    Case(
        "plan --memory-limit too small",
        lambda f: BASE["plan"](f) + ["--memory-limit", "1KiB"],
        "no plan fits the devices' memory",
    ),
    Case(
        "plan --profile and --model",
        lambda f: BASE["plan"](f) + ["--model", "tiny-llama"],
        "give a profile or a model",
    ),
    Case(
        "plan -o a file", lambda f: BASE["plan"](f)[:-1] + [f["a-file"]], "is a file, not a folder"
    ),
    Case(
        "plan profile lists 2, --devices 3",
        lambda f: BASE["plan"](f) + ["--devices", "3"],
        "asked for 3 devices but the profile lists 2",
    ),
    Case(
        "plan microbatches x devices",
        lambda f: [
            "plan",
            "--model",
            "tiny-llama",
            "--devices",
            "4096",
            "--microbatches",
            "262144",
            "-o",
            _out(f, "x(device, microbatch) pairs; the tuner plans at most 262,144"),
        ],
        "",
    ),
    Case(
        "profile-arch --tp 1024 for 4 heads",
        lambda f: BASE["profile-arch"](f) + ["--tp", "1024"],
        "does not fit",
    ),
    Case("profile-arch --tp 3", lambda f: BASE["profile-arch"](f) + ["--tp", "3"], "does not fit"),
    Case(
        "profile-arch --devices 100000000",
        lambda f: BASE["profile-arch"](f) + ["--devices", "100000000"],
        "argument --devices",
    ),
    Case(
        "profile-arch unknown model",
        lambda f: ["profile-arch", "no-such-model", "-o", _out(f, "x.json")],
        "no such config file or shipped model",
    ),
    Case(
        "profile-arch --hardware unknown",
        lambda f: BASE["profile-arch"](f) + ["--hardware", "h900"],
        "unknown hardware",
    ),
    Case(
        "profile-arch -o no folder",
        lambda f: ["profile-arch", "tiny-llama", "-o", "/no/such/p.json"],
        "does not exist",
    ),
    Case(
        "profile-arch tokens per microbatch",
        lambda f: (
            BASE["profile-arch"](f) + ["--seq-len", "16777216", "--micro-batch-size", "65536"]
        ),
        "tokens per microbatch; at most",
    ),
    Case(
        "baseline --microbatches 1000000000",
        lambda f: (
            BASE["baseline"](f)[:-4] + ["--microbatches", "1000000000", "-o", _out(f, "old.json")]
        ),
        "argument --microbatches",
    ),
    Case(
        "baseline huge plan",
        lambda f: [
            "baseline",
            "--profile",
            f["profile.json"],
            "--schedule",
            "i1f1b",
            "--partition",
            "uniform",
            "--microbatches",
            "262144",
            "--chunks",
            "16",
            "-o",
            _out(f, "old.json"),
        ],
        "a plan holds at most",
    ),
    Case(
        "baseline dualpipev few microbatches",
        lambda f: (
            BASE["baseline"](f)[:4]
            + ["dualpipev", "--partition", "uniform"]
            + ["--microbatches", "2", "-o", _out(f, "old.json")]
        ),
        "needs at least 2 x devices = 4 microbatches, got 2",
    ),
    Case(
        "baseline -o a folder",
        lambda f: BASE["baseline"](f)[:-1] + [f["OUT"]],
        "is a folder, not a file",
    ),
    Case(
        "simulate --png x.gif",
        lambda f: BASE["simulate"](f)[:-2] + ["--png", _out(f, "t.gif")],
        "must end in .png or .svg",
    ),
    Case(
        "simulate --html x.png",
        lambda f: BASE["simulate"](f)[:-2] + ["--html", _out(f, "t.png")],
        "must end in .html or .htm",
    ),
    Case(
        "simulate --memory-png no folder",
        lambda f: BASE["simulate"](f)[:-2] + ["--memory-png", "/no/m.png"],
        "does not exist",
    ),
    Case(
        "simulate plan of fewer layers",
        lambda f: ["simulate", "--profile", f["profile.json"], "--plan", f["toy-plan.json"]],
        "stages cover",
    ),
    Case(
        "simulate --overlap-steps with --png",
        lambda f: BASE["simulate"](f)[:-2] + ["--overlap-steps", "--png", _out(f, "t.png")],
        "draws no timeline",
    ),
    Case(
        "calibrate a trace of another plan",
        lambda f: BASE["calibrate"](f),
        "is not in the plan's schedule: a trace of another plan",
    ),
    Case(
        "calibrate no steps",
        lambda f: [
            "calibrate",
            "--profile",
            f["profile.json"],
            "--plan",
            f["other-plan.json"],
            "--trace",
            f["other-trace.json"],
            "-o",
            _out(f, "old.json"),
        ],
        "no executor actions with a step",
    ),
    Case(
        "estimate --gpus 0",
        lambda f: BASE["estimate"](f)[:4] + ["0"] + BASE["estimate"](f)[5:],
        "a GPU count must be at least 1",
    ),
    Case(
        "estimate --tp not dividing",
        lambda f: BASE["estimate"](f) + ["--tp", "3"],
        "--dp: TP x CP x PP = 3 does not divide the 8 GPUs",
    ),
    Case(
        "prepare-data not UTF-8",
        lambda f: BASE["prepare-data"](f)[:4] + [f["latin1.txt"]] + BASE["prepare-data"](f)[5:],
        "latin1.txt: not UTF-8 text (byte 3)",
    ),
    Case(
        "prepare-data JSONL without text",
        lambda f: BASE["prepare-data"](f)[:4] + [f["no-text.jsonl"]] + BASE["prepare-data"](f)[5:],
        'no-text.jsonl: line 2: expected a JSON object with a "text" string',
    ),
    Case(
        "prepare-data input nowhere",
        lambda f: BASE["prepare-data"](f)[:4] + ["/no/such/text"] + BASE["prepare-data"](f)[5:],
        "--input: /no/such/text does not exist",
    ),
    Case(
        "prepare-data a folder without text",
        lambda f: BASE["prepare-data"](f)[:4] + [f["OUT"]] + BASE["prepare-data"](f)[5:],
        "holds no text files",
    ),
    Case(
        "prepare-data tokenizer nowhere",
        lambda f: ["prepare-data", "--tokenizer", "/no/tok.json"] + BASE["prepare-data"](f)[3:],
        "--tokenizer: no tokenizer file at /no/tok.json",
    ),
    Case(
        "prepare-data not a tokenizer",
        lambda f: (
            ["prepare-data", "--tokenizer", f["not-a-tokenizer.json"]] + BASE["prepare-data"](f)[3:]
        ),
        "not a tokenizers file",
    ),
    Case(
        "prepare-data --eos for bytes",
        lambda f: BASE["prepare-data"](f) + ["--eos", "</s>"],
        "--eos: the byte tokenizer has no special tokens",
    ),
    Case(
        "prepare-data -o a file",
        lambda f: BASE["prepare-data"](f)[:-1] + [f["a-file"]],
        "is a file, not a folder",
    ),
    Case(
        "run --data of a larger vocabulary (meta.json)",
        lambda f: _run_llama(f, "--data", f["tokens~vocabulary of 1000"]),
        "holds ids of a tokenizer of 1,000 (its meta.json); the model takes 512",
    ),
    Case(
        "run --data-dtype not meta.json's",
        lambda f: _run_llama(f, "--data", f["tokens~vocabulary of 1000"], "--data-dtype", "uint32"),
        "--data-dtype: uint32, but",
    ),
    Case(
        "run --data changed since meta.json",
        lambda f: _run_llama(f, "--data", f["tokens~length changed"]),
        "says 4,003 uint16 tokens",
    ),
    Case(
        "run --profile without --png",
        lambda f: _run(f, "--profile", f["profile.json"]),
        "--profile: is for --png",
    ),
    Case(
        "run --profile of another model",
        lambda f: _run(f, "--profile", f["profile.json"], "--png", _out(f, "t.png")),
        "stages cover 8 layers but",
    ),
    Case(
        "run --eval-every without --val-data",
        lambda f: _run(f, "--eval-every", "2"),
        "--eval-every: needs --val-data",
    ),
    Case(
        "run --keep-last without --checkpoint-every",
        lambda f: _run(f, "--keep-last", "2"),
        "--keep-last: needs --checkpoint-every",
    ),
    Case(
        "run --val-data with --overlap-steps",
        lambda f: _run(f, "--val-data", f["tokens.bin"], "--overlap-steps"),
        "--val-data: not supported with --overlap-steps yet",
    ),
    Case(
        "run --log-dir a file",
        lambda f: _run(f, "--log-dir", f["a-file"]),
        "--log-dir: ",
    ),
    Case(
        "export-hf a checkpoint that would run code",
        lambda f: (
            ["export-hf", "--checkpoint", f["ckpt~code in index"], "--model", f["hf-llama"]]
            + ["-o", _out(f, "hf")]
        ),
        "refused to load: it names posix.system",
    ),
    Case(
        "export-hf a checkpoint of another model",
        lambda f: (
            ["export-hf", "--checkpoint", f["ckpt~another seed"], "--model"]
            + [f["hf-llama"], "-o", _out(f, "hf")]
        ),
        "a checkpoint of another model: its layers differ",
    ),
    Case(
        "export-hf a bundled model",
        lambda f: (
            ["export-hf", "--checkpoint", f["ckpt~another seed"], "--model", "tiny-llama"]
            + ["-o", _out(f, "hf")]
        ),
        "is no transformers model",
    ),
    Case("unknown command", lambda f: ["nosuch"], "invalid choice: 'nosuch'"),
    Case("no command", lambda f: [], ""),
]


def all_cases() -> list[Case]:
    cases = flag_cases() + file_cases() + HAND_WRITTEN
    cases += [Case(*case) for case in OUTPUT_CASES + checkpoint_cases() + MISMATCH_CASES]
    cases += [Case(*case) for case in config_cases()]
    cases += [Case(*case) for case in THIRD_CASES]
    for name, expect in CHECKPOINT_EXPECT.items():
        cases.append(
            Case(
                name,
                lambda f, n=name: _run(f, "--steps", "4", "--resume", "--checkpoint-dir", f[n]),
                expect,
            )
        )
    return cases


CASES = all_cases()


def test_the_table_holds_more_than_200_distinct_cases():
    assert len({c.id for c in CASES}) == len(CASES) > 200


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(case, files, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.json").write_text(OLD)
    argv = case.argv({**files, "OUT": str(out)})
    code = main(argv)
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2, (code, captured.err[-2000:])
    assert "Traceback" not in captured.err + captured.out
    if argv:  # with no command at all, the help is printed instead of an error line
        assert len(lines) == 1, captured.err
        assert lines[0].startswith("octopipe") and "error: " in lines[0], lines[0]
        assert case.expect in lines[0], lines[0]
    assert sorted(p.name for p in out.iterdir()) == ["old.json"]
    assert (out / "old.json").read_text() == OLD
    assert not Path(files["ran"]).exists()
    assert not specials_changed(files)  # no device, FIFO or link was written over


ENTRY_POINT = {  # id -> (argv, the line's start)
    "argparse": (["plan", "--microbatches", "0"], "octopipe plan: error: argument --microbatches"),
    "file": (
        ["simulate", "--profile", "raw~binary", "--plan", "plan.json"],
        "octopipe simulate: error: ",
    ),
    "run refused": (
        ["run", "--plan", "plan.json", "--model", "os:system"],
        "octopipe run: error: --model",
    ),
    "checkpoint": (
        [
            "run",
            "--plan",
            "toy-plan.json",
            "--model",
            TOY,
            "--steps",
            "4",
            "--resume",
            "--checkpoint-dir",
            "ckpt~code in index",
        ],
        "octopipe run: error: ",
    ),
    "unknown command": (["nosuch"], "octopipe: error: argument COMMAND: invalid choice"),
}


@pytest.mark.parametrize("name", ENTRY_POINT, ids=list(ENTRY_POINT))
def test_the_real_entry_point_is_one_line_too(name, files):
    argv, start = ENTRY_POINT[name]
    argv = [files.get(a, a) for a in argv]
    done = subprocess.run(
        [sys.executable, "-m", "octopipe", *argv],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parent,  # where the toy model's module is found
        timeout=120,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(start), done.stderr
    assert "Traceback" not in done.stderr
