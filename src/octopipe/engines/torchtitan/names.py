"""The module names torchtitan 0.3's decoder models go by, and a profile's layer names mapped
to them.

torchtitan 0.3's language models (llama3, qwen3, deepseek_v3, ..., all built on
`torchtitan.models.common.decoder.Decoder`) have the top-level modules `tok_embeddings`,
`layers.<i>` (i = 0 .. L-1), `norm` and `lm_head`, and its pipeline split cuts by them. A
profile names its layers as OctoPipe's torchtitan-style models do (`tok_embeddings`, `layers.3`,
`norm`, `output`: torchtitan 0.2's names) or as transformers' causal LMs do
(`model.embed_tokens`, `model.layers.3`, `model.norm`, `lm_head`); both map one to one.

A name with no counterpart (a vision tower, a projector, a module of the user's own) is
refused, and so is a list that is not the whole decoder in order: torchtitan's split sets every
module it is not given to None, so a wrong name trains a model without that module instead of
failing. The written config checks the names once more, against the model torchtitan builds.
"""

from __future__ import annotations

import re

from octopipe.errors import InputError
from octopipe.profile import Profile

DECODER_MODULES = "tok_embeddings, layers.<i>, norm, lm_head"

# Profile name -> torchtitan 0.3 name, for the modules outside the block stack.
_SINGLETONS = {
    "tok_embeddings": "tok_embeddings",
    "model.embed_tokens": "tok_embeddings",
    "norm": "norm",
    "model.norm": "norm",
    "output": "lm_head",
    "lm_head": "lm_head",
}
_BLOCK = re.compile(r"^(?:model\.)?layers\.(\d+)$")


def torchtitan_name(name: str) -> str | None:
    """The torchtitan 0.3 decoder module a profile layer name stands for, or None."""
    if name in _SINGLETONS:
        return _SINGLETONS[name]
    m = _BLOCK.match(name)
    return f"layers.{int(m.group(1))}" if m else None


def decoder_modules(num_blocks: int) -> list[str]:
    """A torchtitan 0.3 decoder's modules in forward order."""
    return ["tok_embeddings", *(f"layers.{i}" for i in range(num_blocks)), "norm", "lm_head"]


def torchtitan_names(profile: Profile, where: str) -> list[str]:
    """The profile's layers as torchtitan 0.3 decoder modules, in order; a layer without a
    counterpart, or a list that is not a whole decoder, is an InputError naming `where` (the
    profile's file or name) and the layer."""
    mapped: list[str] = []
    for i, name in enumerate(profile.layer_names):
        titan = torchtitan_name(name)
        if titan is None:
            raise InputError(
                where,
                f"{name!r} has no module in torchtitan 0.3's decoder models ({DECODER_MODULES})",
                f"layers[{i}].name",
            )
        mapped.append(titan)
    expected = decoder_modules(sum(n.startswith("layers.") for n in mapped))
    for i, (got, want) in enumerate(zip(mapped, expected)):
        if got != want:
            raise InputError(
                where,
                f"torchtitan 0.3's decoder has {want!r} here, the profile "
                f"{profile.layer_names[i]!r} (its modules in order: {DECODER_MODULES})",
                f"layers[{i}].name",
            )
    if len(mapped) > len(expected):
        i = len(expected)
        raise InputError(
            where,
            f"torchtitan 0.3's decoder ends at {expected[-1]!r}; the profile goes on with "
            f"{profile.layer_names[i]!r}",
            f"layers[{i}].name",
        )
    if len(mapped) < len(expected):  # a missing tail: norm, lm_head
        raise InputError(
            where,
            f"the profile ends before torchtitan 0.3's decoder does: it lacks "
            f"{', '.join(expected[len(mapped) :])}",
            "layers",
        )
    return mapped
