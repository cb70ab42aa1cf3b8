"""The families of models trained today, read from the fields of their public config.json
(written here, nothing downloaded): gpt-oss, Kimi K2 (DeepSeek-V3's architecture), Nemotron-H
with MoE layers, Nemotron-4; their totals against the published ones."""

from __future__ import annotations

import pytest

from octopipe.costmodel import layer_specs
from octopipe.costmodel.build import estimate_layers, model_flops, parameter_count
from octopipe.costmodel.hardware import hardware_preset
from octopipe.costmodel.hf_config import architecture_from_hf
from octopipe.costmodel.settings import Settings
from octopipe.errors import InputError


def gpt_oss(layers: int, experts: int) -> dict:
    """openai/gpt-oss-120b (36 layers, 128 experts) and -20b (24, 32)."""
    return {
        "model_type": "gpt_oss",
        "attention_bias": True,
        "head_dim": 64,
        "hidden_size": 2880,
        "intermediate_size": 2880,
        "layer_types": ["sliding_attention", "full_attention"] * (layers // 2),
        "num_attention_heads": 64,
        "num_experts_per_tok": 4,
        "num_hidden_layers": layers,
        "num_key_value_heads": 8,
        "num_local_experts": experts,
        "sliding_window": 128,
        "tie_word_embeddings": False,
        "vocab_size": 201088,
    }


KIMI_K2 = {  # moonshotai/Kimi-K2-Instruct
    "model_type": "kimi_k2",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "n_routed_experts": 384,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "vocab_size": 163840,
    "tie_word_embeddings": False,
}

NEMOTRON_H_MOE = {  # Nemotron-H's fields, small, with `E` (MoE) layers in its pattern
    "model_type": "nemotron_h",
    "hidden_size": 512,
    "num_hidden_layers": 6,
    "hybrid_override_pattern": "MEM*EM",
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "intermediate_size": 1024,
    "mamba_num_heads": 16,
    "mamba_head_dim": 32,
    "ssm_state_size": 64,
    "n_groups": 2,
    "conv_kernel": 4,
    "n_routed_experts": 16,
    "num_experts_per_tok": 4,
    "moe_intermediate_size": 256,
    "moe_shared_expert_intermediate_size": 512,
    "n_shared_experts": 1,
    "mlp_hidden_act": "relu2",
    "vocab_size": 32000,
}


@pytest.mark.parametrize(
    ("config", "total", "active"),
    [
        (gpt_oss(36, 128), 116.83e9, 5.13e9),  # model card: 116.83B total, 5.13B active
        (gpt_oss(24, 32), 20.91e9, 3.61e9),  # 20.91B, 3.61B
        (KIMI_K2, 1.03e12, 32e9),  # model card: 1T total, 32B activated
    ],
)
def test_totals_match_the_published_ones(config, total, active):
    arch = architecture_from_hf(config, "config.json", config["model_type"])
    assert parameter_count(arch) == pytest.approx(total, rel=0.02)
    # Active parameters from the matmul FLOPs of one token (6 FLOPs per parameter).
    assert model_flops(arch, Settings(seq_len=1)) / 6 == pytest.approx(active, rel=0.03)


def test_gpt_oss_alternates_sliding_and_full_attention_and_biases_its_experts():
    arch = architecture_from_hf(gpt_oss(24, 32), "config.json", "gpt-oss-20b")
    windows = [s.window for s in layer_specs(arch) if s.kind == "moe"]
    assert windows[:4] == [128, None, 128, None]
    assert arch.moe is not None and arch.moe.expert_bias


def test_kimi_k2_is_deepseek_v3s_architecture():
    arch = architecture_from_hf(KIMI_K2, "config.json", "kimi-k2")
    kinds = [s.kind for s in layer_specs(arch) if s.name.startswith("layers.")]
    assert kinds[0] == "decoder" and set(kinds[1:]) == {"moe"}
    assert arch.latent_attention is not None and arch.latent_attention.kv_lora_rank == 512


def test_nemotron_h_moe_layers_run_the_experts_alone():
    arch = architecture_from_hf(NEMOTRON_H_MOE, "config.json", "nemotron-h-moe")
    specs = [s for s in layer_specs(arch) if s.name.startswith("layers.")]
    assert [s.kind for s in specs] == ["mamba", "moe_mlp", "mamba", "attention", "moe_mlp", "mamba"]
    layers = estimate_layers(arch, hardware_preset("h100"), Settings(seq_len=1024))
    moe = next(e for e in layers if e.spec.kind == "moe_mlp")
    assert moe.expert_params == 16 * 2 * 512 * 256  # relu2: up and down, no gate
    bad = {**NEMOTRON_H_MOE, "hybrid_override_pattern": "MXM*EM"}
    with pytest.raises(InputError, match="M, \\*, -, E"):
        architecture_from_hf(bad, "config.json", "bad")
