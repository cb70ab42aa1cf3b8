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
sequence; positions, masks and rotary embeddings stay the whole sequence's. The model's
attention goes through OctoPipe's attention implementation (`runtime.model.hf_attention`),
which runs the config's own (sdpa) and lets a selective stage recompute the attention core alone.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from octopipe.errors import InputError
from octopipe.jsonfile import read_json
from octopipe.runtime.model.hf_attention import route_attention
from octopipe.runtime.model.hf_lean import make_lean
from octopipe.runtime.model.recipe import Activation, ModelRecipe, token_chains
from octopipe.runtime.parallel.context import context_of
from octopipe.runtime.parallel.tensor_parallel import tp_degree

# What every Llama-structured causal LM's config gives its shapes (transformers would fill a
# missing one with its own default, e.g. hidden_size 4096: a model nobody asked for).
_REQUIRED_SHAPES = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
)


def load_config(path: str):
    """The transformers config of a config.json, or of the folder that holds one, read strictly
    (the keys a model of its family needs, each of its type; no remote code)."""
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
    raw = read_json(file)
    check_config(raw, str(file))
    from transformers import CONFIG_MAPPING

    from octopipe.runtime.model.fp8 import torchao_quietly

    with torchao_quietly():  # the models' module imports its quantizers, and they torchao
        import transformers.modeling_utils  # noqa: F401

    if raw["model_type"] not in CONFIG_MAPPING:
        message = f"unknown model_type {raw['model_type']!r} (transformers has no such model)"
        raise InputError(str(file), message, "model_type")
    try:
        config = AutoConfig.for_model(**raw)
    except (ValueError, TypeError, KeyError) as exc:  # an unknown model_type, a bad value
        raise InputError(str(file), f"transformers refused it: {_first_line(exc)}") from None
    config._attn_implementation = "sdpa"
    return config


def check_config(raw, where: str) -> None:
    """A config OctoPipe builds a model from: an object with a `model_type`, no remote code,
    and the shapes of its family, each a positive integer (the cost model's own checks for the
    families it knows, which hold every key its estimate needs)."""
    from octopipe.costmodel.config_checks import check_config_fields
    from octopipe.costmodel.hf_config import (
        FAMILY_OF_MODEL_TYPE,
        architecture_from_hf,
        check_hf_runnable,
    )

    if not isinstance(raw, dict):
        raise InputError(where, "expected a JSON object")
    if not isinstance(raw.get("model_type"), str):
        raise InputError(where, "no model_type: not a transformers config", "model_type")
    if "auto_map" in raw:
        raise InputError(
            where, "names code of its own (auto_map); OctoPipe runs no remote code", "auto_map"
        )
    check_config_fields(raw, where)  # heads, RoPE scaling: before transformers sees them
    if raw["model_type"] in FAMILY_OF_MODEL_TYPE:
        # The cost model's other families (GPT-2, Nemotron-H, ...) are refused here, by the rule
        # `profile-arch --layer-names hf` keeps; a type it does not know meets _check_structure.
        check_hf_runnable(raw["model_type"], where, "model_type")
        architecture_from_hf(raw, where, Path(where).stem)
        return
    for key in _REQUIRED_SHAPES:
        value = raw.get(key)
        if value is None:
            raise InputError(where, "missing field", key)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 2**31:
            raise InputError(where, f"expected a positive integer (got {value!r})", key)


def _first_line(exc: BaseException, limit: int = 200) -> str:
    line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return line if len(line) <= limit else line[: limit - 3] + "..."


def hf_recipe(path: str) -> ModelRecipe:
    config = load_config(path)
    from transformers import AutoModelForCausalLM

    def build() -> nn.Module:
        from transformers.utils import logging

        verbosity = logging.get_verbosity()
        logging.set_verbosity_error()  # its advice on other model kinds; ours is one line
        try:
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        except ValueError as exc:  # a config of no causal LM (an encoder, a vision model)
            raise InputError("--model", f"hf:{path}: {_first_line(exc)}") from None
        finally:
            logging.set_verbosity(verbosity)
        route_attention(model.config)  # its attention cores run where a stage may recompute them
        make_lean(model)  # its norms and gated MLPs keep what fused kernels keep
        return model

    recipe = ModelRecipe(
        name=getattr(config, "name_or_path", "") or f"hf-{config.model_type}",
        build=build,
        init=_init_module,
        forward=run_causal_lm_stage,
    )
    _check_structure(recipe.meta_model)
    recipe.plans_by("hf_plan")
    recipe.synthetic = token_chains(recipe)
    recipe.kinds = tuple(_kind(name) for name in recipe.layers)
    positions = getattr(config, "max_position_embeddings", None)
    recipe.max_positions = positions if isinstance(positions, int) and positions > 0 else None
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
        # Under context parallelism the rank's share of the sequence, at its global positions.
        length = h.shape[1] * tp_degree(part)
        whole = h.new_empty((h.shape[0], length, 0)) if length != h.shape[1] else h
        context = context_of(part)
        positions = (
            torch.arange(length, device=h.device)
            if context is None
            else context.positions(length, h.device)
        ).unsqueeze(0)
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
