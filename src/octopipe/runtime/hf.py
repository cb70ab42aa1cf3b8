"""Hugging Face `transformers` decoder-only causal LMs as pipeline models: `--model hf:PATH`.

PATH is a `config.json` or a folder holding one. The model is `AutoModelForCausalLM.from_config`
(random weights, nothing downloaded), in fp32. Its layers are `model.embed_tokens`,
`model.layers.<i>`, `model.norm` and `lm_head` (`profile-arch --layer-names hf` emits the same).

The model's own forward cannot run a stage (it needs every part), so this adapter runs a pruned
copy the way that forward does, and no more: embed if the stage holds the embedding, then
positions, the causal mask (transformers' own mask functions, per layer attention type) and
the rotary embedding, which every stage computes for itself from its own copy; the decoder
layers it holds; the norm and the head if it holds them. Llama, Qwen2/Qwen3, Mistral and MoE
models of the same structure (Qwen2-MoE, Mixtral) fit. The MoE router's auxiliary loss is not
added (transformers adds it only with `output_router_logits`). Under tensor parallelism
(`parallel.tp_plans.hf_plan`) the hidden states between layers are the rank's share of the
sequence; positions, masks and rotary embeddings stay the whole sequence's.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from octopipe.errors import InputError
from octopipe.runtime.parallel.tensor_parallel import tp_degree
from octopipe.runtime.parallel.tp_plans import hf_plan
from octopipe.runtime.recipe import Activation, ModelRecipe, token_chains


def load_config(path: str):
    """The transformers config of a config.json, or of the folder that holds one."""
    try:
        from transformers import AutoConfig
    except ImportError:
        raise InputError(
            "--model", "hf: models need transformers: pip install -e '.[hf]'"
        ) from None
    file = Path(path)
    if file.is_dir():
        file = file / "config.json"
    if not file.is_file():
        raise InputError("--model", f"no config.json at {path}")
    try:
        raw = json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise InputError("--model", f"{file} is not JSON: {exc}") from None
    if "model_type" not in raw:
        raise InputError("--model", f"{file} has no model_type: not a transformers config")
    config = AutoConfig.for_model(**raw)
    config._attn_implementation = "sdpa"
    return config


def hf_recipe(path: str) -> ModelRecipe:
    config = load_config(path)
    from transformers import AutoModelForCausalLM

    def build() -> nn.Module:
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32)

    recipe = ModelRecipe(
        name=getattr(config, "name_or_path", "") or f"hf-{config.model_type}",
        build=build,
        init=_init_module,
        forward=run_causal_lm_stage,
    )
    _check_structure(recipe.meta_model)
    recipe.tp_plan = lambda tp: hf_plan(recipe.meta_model, tp)
    recipe.synthetic = token_chains(recipe)
    recipe.kinds = tuple(_kind(name) for name in recipe.layers)
    return recipe


def _init_module(model: nn.Module, module: nn.Module) -> None:
    """transformers' own initialization of one module (norms, linears, rotary buffers...)."""
    model._init_weights(module)


def _check_structure(model: nn.Module) -> None:
    inner = getattr(model, "model", None)
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    if inner is None or not all(hasattr(inner, n) for n in needed) or not hasattr(model, "lm_head"):
        raise InputError(
            "--model",
            f"{type(model).__name__} is not a decoder-only causal LM of the Llama structure "
            "(model.embed_tokens, model.layers, model.norm, model.rotary_emb, lm_head)",
        )


def _kind(name: str) -> str:
    if name.endswith("embed_tokens"):
        return "embedding"
    if name == "lm_head":
        return "output"
    if name.endswith(".norm"):
        return "norm"
    return "decoder"


def run_causal_lm_stage(part: nn.Module, inputs: Activation) -> Activation:
    """Run whichever parts of a causal LM the pruned copy holds on (token ids | hidden states)."""
    from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

    inner = part.model
    (h,) = inputs
    if inner.embed_tokens is not None:
        h = inner.embed_tokens(h)
    layers = [(int(key), layer) for key, layer in inner.layers.named_children()]
    if layers:
        # Under tensor parallelism h holds the rank's share of the sequence; positions, masks
        # and rotary embeddings are the whole sequence's (the attention gathers it).
        length = h.shape[1] * tp_degree(part)
        whole = h.new_empty((h.shape[0], length, 0)) if length != h.shape[1] else h
        positions = torch.arange(length, device=h.device).unsqueeze(0)
        masks = {}
        for index, _ in layers:
            kind = _attention_kind(index, inner.config)
            if kind not in masks:
                make = (
                    create_sliding_window_causal_mask
                    if kind == "sliding_attention"
                    else create_causal_mask
                )
                masks[kind] = make(
                    config=inner.config,
                    inputs_embeds=whole,
                    attention_mask=None,
                    cache=None,
                    position_ids=positions,
                )
        rotary = inner.rotary_emb(whole, position_ids=positions)
        for index, layer in layers:
            h = layer(
                h,
                attention_mask=masks[_attention_kind(index, inner.config)],
                position_ids=positions,
                position_embeddings=rotary,
            )
            h = h[0] if isinstance(h, tuple) else h
    if inner.norm is not None:
        h = inner.norm(h)
    if part.lm_head is not None:
        h = part.lm_head(h)
    return (h,)


def _attention_kind(index: int, config) -> str:
    """Layer `index`'s mask, as its model's forward picks it: by the config's per-layer types
    where it lists them (Qwen2/3), else by its sliding window (Mistral, Mixtral)."""
    types = getattr(config, "layer_types", None)
    if types is not None:
        return types[index]
    return "sliding_attention" if getattr(config, "sliding_window", None) else "full_attention"
