"""torchtitan 0.3's own configs by the model's shape (`engines/torchtitan/registry.py`): a
shipped model or a Hugging Face config.json of a shape torchtitan has a config of gets its
`octopipe_torchtitan.py` without `--torchtitan-config`; with `--runner torchtitan`, a model of
no such shape is one line and exit 2 naming the flag, while `octopipe run`'s answer keeps the
hint. The config.json files below are written from the published models' shapes (nothing is
downloaded)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from published_configs import LLAMA31_8B, write_config

from octopipe.cli import main
from octopipe.costmodel import load_architecture
from octopipe.costmodel.hf_config import shipped_models
from octopipe.engines import Exports
from octopipe.engines.torchtitan import SHIPPED_BASES, TorchtitanBase, base_config, model_base
from octopipe.engines.torchtitan.config import TORCHTITAN_MODELS
from octopipe.engines.torchtitan.registry import CONFIGS, no_base_reason, shape_of

QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "head_dim": 128,
    "num_key_value_heads": 8,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000,
    "sliding_window": None,
    "use_sliding_window": False,
    "tie_word_embeddings": False,
}
QWEN3_14B = {
    **QWEN3,
    "hidden_size": 5120,
    "intermediate_size": 17408,
    "num_hidden_layers": 40,
    "num_attention_heads": 40,
}
QWEN3_32B = {
    **QWEN3,
    "hidden_size": 5120,
    "intermediate_size": 25600,
    "num_hidden_layers": 64,
    "num_attention_heads": 64,
}
QWEN3_8B = {
    **QWEN3,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
}
QWEN3_0_6B = {
    **QWEN3,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "tie_word_embeddings": True,
}
QWEN3_30B_A3B = {
    **QWEN3,
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "norm_topk_prob": True,
}
MOONLIGHT = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": 2048,
    "intermediate_size": 11264,
    "moe_intermediate_size": 1408,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "n_shared_experts": 2,
    "n_routed_experts": 64,
    "num_experts_per_tok": 6,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "q_lora_rank": None,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "vocab_size": 163840,
    "max_position_embeddings": 8192,
    "rope_theta": 50000.0,
    "tie_word_embeddings": False,
}


def gpt_oss(layers: int, experts: int) -> dict:
    return {
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "hidden_size": 2880,
        "intermediate_size": 2880,
        "num_hidden_layers": layers,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "num_local_experts": experts,
        "num_experts_per_tok": 4,
        "vocab_size": 201088,
        "sliding_window": 128,
        "layer_types": ["sliding_attention", "full_attention"] * (layers // 2),
        "max_position_embeddings": 131072,
        "rope_theta": 150000,
        "tie_word_embeddings": False,
    }


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (LLAMA31_8B, "llama3:llama3_8b"),
        (
            {
                **LLAMA31_8B,
                "hidden_size": 16384,
                "intermediate_size": 53248,
                "num_hidden_layers": 126,
                "num_attention_heads": 128,
            },
            "llama3:llama3_405b",
        ),
        (QWEN3_14B, "qwen3:qwen3_14b"),
        (QWEN3_32B, "qwen3:qwen3_32b"),
        (QWEN3_30B_A3B, "qwen3:qwen3_30b_a3b"),
        (MOONLIGHT, "kimi_k2_7:moonlight_16b_a3b"),
        (gpt_oss(24, 32), "gpt_oss:gpt_oss_20b"),
        (gpt_oss(36, 128), "gpt_oss:gpt_oss_120b"),
    ],
)
def test_a_config_json_of_a_torchtitan_shape_gets_its_config(tmp_path, data, expected):
    arch = load_architecture(write_config(tmp_path / "m", data))
    assert model_base(arch) == TorchtitanBase.parse(expected)
    assert base_config(Exports(), str(tmp_path / "m" / "config.json")) == model_base(arch)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (
            {**LLAMA31_8B, "vocab_size": 32000},
            "the nearest, llama3_8b: vocabulary 128256, not 32000",
        ),
        ({**LLAMA31_8B, "num_hidden_layers": 33}, "the nearest, llama3_8b: layers 32, not 33"),
        (QWEN3_8B, "only the fine-tuning config qwen3:sft_qwen3_8b_math builds it"),
        (QWEN3_0_6B, "its qwen3 configs (qwen3_14b, qwen3_32b) build other shapes"),
        ({**MOONLIGHT, "model_type": "kimi_k2"}, "Kimi K2.5 config builds a vision tower"),
        ({**QWEN3_14B, "model_type": "qwen2"}, "none builds 'qwen2' models"),
    ],
)
def test_another_shape_gets_none_and_says_why(tmp_path, data, reason):
    arch = load_architecture(write_config(tmp_path / "m", data))
    assert model_base(arch) is None
    assert reason in no_base_reason(arch)


def test_the_shipped_table_is_what_the_shapes_give():
    for name in shipped_models():
        assert model_base(load_architecture(name)) == SHIPPED_BASES.get(name), name
    assert SHIPPED_BASES["deepseek-v3"].config == "deepseek_v3_671b"
    assert SHIPPED_BASES["deepseek-v2-lite"].config == "deepseek_v3_16b"


def test_every_registry_entry_is_a_torchtitan_config_name():
    for c in CONFIGS:
        assert c.model in TORCHTITAN_MODELS
        assert c.base == TorchtitanBase(f"torchtitan.models.{c.model}.config_registry", c.config)
        assert len(c.shape.windows) == c.shape.layers
    shapes = [(c.model_types, c.shape) for c in CONFIGS]
    assert len(set(shapes)) == len(shapes)  # one config per shape: the choice is never a guess


def test_a_vision_model_has_no_decoder_shape():
    assert shape_of(load_architecture("tiny-vlm")) is None
    assert shape_of(load_architecture("tiny-hybrid")) is None


def load_module(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cluster(model: str, out: Path, *extra: str) -> list[str]:
    argv = ["plan", "--model", model, "--gpus", "8", "--gpus-per-node", "4"]
    argv += ["--global-batch", "16", "--seq-len", "256", "--no-png", "--quiet"]
    return [*argv, "--tune-evaluations", "50", *extra, "-o", str(out)]


def test_runner_torchtitan_writes_the_config_of_a_config_json_without_the_flag(tmp_path, capsys):
    model = write_config(tmp_path / "Qwen3-14B", QWEN3_14B)
    out = tmp_path / "out"
    assert main(cluster(model, out, "--runner", "torchtitan")) == 0
    written = load_module(out / "octopipe_torchtitan.py")
    assert written.BASE_MODULE == "torchtitan.models.qwen3.config_registry"
    assert written.BASE_CONFIG == "qwen3_14b"
    text = capsys.readouterr().out
    assert "from torchtitan.models.qwen3.config_registry.qwen3_14b" in text
    assert "--torchtitan-config" not in text


def test_runner_torchtitan_without_a_config_is_one_line_and_exit_2(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(cluster("tiny-llama", out, "--runner", "torchtitan")) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    assert err.startswith("octopipe plan: error: --runner torchtitan: torchtitan 0.3 has no ")
    assert "give --torchtitan-config MODULE:CONFIG" in err
    assert "the nearest, llama3_8b: layers 32, not 4" in err
    assert not (out / "octopipe_torchtitan.py").exists() and not (out / "torchtitan.toml").exists()


def test_runner_torchtitan_with_the_flag_writes_that_config(tmp_path, capsys):
    out = tmp_path / "out"
    flag = ["--runner", "torchtitan", "--torchtitan-config", "llama3:llama3_debugmodel"]
    assert main(cluster("tiny-llama", out, *flag)) == 0
    assert load_module(out / "octopipe_torchtitan.py").BASE_CONFIG == "llama3_debugmodel"


def test_octopipe_runner_keeps_the_hint_for_a_model_without_a_config(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(cluster("tiny-llama", out)) == 0
    assert "give --torchtitan-config MODULE:CONFIG" in capsys.readouterr().out
    assert (out / "torchtitan.toml").exists() and not (out / "octopipe_torchtitan.py").exists()
