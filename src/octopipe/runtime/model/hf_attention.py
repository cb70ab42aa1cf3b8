"""Selective recomputation for Hugging Face `transformers` models: the attention core redone.

transformers' attention modules (those of every Llama-structured family `runtime/model/hf.py`
adapts: Llama, Qwen2/3, Mistral, Mixtral, Qwen2/3-MoE) compute q, k and v themselves, then hand
them to a function they look up in `ALL_ATTENTION_FUNCTIONS` by their config's
`_attn_implementation`: QK^T, mask, softmax, dropout and the product with V, no weights. That
function is the attention core of Korthikanti et al. 2022, so it is what a selective stage
recomputes.

`route_attention(config)` points a built model's config at an implementation registered here
(`octopipe_sdpa` for `sdpa`, and so on), which calls the one the config had (the inner one)
directly, or, for an attention module marked by `recompute_core`, under torch's non-reentrant
checkpoint: F keeps only q, k, v and the mask, the backward redoes the core first. Its
projections run once; so the module is not a checkpointed module of its stage
(`StageModule.recomputed`), and a split backward's W keeps its inputs from F. The module tree,
its FQNs, tensor-parallel plans and FSDP2 are those of the unrouted model. An attention module
that calls no such function (a model built elsewhere, a family that computes its attention
inline) is not routed: its stage cannot recompute selectively (`runtime/model/recompute.py`).
Under context parallelism a routed module marked by `parallel.context.apply_cp` runs ring
attention in place of the inner implementation.
"""

from __future__ import annotations

import inspect
import sys
from functools import partial

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

PREFIX = "octopipe_"  # of the implementations registered here: PREFIX + the inner one's name
_DISPATCH = "ALL_ATTENTION_FUNCTIONS"  # the name transformers' attention modules look up
_MARK = "_octopipe_recompute_core"  # set on the attention modules of a selective stage
_CONTEXT = "_octopipe_context"  # set on attention modules under context parallelism


def route_attention(config) -> None:
    """Point `config` (a built model's: its attention modules share it) at OctoPipe's
    implementation over the one it names; a config routed already stays as it is."""
    inner = config._attn_implementation or "eager"
    if inner.startswith(PREFIX):
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    key = PREFIX + inner
    AttentionInterface.register(key, partial(_attention, inner))
    # transformers builds the mask by the implementation's name: the inner one's mask.
    mask = ALL_MASK_ATTENTION_FUNCTIONS._global_mapping.get(inner)
    if mask is not None:
        AttentionMaskInterface.register(key, mask)
    config._attn_implementation = key


def routed_attention(module: nn.Module) -> bool:
    """Whether `module` is a transformers attention module whose core runs here: it looks its
    attention function up in transformers' dispatch, and its config is routed."""
    implementation = getattr(getattr(module, "config", None), "_attn_implementation", None)
    if not (isinstance(implementation, str) and implementation.startswith(PREFIX)):
        return False
    code = getattr(inspect.unwrap(type(module).forward), "__code__", None)
    return code is not None and _DISPATCH in code.co_names


def recompute_core(module: nn.Module) -> None:
    """Have a routed attention module's core recomputed in its backward."""
    assert routed_attention(module), f"{type(module).__name__} is no routed attention module"
    setattr(module, _MARK, True)


def _attention(inner: str, module: nn.Module, *args, **kwargs):
    attend = _implementation(inner, module)
    if getattr(module, _CONTEXT, None) is not None:
        attend = _context_parallel
    if getattr(module, _MARK, False) and torch.is_grad_enabled():
        return checkpoint(attend, module, *args, use_reentrant=False, **kwargs)
    return attend(module, *args, **kwargs)


def _context_parallel(module: nn.Module, query, key, value, attention_mask=None, **kwargs):
    """The core under context parallelism (`parallel.context`): the rank's queries over the
    whole sequence, causal by global position (the mask, made for the rank's share, unused),
    shaped as transformers' sdpa returns it."""
    scale = kwargs.get("scaling") or query.shape[-1] ** -0.5
    out = getattr(module, _CONTEXT).attend(query, key, value, scale)
    return out.transpose(1, 2).contiguous(), None


def _implementation(inner: str, module: nn.Module):
    """The inner implementation, looked up as transformers does, at the call (so one
    registered later, or replaced, is the one that runs)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if inner in ALL_ATTENTION_FUNCTIONS:
        return ALL_ATTENTION_FUNCTIONS[inner]
    # "eager" is no entry: each family's modeling file has its own eager function.
    for cls in type(module).__mro__:
        eager = getattr(sys.modules.get(cls.__module__), "eager_attention_forward", None)
        if eager is not None:
            return eager
    raise KeyError(f"no attention implementation {inner!r} for {type(module).__name__}")
