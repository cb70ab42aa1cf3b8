"""Our own models (`octopipe.models.ArchModel`) as recipes: a shipped config's name, a
config.json, or an `Architecture`; and the whole model built as every rank builds its share.

`octopipe.models` holds the torch modules and knows nothing of the executor; this is the side
that knows both.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from octopipe.errors import InputError
from octopipe.runtime.model.recipe import ModelRecipe, from_module


def bundled_recipe(name: str) -> ModelRecipe:
    """A shipped config's name or a config.json path: our model of that architecture."""
    from octopipe.costmodel.hf_config import load_architecture, shipped_models
    from octopipe.models import bundled_models

    if name not in shipped_models() and not Path(name).is_file():
        raise InputError(
            "--model",
            f"unknown model {name!r}; bundled: {', '.join(sorted(bundled_models()))} (or a "
            "shipped config's name, a config.json, hf:PATH, module:factory)",
        )
    return arch_recipe(load_architecture(name))


def arch_recipe(arch) -> ModelRecipe:
    """The recipe of our own model of an architecture config (`octopipe.models.ArchModel`)."""
    from octopipe.models import ArchModel

    recipe = from_module(arch.name, lambda: ArchModel(arch))
    recipe.plans_by("bundled_plan")
    recipe.max_positions = arch.learned_positions or arch.max_position_embeddings
    return recipe


def build_model(name_or_config, seed: int = 0) -> nn.Module:
    """The whole model of a shipped config name, a config.json path, or an Architecture, on the
    CPU, initialized as every pipeline rank initializes its share (per module FQN and seed)."""
    from octopipe.costmodel.arch import Architecture
    from octopipe.costmodel.hf_config import load_architecture

    arch = (
        name_or_config
        if isinstance(name_or_config, Architecture)
        else load_architecture(name_or_config)
    )
    return arch_recipe(arch).whole(torch.device("cpu"), seed).part
