"""Read architecture configs: a Hugging Face style config.json, or a shipped one by name.

`load_architecture("llama3-8b")` or `load_architecture("path/to/config.json")`.

Field names follow the `transformers` configs of each family (LLaMA, Qwen2, Mistral, Gemma-2/3,
DeepSeek-V2/V3, Qwen2-MoE, Mixtral, Nemotron-H, Mllama, GPT-2, GPT-NeoX). Every fault is one
InputError naming the file and the field. Only shapes are read; training hyper-parameters are
ignored.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from octopipe.costmodel.arch import (
    DEEPSEEK,
    DENSE,
    GEMMA,
    GPT,
    HYBRID,
    HYBRID_CHARS,
    SPARSE,
    VLM,
    Architecture,
    AttentionShape,
    LatentAttentionShape,
    MambaShape,
    MoEShape,
    VisionShape,
)
from octopipe.costmodel.config_checks import check_config_fields
from octopipe.costmodel.hf_fields import Fields as _Fields
from octopipe.errors import InputError
from octopipe.limits import MAX_LAYERS

FAMILY_OF_MODEL_TYPE = {
    "llama": DENSE,
    "mistral": DENSE,
    "qwen2": DENSE,
    "qwen3": DENSE,
    "nemotron": DENSE,  # Nemotron-3/4: squared-ReLU MLP (no gate), LayerNorm with a bias
    "gemma2": GEMMA,
    "gemma3": GEMMA,
    "gemma3_text": GEMMA,
    "deepseek_v2": DEEPSEEK,
    "deepseek_v3": DEEPSEEK,
    "kimi_k2": DEEPSEEK,  # Kimi K2: DeepSeek-V3's architecture (MLA, routed + shared experts)
    "qwen2_moe": SPARSE,
    "qwen3_moe": SPARSE,
    "mixtral": SPARSE,
    "gpt_oss": SPARSE,  # gpt-oss: GQA with sinks, alternating sliding/full layers, MoE with biases
    "nemotron_h": HYBRID,
    "mllama": VLM,
    "gpt2": GPT,
    "gpt_neox": GPT,
}

# The model types `--model hf:` runs (runtime/model/hf.py's adapter: transformers' Llama structure,
# each held by tests/test_recompute_hf.py), named as messages name them. One rule, here where
# no torch is imported: `hf:` refuses the others the cost model knows, and `profile-arch
# --layer-names hf` names no layers for them, so no profile promises a run that cannot start.
HF_RUNNABLE = {
    "llama": "Llama",
    "qwen2": "Qwen2",
    "qwen3": "Qwen3",
    "mistral": "Mistral",
    "mixtral": "Mixtral",
    "qwen2_moe": "Qwen2-MoE",
    "qwen3_moe": "Qwen3-MoE",
}


def check_hf_runnable(model_type: str, where: str, place: str | None = None) -> None:
    """An InputError unless `--model hf:` runs models of `model_type`."""
    if model_type not in HF_RUNNABLE:
        families = ", ".join(HF_RUNNABLE.values())
        message = f"{model_type!r} models do not run on `--model hf:` (it runs {families})"
        raise InputError(where, message, place)


def architecture_from_hf(data: Any, where: str, name: str) -> Architecture:
    """Build an Architecture from a parsed config.json (`where` names the file in errors)."""
    check_config_fields(data, where)  # what the reader below does not bound (config_checks)
    top = _Fields(data, where)
    model_type = top.str("model_type")
    family = FAMILY_OF_MODEL_TYPE.get(model_type)
    if family is None:
        known = ", ".join(sorted(FAMILY_OF_MODEL_TYPE))
        raise top.fault("model_type", f"unsupported model_type {model_type!r} (known: {known})")
    # Multimodal wrappers keep the language model's fields in text_config.
    text = top.sub("text_config") if top.has("text_config") else top
    if family == GPT:
        return _gpt_stack(top, model_type, name)
    arch = _text_stack(text, model_type, family, name)
    if family == VLM:
        arch = _with_vision(arch, top.sub("vision_config"), text)
    _check_layer_tuples(arch, text)
    return arch


def _text_stack(f: _Fields, model_type: str, family: str, name: str) -> Architecture:
    hidden = f.int("hidden_size")
    num_layers = f.int("num_hidden_layers", maximum=MAX_LAYERS)
    heads = f.int("num_attention_heads")
    kv_heads = f.int("num_key_value_heads", heads)
    if heads % kv_heads:
        raise f.fault("num_key_value_heads", f"{kv_heads} does not divide {heads} heads")
    gemma = family == GEMMA
    attention = AttentionShape(
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=f.int("head_dim", hidden // heads),
        bias=f.bool("attention_bias", model_type == "qwen2" or model_type == "qwen2_moe"),
        logit_softcap=f.float("attn_logit_softcapping", None),
        query_scale=f.float("query_pre_attn_scalar", None) if gemma else None,
        qk_norm=model_type in ("gemma3", "gemma3_text", "qwen3", "qwen3_moe"),
    )
    act_key = "hidden_activation" if f.has("hidden_activation") else "hidden_act"
    if family == HYBRID:
        act_key = "mlp_hidden_act"
    return Architecture(
        name=name,
        model_type=model_type,
        family=family,
        vocab_size=f.int("vocab_size"),
        hidden_size=hidden,
        num_layers=num_layers,
        intermediate_size=f.int("intermediate_size"),
        hidden_act=f.str(act_key, "silu"),
        attention=attention,
        norm_eps=f.float("rms_norm_eps", f.float("layer_norm_epsilon", 1e-5)),
        rope_theta=f.float("rope_theta", 10000.0),
        max_position_embeddings=f.int("max_position_embeddings", 4096),
        tie_word_embeddings=f.bool("tie_word_embeddings", gemma),
        embed_scale=math.sqrt(hidden) if gemma else 1.0,
        final_logit_softcap=f.float("final_logit_softcapping", None),
        layer_windows=_layer_windows(f, model_type, num_layers),
        gated_mlp=family != HYBRID and model_type != "nemotron",
        norm_bias=model_type == "nemotron",
        latent_attention=_latent_attention(f, heads) if family == DEEPSEEK else None,
        moe=_moe(f, model_type, family) if _has_moe(f, family) else None,
        moe_layers=_moe_layers(f, model_type, family, num_layers),
        mamba=_mamba(f) if family == HYBRID else None,
        hybrid_pattern=_hybrid_pattern(f, num_layers) if family == HYBRID else None,
        cross_attention_layers=f.int_list("cross_attention_layers") if family == VLM else (),
        extra_vocab=8 if family == VLM else 0,
    )


def _gpt_stack(f: _Fields, model_type: str, name: str) -> Architecture:
    """GPT-2 (`n_embd`, `n_layer`, `n_head`, `n_inner`, `n_positions`: learned positions, tied
    embeddings) and GPT-NeoX (`hidden_size`, ..., rotary positions, an untied head): LayerNorm
    with biases, a GELU MLP with biases, multi-head attention with biases. GPT-NeoX's parallel
    residual (attention and MLP read one input) costs the same as the sequential one."""
    gpt2 = model_type == "gpt2"
    hidden = f.int("n_embd" if gpt2 else "hidden_size")
    heads = f.int("n_head" if gpt2 else "num_attention_heads")
    if hidden % heads:
        raise f.fault(
            "n_head" if gpt2 else "num_attention_heads", f"{heads} does not divide {hidden}"
        )
    width = f.int("n_inner", 4 * hidden) if gpt2 else f.int("intermediate_size")
    positions = f.int("n_positions" if gpt2 else "max_position_embeddings", 2048)
    return Architecture(
        name=name,
        model_type=model_type,
        family=GPT,
        vocab_size=f.int("vocab_size"),
        hidden_size=hidden,
        num_layers=f.int("n_layer" if gpt2 else "num_hidden_layers", maximum=MAX_LAYERS),
        intermediate_size=width,
        hidden_act=f.str("activation_function" if gpt2 else "hidden_act", "gelu"),
        attention=AttentionShape(
            num_heads=heads,
            num_kv_heads=heads,
            head_dim=hidden // heads,
            bias=f.bool("attention_bias", True) if not gpt2 else True,
        ),
        norm_eps=f.float("layer_norm_epsilon" if gpt2 else "layer_norm_eps", 1e-5),
        rope_theta=f.float("rotary_emb_base", 10000.0),
        max_position_embeddings=positions,
        tie_word_embeddings=f.bool("tie_word_embeddings", gpt2),
        gated_mlp=False,
        norm_bias=True,
        mlp_bias=True,
        learned_positions=positions if gpt2 else 0,
    )


def _layer_windows(f: _Fields, model_type: str, num_layers: int) -> tuple[int | None, ...]:
    """Per layer: the sliding window, or None for global attention."""
    types = _layer_types(f, num_layers) if f.has("layer_types") else None
    window = f.int("sliding_window", None)
    if window is None or (
        model_type.startswith("qwen") and not f.bool("use_sliding_window", False)
    ):
        return (None,) * num_layers
    if types is not None:
        return tuple(window if t == "sliding_attention" else None for t in types)
    if model_type == "gemma2":  # even layers slide, odd layers are global
        return tuple(window if i % 2 == 0 else None for i in range(num_layers))
    if model_type.startswith("gemma3"):  # every `pattern`-th layer is global
        pattern = f.int("sliding_window_pattern", 6)
        return tuple(None if (i + 1) % pattern == 0 else window for i in range(num_layers))
    return (window,) * num_layers  # Mistral v0.1: every layer slides


# The per-layer attention kinds the model prices; transformers refuses names outside its own
# list, and a name priced as full attention by mistake would misprice every sliding layer.
PRICED_LAYER_TYPES = ("full_attention", "sliding_attention")


def _layer_types(f: _Fields, num_layers: int) -> list[str]:
    types = f.data["layer_types"]
    if not isinstance(types, list) or len(types) != num_layers:
        raise f.fault("layer_types", f"expected a list of {num_layers} layer types")
    unknown = next((t for t in types if t not in PRICED_LAYER_TYPES), None)
    if unknown is not None:
        raise f.fault(
            "layer_types",
            f"{str(unknown)[:40]!r} is not a layer type: expected "
            f"{' or '.join(PRICED_LAYER_TYPES)}",
        )
    return types


def _latent_attention(f: _Fields, heads: int) -> LatentAttentionShape:
    return LatentAttentionShape(
        num_heads=heads,
        q_lora_rank=f.int("q_lora_rank", None),
        kv_lora_rank=f.int("kv_lora_rank"),
        qk_nope_head_dim=f.int("qk_nope_head_dim"),
        qk_rope_head_dim=f.int("qk_rope_head_dim"),
        v_head_dim=f.int("v_head_dim"),
    )


def _has_moe(f: _Fields, family: str) -> bool:
    """DeepSeek and the sparse families; Nemotron-H when its pattern has `E` layers."""
    if family == HYBRID:
        return "E" in f.str("hybrid_override_pattern")
    return family in (DEEPSEEK, SPARSE)


def _moe(f: _Fields, model_type: str, family: str) -> MoEShape:
    if model_type in ("mixtral", "gpt_oss"):
        shape = MoEShape(
            num_experts=f.int("num_local_experts"),
            top_k=f.int("num_experts_per_tok"),
            expert_intermediate_size=f.int("intermediate_size"),
            expert_bias=model_type == "gpt_oss",
        )
    elif family == HYBRID:  # Nemotron-H's MoE layers: routed experts and shared ones
        shape = MoEShape(
            num_experts=f.int("n_routed_experts"),
            top_k=f.int("num_experts_per_tok"),
            expert_intermediate_size=f.int("moe_intermediate_size"),
            shared_intermediate_size=f.int("n_shared_experts", 1, minimum=0)
            * f.int("moe_shared_expert_intermediate_size", 0, minimum=0),
        )
    elif family == DEEPSEEK:
        expert = f.int("moe_intermediate_size")
        shape = MoEShape(
            num_experts=f.int("n_routed_experts"),
            top_k=f.int("num_experts_per_tok"),
            expert_intermediate_size=expert,
            shared_intermediate_size=f.int("n_shared_experts", 0, minimum=0) * expert,
        )
    else:  # Qwen-MoE
        shape = MoEShape(
            num_experts=f.int("num_experts"),
            top_k=f.int("num_experts_per_tok"),
            expert_intermediate_size=f.int("moe_intermediate_size"),
            shared_intermediate_size=f.int("shared_expert_intermediate_size", 0, minimum=0),
            shared_expert_gate=f.int("shared_expert_intermediate_size", 0, minimum=0) > 0,
        )
    if shape.top_k > shape.num_experts:
        raise f.fault("num_experts_per_tok", f"{shape.top_k} exceeds {shape.num_experts} experts")
    return shape


def _moe_layers(f: _Fields, model_type: str, family: str, num_layers: int) -> tuple[bool, ...]:
    if model_type in ("mixtral", "gpt_oss"):
        return (True,) * num_layers
    if family == DEEPSEEK:
        first_dense = f.int("first_k_dense_replace", 0, minimum=0)
        freq = f.int("moe_layer_freq", 1)
        return tuple(i >= first_dense and i % freq == 0 for i in range(num_layers))
    if model_type in ("qwen2_moe", "qwen3_moe"):
        step = f.int("decoder_sparse_step", 1)
        dense_only = set(f.int_list("mlp_only_layers"))
        return tuple((i + 1) % step == 0 and i not in dense_only for i in range(num_layers))
    return ()


def _mamba(f: _Fields) -> MambaShape:
    return MambaShape(
        num_heads=f.int("mamba_num_heads"),
        head_dim=f.int("mamba_head_dim"),
        state_size=f.int("ssm_state_size"),
        n_groups=f.int("n_groups", 1),
        conv_kernel=f.int("conv_kernel", 4),
        chunk_size=f.int("chunk_size", 256),
    )


def _hybrid_pattern(f: _Fields, num_layers: int) -> str:
    pattern = f.str("hybrid_override_pattern")
    if len(pattern) != num_layers:
        raise f.fault(
            "hybrid_override_pattern",
            f"has {len(pattern)} characters but num_hidden_layers is {num_layers}",
        )
    bad = sorted(set(pattern) - set(HYBRID_CHARS))
    if bad:
        raise f.fault("hybrid_override_pattern", f"unknown layer characters {bad} (use M, *, -, E)")
    return pattern


def _with_vision(arch: Architecture, v: _Fields, text: _Fields) -> Architecture:
    global_layers = v.int("num_global_layers", 0, minimum=0)
    layers = v.int("num_hidden_layers", maximum=MAX_LAYERS) + global_layers
    image, patch = v.int("image_size"), v.int("patch_size")
    if image % patch:
        raise v.fault("patch_size", f"{patch} does not divide image_size {image}")
    vision = VisionShape(
        image_size=image,
        patch_size=patch,
        num_channels=v.int("num_channels", 3),
        hidden_size=v.int("hidden_size"),
        num_layers=layers,
        num_heads=v.int("attention_heads")
        if v.has("attention_heads")
        else v.int("num_attention_heads"),
        intermediate_size=v.int("intermediate_size"),
        output_dim=v.int("vision_output_dim", v.int("hidden_size")),
        max_num_tiles=v.int("max_num_tiles", 1),
        num_global_layers=global_layers,
        intermediate_layers=v.int_list("intermediate_layers_indices"),
    )
    if any(i >= layers for i in vision.intermediate_layers):
        raise v.fault("intermediate_layers_indices", f"an index is beyond {layers} layers")
    if not arch.cross_attention_layers:
        raise text.fault("cross_attention_layers", "a vision model needs at least one")
    return replace(arch, vision=vision)


def _check_layer_tuples(arch: Architecture, f: _Fields) -> None:
    for i in arch.cross_attention_layers:
        if i >= arch.num_layers:
            raise f.fault("cross_attention_layers", f"layer {i} is beyond {arch.num_layers} layers")


def _configs_dir() -> Path:
    return Path(__file__).parent / "configs"


def shipped_models() -> list[str]:
    """Names of the configs shipped with OctoPipe (file stems in costmodel/configs/)."""
    return sorted(p.stem for p in _configs_dir().glob("*.json"))


def config_path(name_or_path: str | Path) -> Path:
    """A shipped config's path by name, or the given path itself."""
    from octopipe.limits import MAX_TEXT_SETTING_CHARS as most

    if len(str(name_or_path)) > most:  # beyond any path: not a name to look up
        raise InputError("--model", f"is {len(str(name_or_path)):,} characters; at most {most:,}")
    candidate = _configs_dir() / f"{name_or_path}.json"
    if isinstance(name_or_path, str) and "/" not in name_or_path and _is_file(candidate):
        return candidate
    return Path(name_or_path)


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # a name longer than the file system's 255 bytes: no such file
        return False


def load_architecture(name_or_path: str | Path) -> Architecture:
    """Read a config.json (path) or a shipped config (name) into an Architecture.

    Raises InputError naming the file, the field and the fault for an unreadable or malformed
    config. Nothing is downloaded.
    """
    from octopipe.jsonfile import read_json

    path = config_path(name_or_path)
    if not _is_file(path) and isinstance(name_or_path, str) and not path.suffix:
        known = ", ".join(shipped_models())
        raise InputError(
            str(name_or_path), f"no such config file or shipped model (known: {known})"
        )
    data = read_json(path)
    return architecture_from_hf(data, where=str(path), name=model_name(data, path))


def model_name(data: Any, path: Path) -> str:
    """What a config's model is called (a profile's name starts with it): the file's stem, but
    for a `config.json` the model's own `_name_or_path` (its last part) or its `model_type`,
    so that profiles of Hugging Face folders are not all called "config"."""
    if path.stem != "config" or not isinstance(data, dict):
        return path.stem
    given = data.get("_name_or_path")
    if isinstance(given, str) and given.strip("/"):
        return given.strip("/").rsplit("/", 1)[-1]
    model_type = data.get("model_type")
    return model_type if isinstance(model_type, str) and model_type else path.stem
