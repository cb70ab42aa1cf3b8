"""A whole Megatron-LM launch: the model's shape from its config (held by a parameter count
computed from the written arguments, as Megatron-Core's modules hold them, against OctoPipe's
count of the config), the precision priced (FP8 and MXFP8 with their recipes), and a script
that starts each node; a family Megatron-LM builds no layer for is one line."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from octopipe.api import baseline, profile_from_config
from octopipe.cli import main
from octopipe.costmodel import load_architecture, shipped_models
from octopipe.costmodel.build import parameter_count
from octopipe.engines.megatron import megatron_arguments, write_megatron_args
from octopipe.engines.megatron.args import precision_arguments, write_megatron_launch
from octopipe.engines.megatron.model import (
    megatron_parameters,
    megatron_values,
    model_arguments,
    model_refusal,
)
from octopipe.errors import InputError

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted(
    [*shipped_models(), *(str(p) for p in (ROOT / "benchmarks/data/configs").glob("*.json"))]
)


def written(arch) -> dict:
    """The model's arguments as Megatron-LM's parser reads them, its layer count the layout's."""
    return megatron_values(["--num-layers", str(arch.num_layers), *model_arguments(arch)])


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: Path(c).stem)
def test_the_written_shape_builds_the_configs_parameters(config):
    arch = load_architecture(config)
    if model_refusal(arch) is not None:
        with pytest.raises(InputError, match="^--model: "):
            model_arguments(arch)
        return
    assert megatron_parameters(written(arch)) == parameter_count(arch)


def test_every_family_but_gemma_vision_and_gpt_oss_is_written():
    families = {
        load_architecture(c).family for c in CONFIGS if not model_refusal(load_architecture(c))
    }
    assert families == {"dense", "moe", "deepseek", "hybrid", "gpt"}
    refused = {
        load_architecture(c).model_type for c in CONFIGS if model_refusal(load_architecture(c))
    }
    assert refused == {"gemma2", "gemma3_text", "mllama", "gpt_oss"}


def test_the_count_reads_each_dimension():
    """A count that ignored a written dimension would not move with it."""
    arch = load_architecture("tiny-moe")
    base = megatron_parameters(written(arch))
    for key in (
        "hidden_size",
        "ffn_hidden_size",
        "moe_ffn_hidden_size",
        "num_experts",
        "kv_channels",
        "vocab_size",
        "moe_shared_expert_intermediate_size",
    ):
        values = written(arch)
        values[key] = str(int(values[key]) * 2)
        assert megatron_parameters(values) != base, key
    for switch in ("swiglu", "untie_embeddings_and_output_weights", "moe_shared_expert_gate"):
        values = written(arch)
        values[switch] = False
        assert megatron_parameters(values) < base, switch


@pytest.mark.parametrize(
    ("precision", "scaling", "expected"),
    [
        ("bf16", "delayed", ["--bf16"]),
        ("fp8", "delayed", ["--bf16", "--fp8-format", "hybrid", "--fp8-recipe", "delayed"]),
        ("fp8", "current", ["--bf16", "--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"]),
        ("mxfp8", "delayed", ["--bf16", "--fp8-format", "e4m3", "--fp8-recipe", "mxfp8"]),
    ],
)
def test_the_profiles_precision_is_exported(precision, scaling, expected):
    assert precision_arguments(precision, scaling) == expected
    hardware = "b200" if precision == "mxfp8" else "h100"
    prof = profile_from_config(
        "tiny-llama", hardware, devices=2, seq_len=64, precision=precision, fp8_scaling=scaling
    )
    args = megatron_arguments(baseline(prof, "1f1b", "uniform", 4), prof)
    assert args[-len(expected) :] == expected


def test_the_args_file_holds_the_layout_and_the_model(tmp_path):
    arch = load_architecture("tiny-deepseek")
    prof = profile_from_config("tiny-deepseek", devices=2, seq_len=64, precision="fp8")
    plan = baseline(prof, "1f1b", "uniform", 4).with_shape(tp=1, dp=2, microbatch_size=1, ep=2)
    write_megatron_args(plan, prof, tmp_path / "megatron_args.sh", arch, tp_comm_overlap=True)
    done = subprocess.run(
        ["bash", "-c", 'source megatron_args.sh; printf "%s\\n" "${MEGATRON_ARGS[@]}"'],
        cwd=tmp_path, capture_output=True, text=True, check=True,
    )  # fmt: skip
    args = done.stdout.split("\n")[:-1]
    assert args == megatron_arguments(plan, prof) + model_arguments(arch)
    assert "--tp-comm-overlap" not in args  # TP 1: nothing to overlap
    assert args.count("--num-layers") == 1
    assert megatron_parameters(megatron_values(args)) == parameter_count(arch)


def test_the_launch_script_starts_each_node_and_names_what_it_needs(tmp_path):
    arch = load_architecture("tiny-llama")
    prof = profile_from_config("tiny-llama", devices=2, seq_len=64)
    plan = baseline(prof, "1f1b", "uniform", 4).with_shape(tp=2, dp=4, microbatch_size=1)
    write_megatron_args(plan, prof, tmp_path / "megatron_args.sh", arch)
    write_megatron_launch(plan, prof, arch, 8, tmp_path / "megatron_launch.sh")
    script = tmp_path / "megatron_launch.sh"
    bin_dir = tmp_path / "bin"  # a torchrun that prints what it was given
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    (bin_dir / "torchrun").chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    missing = subprocess.run(["bash", str(script), "1"], env=env, capture_output=True, text=True)
    assert missing.returncode != 0 and "MASTER_ADDR" in missing.stderr
    env |= dict(MASTER_ADDR="10.0.0.1", MEGATRON_LM="/m", TOKENIZER_MODEL="/t", DATA_PATH="/d",
                TRAIN_ITERS="10", LR="3e-4")  # fmt: skip
    done = subprocess.run(["bash", str(script), "1"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    words = done.stdout.split("\n")[:-1]
    assert words[:8] == ["--nnodes", "2", "--nproc-per-node", "8", "--node-rank", "1",
                         "--master-addr", "10.0.0.1"]  # fmt: skip
    assert "/m/pretrain_gpt.py" in words
    assert words[words.index("--tokenizer-model") + 1] == "/t"
    assert words[words.index("--hidden-size") + 1] == str(arch.hidden_size)


def test_plan_gpus_for_megatron_writes_a_whole_launch_in_fp8(tmp_path, capsys):
    argv = ["plan", "--model", "tiny-moe", "--gpus", "8", "--gpus-per-node", "4"]
    argv += ["--global-batch", "16", "--seq-len", "256", "--no-png", "--quiet", "--precision"]
    argv += ["fp8", "--runner", "megatron", "--tune-evaluations", "50", "-o", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    files = {p.name for p in tmp_path.iterdir()}
    assert {"megatron_args.sh", "megatron_launch.sh"} <= files
    assert not files & {"torchtitan.toml", "octopipe_torchtitan.py"}  # Megatron-LM's only
    text = (tmp_path / "megatron_args.sh").read_text()
    assert "--fp8-format hybrid" in text and "--num-experts 8" in text
    assert "bash " + str(tmp_path / "megatron_launch.sh") in out


def test_a_model_megatron_lm_cannot_build_is_refused_up_front(capsys):
    argv = ["plan", "--model", "tiny-gemma", "--gpus", "8", "--global-batch", "16"]
    argv += ["--seq-len", "256", "--quiet", "--runner", "megatron"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--runner: Megatron-LM cannot train tiny-gemma: " in err[0]
