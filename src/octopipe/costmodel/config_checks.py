"""A model config's fields that the architecture reader does not bound itself, checked before
anything is built from them, so that no config reaches `transformers` (or our estimate) with a
value that would end in a traceback there.

- The attention's shape: `num_attention_heads` divides `hidden_size` where no `head_dim` is
  given (a head of 16.5 dimensions builds nothing), `head_dim` a positive integer, and a
  rotary head of more than 4 dimensions is even (transformers refuses an odd one).
- RoPE scaling, as transformers 5 defines it (`modeling_rope_utils`, the
  `_validate_<type>_rope_parameters` of `RotaryEmbeddingConfigMixin`): `rope_scaling` (the
  older key) or `rope_parameters` is null or an object whose `rope_type` (or older `type`) is
  one transformers knows, holding the keys that type requires, each of its kind.

- The work: the layers the config declares (`num_hidden_layers` or `n_layer`, with
  `text_config`'s and `vision_config`'s and a vision tower's `num_global_layers`) number at most
  `limits.MAX_CONFIG_LAYERS` together, so that no config makes an estimate or a model build
  run for minutes.

The GPT-2 spelling (`n_embd`, `n_head`) is checked the same way. Each fault is one
InputError naming the file and the field. Pure: no torch, no transformers.
"""

from __future__ import annotations

import math
from typing import Any

from octopipe.errors import InputError
from octopipe.limits import MAX_CONFIG_LAYERS

# rope_type -> keys it requires besides rope_type (transformers 5.24, modeling_rope_utils).
ROPE_TYPES: dict[str, tuple[str, ...]] = {
    "default": (),
    "linear": ("factor",),
    "dynamic": ("factor",),
    "yarn": ("factor",),
    "longrope": ("short_factor", "long_factor"),
    "llama3": ("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"),
    "proportional": (),
}
_FACTORS = ("factor", "low_freq_factor", "high_freq_factor", "attention_factor")
_FACTOR_LISTS = ("short_factor", "long_factor")
_NUMBERS = ("beta_fast", "beta_slow", "mscale", "mscale_all_dim")  # yarn's, any number >= 0
_COUNTS = ("original_max_position_embeddings",)
_ROPE_KEYS = ("rope_scaling", "rope_parameters")
_LAYER_COUNTS = ("num_hidden_layers", "n_layer", "num_global_layers")
_MAX_DIM = 2**31


def check_config_fields(data: Any, where: str) -> None:
    """Refuse, in one line naming `where` and the field, what the module docstring lists; a
    multimodal config's `text_config` is checked as well."""
    if not isinstance(data, dict):
        return  # the reader says "expected a JSON object"
    _check_layer_count(data, where)
    for prefix, fields in (("", data), ("text_config.", data.get("text_config"))):
        if isinstance(fields, dict):
            _check_attention(fields, where, prefix)
            for key in _ROPE_KEYS:
                if fields.get(key) is not None:
                    _check_rope(fields[key], fields, where, prefix + key)


def _check_layer_count(data: dict, where: str) -> None:
    total = 0
    for prefix, fields in (
        ("", data),
        ("text_config.", data.get("text_config")),
        ("vision_config.", data.get("vision_config")),
    ):
        if not isinstance(fields, dict):
            continue
        for key in _LAYER_COUNTS:
            count = fields.get(key)
            if isinstance(count, int) and not isinstance(count, bool) and count > 0:
                total += count
                if total > MAX_CONFIG_LAYERS:
                    raise InputError(
                        where,
                        f"{total:,} layers in all; at most {MAX_CONFIG_LAYERS:,} are estimated "
                        "or built (Llama 3 405B has 126)",
                        prefix + key,
                    )


def _check_attention(f: dict, where: str, prefix: str) -> None:
    hidden_key, heads_key = (
        ("n_embd", "n_head") if "n_embd" in f else ("hidden_size", "num_attention_heads")
    )
    hidden, heads = f.get(hidden_key), f.get(heads_key)
    if not (_is_count(hidden) and _is_count(heads)):
        return  # missing or mistyped: the reader names it
    head_dim = f.get("head_dim")
    if head_dim is not None and not _is_count(head_dim):
        raise InputError(where, f"expected an integer >= 1 (got {head_dim!r})", prefix + "head_dim")
    if head_dim is None and hidden % heads:
        raise InputError(
            where,
            f"{heads:,} heads do not divide {hidden_key} {hidden:,} (a head of "
            f"{hidden / heads:g} dimensions); give head_dim or another head count",
            prefix + heads_key,
        )
    size = head_dim or hidden // heads
    rotary = _rotary_factor(f)
    if not (_is_positive(rotary) and rotary <= 1):
        raise InputError(
            where, f"expected a number in (0, 1] (got {rotary!r})", prefix + "partial_rotary_factor"
        )
    if hidden_key == "hidden_size" and size > 4 and size % 2 and rotary == 1.0:
        raise InputError(
            where,
            f"a head of {size} dimensions: rotary embeddings need an even head size",
            prefix + ("head_dim" if head_dim else heads_key),
        )


