"""Architecture layer: every shipped config loads, layer names follow the contract, bad configs
give one clear InputError."""

import json

import pytest

from octopipe.costmodel.arch import KINDS, layer_specs
from octopipe.costmodel.hf_config import config_path, load_architecture, shipped_models
from octopipe.errors import InputError


@pytest.mark.parametrize("name", shipped_models())
def test_shipped_config_loads_with_contract_names(name):
    arch = load_architecture(name)
    specs = layer_specs(arch)
    names = [s.name for s in specs]
    assert len(set(names)) == len(names)
    assert all(s.kind in KINDS for s in specs)
    text_start = names.index("tok_embeddings")
    assert names[text_start + 1 : text_start + 1 + arch.num_layers] == [
        f"layers.{i}" for i in range(arch.num_layers)
    ]
    assert names[-2:] == ["norm", "output"]
    if arch.vision is not None:
        assert names[0] == "vision.patch_embed" and names[text_start - 1] == "projector"
    else:
        assert text_start == 0


def test_family_specific_layers():
    gemma2 = layer_specs(load_architecture("gemma2-9b"))
    assert [s.window for s in gemma2[1:5]] == [4096, None, 4096, None]
    v3 = [s.kind for s in layer_specs(load_architecture("deepseek-v3"))]
    assert v3[1:5] == ["decoder", "decoder", "decoder", "moe"]
    hybrid = layer_specs(load_architecture("nemotron-h-8b"))
    assert [s.kind for s in hybrid[1:10]] == ["mamba", "mlp"] * 3 + ["mamba", "attention", "mlp"]
    vlm = {s.name: s.kind for s in layer_specs(load_architecture("llama3.2-11b-vision"))}
    assert vlm["layers.3"] == "cross_attention" and vlm["layers.4"] == "decoder"


def test_load_by_path(tmp_path):
    cfg = tmp_path / "mine.json"
    cfg.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "vocab_size": 100,
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
            }
        )
    )
    arch = load_architecture(str(cfg))
    assert (
        arch.name == "mine" and arch.attention.num_kv_heads == 4 and arch.attention.head_dim == 16
    )


@pytest.mark.parametrize(
    "patch, place",
    [
        ({"hidden_size": -1}, "hidden_size"),
        ({"num_hidden_layers": None}, "num_hidden_layers"),
        ({"model_type": "gpt9"}, "model_type"),
        ({"num_key_value_heads": 3}, "num_key_value_heads"),
        ({"hybrid_override_pattern": "M*"}, "hybrid_override_pattern"),
    ],
)
def test_bad_config_names_file_and_field(tmp_path, patch, place):
    data = json.loads((config_path("nemotron-h-8b")).read_text())
    data.update(patch)
    cfg = tmp_path / "bad.json"
    cfg.write_text(json.dumps(data))
    with pytest.raises(InputError) as err:
        load_architecture(str(cfg))
    assert str(cfg) in str(err.value) and place in str(err.value)
    assert "\n" not in str(err.value)


def test_unknown_name_and_malformed_json(tmp_path):
    with pytest.raises(InputError, match="no such config"):
        load_architecture("no-such-model")
    cfg = tmp_path / "broken.json"
    cfg.write_text("{")
    with pytest.raises(InputError, match="malformed JSON"):
        load_architecture(str(cfg))
