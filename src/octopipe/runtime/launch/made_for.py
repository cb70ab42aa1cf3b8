"""A plan made for another model, refused before any rank starts: its profile's name naming
another shipped model, and a sequence longer than the model has positions for.

The layer count and the layer names (where the plan lists them) are checked elsewhere
(`step.deps`, `model.split`); two models of one family share both (tiny-gemma's plan has
tiny-llama's seven layers and their names), so the plan's `profile.name` is compared too,
where it names a shipped model: `profile-arch` and `plan --model` name a profile
`<model>-tp<T>-<hardware>`.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from octopipe.errors import InputError

if TYPE_CHECKING:
    from octopipe.plan import Plan
    from octopipe.runtime.model.recipe import ModelRecipe

_PROFILE_NAME = re.compile(r"(?P<model>.+)-tp[0-9]+-(?P<hardware>[A-Za-z0-9_.]+)")


def planned_model(plan: Plan) -> str | None:
    """The shipped model the plan's profile was made for, where its name says so."""
    from octopipe.costmodel.hf_config import shipped_models

    name = (plan.profile or {}).get("name")
    match = _PROFILE_NAME.fullmatch(name) if isinstance(name, str) else None
    if match is None or match["model"] not in shipped_models():
        return None
    return match["model"]


def check_made_for_model(plan: Plan, recipe: ModelRecipe, seq_len: int, where: str) -> None:
    """Refuse, in one line, a plan whose profile names another shipped model than `recipe`'s,
    and a sequence of `seq_len` tokens beyond the model's positions."""
    from octopipe.costmodel.hf_config import shipped_models

    planned = planned_model(plan)
    if planned is not None and recipe.name in shipped_models() and planned != recipe.name:
        raise InputError(
            where,
            f"a plan made for {planned} (its profile {plan.profile['name']!r}), not "
            f"{recipe.name}: plan the model you run",
            "profile.name",
        )
    positions = recipe.max_positions
    if positions is not None and seq_len > positions:
        given = plan.made_for_value("seq_len") == seq_len
        source = " (what the plan was made for)" if given else ""
        raise InputError(
            "--seq-len",
            f"{seq_len:,} tokens{source} are more than {recipe.name}'s {positions:,} positions "
            "(max_position_embeddings); give --seq-len of at most that",
        )