def _check_rope(value: Any, fields: dict, where: str, key: str) -> None:
    if not isinstance(value, dict):
        raise InputError(
            where,
            f'expected an object such as {{"rope_type": "linear", "factor": 2.0}} or null '
            f"(got {value!r})",
            key,
        )
    if (
        key.endswith("rope_parameters")
        and value
        and all(isinstance(v, dict) for v in value.values())
    ):
        for layer_type, inner in value.items():  # per layer type (Gemma 3's)
            _check_rope(inner, fields, where, f"{key}.{layer_type}")
        return
    rope_type = value.get("rope_type", value.get("type", "default"))
    if not isinstance(rope_type, str) or rope_type not in ROPE_TYPES:
        raise InputError(
            where,
            f"unknown rope_type {rope_type!r}; transformers knows {', '.join(ROPE_TYPES)}",
            f"{key}.rope_type",
        )
    for needed in ROPE_TYPES[rope_type]:
        if needed not in value and not (needed in _COUNTS and needed in fields):
            raise InputError(where, f"rope_type {rope_type!r} needs {needed}", f"{key}.{needed}")
    for name in _FACTORS:
        if name in value and value[name] is not None and not _is_positive(value[name]):
            raise InputError(
                where, f"expected a positive number (got {value[name]!r})", f"{key}.{name}"
            )
    if rope_type in ("linear", "dynamic", "yarn") and _is_positive(value["factor"]):
        if value["factor"] < 1:
            raise InputError(
                where, f"expected a number >= 1 (got {value['factor']!r})", f"{key}.factor"
            )
    for name in _NUMBERS:
        if name in value and value[name] is not None and not _is_number(value[name]):
            raise InputError(
                where, f"expected a number >= 0 (got {value[name]!r})", f"{key}.{name}"
            )
    if rope_type == "llama3" and value["high_freq_factor"] <= value["low_freq_factor"]:
        raise InputError(  # transformers' own rule (it only warns, then divides by the gap)
            where,
            f"must be above low_freq_factor {value['low_freq_factor']!r} "
            f"(got {value['high_freq_factor']!r})",
            f"{key}.high_freq_factor",
        )
    for name in _COUNTS:
        if name in value and not _is_count(value[name]):
            raise InputError(
                where, f"expected an integer >= 1 (got {value[name]!r})", f"{key}.{name}"
            )
    for name in _FACTOR_LISTS:
        if name in value and not (
            isinstance(value[name], list) and value[name] and all(map(_is_positive, value[name]))
        ):
            raise InputError(where, "expected a list of positive numbers", f"{key}.{name}")
        pairs = _rotary_pairs(fields)
        if name in value and pairs is not None and len(value[name]) != pairs:
            raise InputError(  # else a shape error in transformers' forward (3 against 4)
                where,
                f"expected {pairs} factors, one per rotary frequency (got {len(value[name])})",
                f"{key}.{name}",
            )


def _rotary_pairs(f: dict) -> int | None:
    """The rotary frequencies of a head (half its rotated dimensions), when the config says."""
    hidden, heads, head_dim = f.get("hidden_size"), f.get("num_attention_heads"), f.get("head_dim")
    size = head_dim if _is_count(head_dim) else None
    if size is None and _is_count(hidden) and _is_count(heads) and hidden % heads == 0:
        size = hidden // heads
    rotary = _rotary_factor(f)
    if size is None or not _is_positive(rotary):
        return None
    return int(size * rotary) // 2


def _rotary_factor(f: dict) -> Any:
    """The share of a head that rotates: `partial_rotary_factor`, all of it when absent or null."""
    rotary = f.get("partial_rotary_factor")
    return 1.0 if rotary is None else rotary


def _is_count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= _MAX_DIM


def _is_number(x: Any) -> bool:
    return (
        isinstance(x, int | float)
        and not isinstance(x, bool)
        and math.isfinite(x)
        and 0 <= x <= 1e12
    )


def _is_positive(x: Any) -> bool:
    return (
        isinstance(x, int | float)
        and not isinstance(x, bool)
        and math.isfinite(x)
        and 0 < x <= 1e12
    )
