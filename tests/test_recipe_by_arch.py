"""A published recipe is the recipe of a model's architecture, not of its name: `plan --gpus`
given a Hugging Face config.json of Llama 3 (8B, 405B) or DeepSeek-V3 sets its answer beside
that model's recipe, as it does for the shipped name; a config of another shape gets none,
whatever it calls itself. The config.json files are written from the published models' shapes
(nothing is downloaded)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from published_configs import LLAMA31_8B, LLAMA31_405B, write_config

from octopipe.cli import main
from octopipe.layouts import Job
from octopipe.layouts.cluster import Cluster, parse_gpus
from octopipe.layouts.recipes import nearest_recipe, recipe_layout, recipe_model

DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "n_shared_experts": 1,
    "n_routed_experts": 256,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 3,
    "moe_layer_freq": 1,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "vocab_size": 129280,
    "max_position_embeddings": 163840,
    "rope_theta": 10000,
    "tie_word_embeddings": False,
}


def job(model: str, gpus: int, batch: int, seq: int = 8192) -> Job:
    return Job(model, Cluster(parse_gpus(str(gpus)), 8), global_batch=batch, seq_len=seq)


@pytest.mark.parametrize(
    ("data", "shipped"),
    [(LLAMA31_8B, "llama3-8b"), (LLAMA31_405B, "llama3-405b"), (DEEPSEEK_V3, "deepseek-v3")],
)
def test_a_config_json_takes_the_recipes_of_its_architecture(tmp_path, data, shipped):
    assert recipe_model(write_config(tmp_path / "m", data)) == shipped
    assert recipe_model(shipped) == shipped


def test_the_405b_config_gets_the_recipe_at_the_nearest_gpu_count(tmp_path):
    path = write_config(tmp_path / "Llama-3.1-405B", LLAMA31_405B)
    for gpus, source in [(576, "NeMo llama31_405b"), (8192, "Llama 3 paper")]:
        mine, named = (
            nearest_recipe(job(path, gpus, 2048)),
            nearest_recipe(job("llama3-405b", gpus, 2048)),
        )
        assert mine is not None and mine == named and mine.source == source
        assert recipe_layout(job(path, gpus, 2048), mine) == recipe_layout(
            job("llama3-405b", gpus, 2048), named
        )


@pytest.mark.parametrize(
    "change",
    [
        {"vocab_size": 32000},  # Llama 2's vocabulary
        {"num_hidden_layers": 33},
        {"num_key_value_heads": 32},
        {"intermediate_size": 11008},
    ],
)
def test_another_shape_gets_no_recipe_whatever_its_name(tmp_path, change):
    path = write_config(tmp_path / "Meta-Llama-3-8B", {**LLAMA31_8B, **change})
    assert recipe_model(path) is None
    assert nearest_recipe(job(path, 8, 32)) is None


def test_a_missing_config_has_no_recipe_and_no_error():
    assert recipe_model("/no/such/config.json") is None


def plan_json(model: str, out: Path, capsys) -> dict:
    argv = ["plan", "--model", model, "--gpus", "8", "--global-batch", "32", "--seq-len", "8192"]
    argv += ["--no-png", "--quiet", "--json", "--tune-evaluations", "50", "-o", str(out)]
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_plan_json_has_the_recipe_of_a_config_json(tmp_path, capsys):
    path = write_config(tmp_path / "Llama-3.1-8B", LLAMA31_8B)
    mine = plan_json(path, tmp_path / "a", capsys)
    named = plan_json("llama3-8b", tmp_path / "b", capsys)
    assert mine["recipe"] is not None and mine["recipe"]["source"] == "NeMo llama3_8b, 8 GPUs at 8K"
    assert {k: mine["recipe"][k] for k in ("tp", "cp", "pp", "dp")} == {
        "tp": 1,
        "cp": 2,
        "pp": 1,
        "dp": 4,
    }
    assert mine["recipe"] == named["recipe"]


def test_plan_json_of_another_shape_has_no_recipe(tmp_path, capsys):
    path = write_config(tmp_path / "Meta-Llama-3-8B", {**LLAMA31_8B, "vocab_size": 32000})
    assert plan_json(path, tmp_path / "a", capsys)["recipe"] is None


def test_a_broken_config_json_is_one_line_and_exit_2(tmp_path, capsys):
    path = write_config(tmp_path / "m", {**LLAMA31_8B, "hidden_size": "big"})
    argv = ["plan", "--model", path, "--gpus", "8", "--global-batch", "32", "--json"]
    assert main([*argv, "--quiet", "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    assert "config.json" in err and "hidden_size" in err
