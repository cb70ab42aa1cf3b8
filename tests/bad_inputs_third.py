"""The third bad-input probe's cases, for `test_bad_inputs.py`'s table: job files nested
beyond any reader, paths that name a folder, a FIFO or a device where a file is read, settings
that are empty or a megabyte long, a layout that does not fit a node, layer types transformers
does not know, a tokenizer that cannot be trained, and export-hf's faults named by its own flag.
Each is `(id, argv from the files' paths, a part of the one line)`; `third_pass_files` makes the
files beside the other passes'."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

Argv = Callable[[dict[str, str]], list[str]]

DEPTH = 100_000  # far beyond Python's recursion limit


def _out(f, name: str) -> str:
    return str(Path(f["OUT"]) / name)


def third_pass_files(root: Path) -> dict[str, str]:
    made: dict[str, str] = {}

    def put(name: str, text: str) -> None:
        (root / name).write_text(text)
        made[name] = str(root / name)

    put("deep-arrays.toml", "a = " + "[" * DEPTH + "]" * DEPTH + "\n")
    put("deep-tables.toml", "a = " + "{b = " * DEPTH + "1" + "}" * DEPTH + "\n")
    put("empty-plan.toml", '[plan]\nfile = ""\n[model]\nname = "tiny-llama"\n')
    put("long-name.toml", '[model]\nname = "' + "x" * 1_000_000 + '"\n')
    gpt_oss = {
        "model_type": "gpt_oss",
        "head_dim": 64,
        "hidden_size": 256,
        "intermediate_size": 256,
        "layer_types": ["sliding", "full"],  # transformers' names are sliding_attention, ...
        "num_attention_heads": 4,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "num_local_experts": 4,
        "sliding_window": 128,
        "vocab_size": 1000,
    }
    put("gpt-oss-unknown-layer-types.json", json.dumps(gpt_oss))
    from octopipe.costmodel.hf_config import config_path

    dense = json.loads(config_path("tiny-moe").read_text())
    dense["mlp_only_layers"] = list(range(dense["num_hidden_layers"]))  # no layer routes
    put("dense-qwen-moe.json", json.dumps(dense))
    (root / "a-folder").mkdir()
    made["a-folder"] = str(root / "a-folder")
    (root / "ckpt~empty step").mkdir()
    (root / "ckpt~empty step" / "step-3").mkdir()  # no marker: the save never finished
    made["ckpt~empty step"] = str(root / "ckpt~empty step")
    return made


THIRD_CASES: list[tuple[str, Argv, str]] = [
    (
        "run --config nested 100,000 arrays deep",
        lambda f: ["run", "--config", f["deep-arrays.toml"]],
        "deep-arrays.toml: nested too deeply: not a job file",
    ),
    (
        "run --config nested 100,000 inline tables deep",
        lambda f: ["run", "--config", f["deep-tables.toml"]],
        "deep-tables.toml: nested too deeply: not a job file",
    ),
    (
        "run --config a folder",
        lambda f: ["run", "--config", f["a-folder"]],
        "a-folder is a folder, not a file: expected a TOML job file",
    ),
    (
        "run --config a FIFO",
        lambda f: ["run", "--config", f["fifo"]],
        "is a FIFO (named pipe), not a file: expected a TOML job file",
    ),
    (
        "run --config /dev/null",
        lambda f: ["run", "--config", "/dev/null"],
        "--config: /dev/null is a character device, not a file: expected a TOML job file",
    ),
    (
        "run --config with an empty plan.file",
        lambda f: ["run", "--config", f["empty-plan.toml"]],
        "empty-plan.toml: plan.file: is empty",
    ),
    (
        "run --config with a model name of a megabyte",
        lambda f: ["run", "--config", f["long-name.toml"], "--plan", f["plan.json"]],
        "model.name: is 1,000,000 characters; at most 4,096",
    ),
    (
        "plan --model of 300 characters",
        lambda f: ["plan", "--model", "y" * 300, "-o", _out(f, "x")],
        "y... (300 characters): no such config file or shipped model",
    ),
    (
        "plan --model of 100,000 characters",
        lambda f: ["plan", "--model", "y" * 100_000, "-o", _out(f, "x")],
        "--model: is 100,000 characters; at most 4,096",
    ),
    (
        "plan --gpus 16 --from-layout tp16 on nodes of 8",
        lambda f: ["plan", "--gpus", "16", "--from-layout", "tp16,dp1", "-o", _out(f, "x")],
        "--from-layout: TP 16 x PP 1 x DP 1, b 1 x M 512: TP 16 does not divide a node of 8",
    ),
    (
        "plan --gpus 16 --layout tp16 on nodes of 8",
        lambda f: ["plan", "--gpus", "16", "--layout", "tp16,dp1", "-o", _out(f, "x")],
        "--layout: TP 16 x PP 1 x DP 1, b 1 x M 512: TP 16 does not divide a node of 8",
    ),
    (
        "plan --layout and --from-layout both",
        lambda f: ["plan", "--gpus", "8", "--layout", "pp2", "--from-layout", "pp4"],
        "not allowed with argument --layout",
    ),
    (
        "plan --runner torchtitan --from-layout cp2 at ZeRO-0",
        lambda f: (
            ["plan", "--gpus", "8", "--model", "llama3-8b", "--runner", "torchtitan"]
            + ["--from-layout", "cp2,pp2", "-o", _out(f, "x")]
        ),
        "--from-layout: torchtitan cannot run it: torchtitan shards weights over the CP ranks "
        "(FSDP) wherever CP > 1: give z3",
    ),
    (
        "plan --runner torchtitan with a model of no torchtitan config",
        lambda f: ["plan", "--gpus", "8", "--model", "tiny-llama", "--runner", "torchtitan"],
        "--runner torchtitan: torchtitan 0.3 has no config of tiny-llama's shape",
    ),
    (
        "run --ep 2 of a dense model",
        lambda f: (
            ["run", "--plan", f["tiny-plan.json"], "--model", "tiny-llama"]
            + ["--ep", "2", "--dp", "2"]
        ),
        "--ep: tiny-llama has no MoE experts to spread over 2 ranks",
    ),
    (
        "run --ep 3 of 8 experts, before any rank starts",
        lambda f: (
            ["run", "--plan", f["tiny-plan.json"], "--model", "tiny-moe"]
            + ["--ep", "3", "--dp", "3"]
        ),
        "layers.1.ffn has 8 experts; 3 must divide them",
    ),
    (
        "estimate --ep 8 of a MoE family's config with every layer dense",
        lambda f: ["estimate", "--model", f["dense-qwen-moe.json"], "--gpus", "8", "--ep", "8"],
        "dense-qwen-moe.json has no MoE experts to spread over 8 ranks",
    ),
    (
        "profile-arch a gpt_oss config of unknown layer types",
        lambda f: ["profile-arch", f["gpt-oss-unknown-layer-types.json"], "-o", _out(f, "p.json")],
        "layer_types: 'sliding' is not a layer type: expected full_attention or sliding_attention",
    ),
    (
        "prepare-data --tokenizer train:wordpiece",
        lambda f: (
            ["prepare-data", "--tokenizer", "train:wordpiece", "--vocab-size", "300"]
            + ["--input", f["text.txt"], "-o", _out(f, "data")]
        ),
        "--tokenizer: cannot train 'wordpiece': the one to train is train:bpe",
    ),
    (
        "prepare-data --input a FIFO",
        lambda f: ["prepare-data", "--tokenizer", "byte", "--input", f["fifo"], "-o", _out(f, "d")],
        "fifo is a FIFO (named pipe), not a file",
    ),
    (
        "export-hf a folder of no complete checkpoint",
        lambda f: (
            ["export-hf", "--checkpoint", f["ckpt~empty step"], "--model", f["hf-llama"]]
            + ["-o", _out(f, "hf")]
        ),
        "export-hf: error: --checkpoint: no complete checkpoint in",
    ),
]
