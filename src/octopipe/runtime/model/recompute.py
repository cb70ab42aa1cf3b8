"""Recomputation per stage (a plan's `recompute`, docs/FORMATS.md): what a stage keeps from F
and redoes at the start of its backward.

- `full`: every block of the stage (the cost model's recomputed kinds; every layer of a model
  that names no kinds) runs under torch's non-reentrant activation checkpoint: F keeps only
  the block's inputs, the backward (I or B) first redoes its forward. Under a split backward,
  that redone forward is also where W's inputs come from (`weightgrad.WeightGradTape`).
- `selective`: only the attention cores are checkpointed (Korthikanti et al. 2022): the
  `AttentionCore` modules of OctoPipe's bundled models, and, in an `hf:` model, the attention
  function each transformers attention module calls (`runtime.model.hf_attention`: its projections
  run once). A stage with neither (a `module:factory` model's) cannot recompute selectively.

The checkpoint is torch's composable one (`torch.distributed._composable.checkpoint`): forward
hooks on the module, so its FQNs, and with them checkpoints, tensor-parallel plans and FSDP2,
are as without it. The losses and gradients are those of no recomputation (tests compare them).
This module does not decide what to recompute: the plan does.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn
from torch.distributed._composable import checkpoint

from octopipe.costmodel.build import RECOMPUTED_KINDS
from octopipe.errors import InputError
from octopipe.models.attention import AttentionCore
from octopipe.plan import Plan
from octopipe.runtime.model.hf_attention import recompute_core, routed_attention
from octopipe.runtime.model.recipe import ModelRecipe, StageModule

UNNAMED_KIND = "layer"  # a model's layer whose kind it does not say: a block, to recompute


def recomputed_modules(
    part: nn.Module, layers: Sequence[str], kinds: Sequence[str], kind: str
) -> list[nn.Module]:
    """The modules of a stage (its `layers`, of `kinds`) that `kind` recomputes: blocks, or
    attention modules whose core it recomputes."""
    if kind == "full":
        return [
            part.get_submodule(name)
            for name, k in zip(layers, kinds, strict=True)
            if k in RECOMPUTED_KINDS or k == UNNAMED_KIND
        ]
    if kind == "selective":
        return [
            m
            for name in layers
            for m in part.get_submodule(name).modules()
            if isinstance(m, AttentionCore) or routed_attention(m)
        ]
    return []


def apply_recompute(stage: StageModule, layers: Sequence[str], kinds: Sequence[str], kind: str):
    """Checkpoint what `kind` recomputes in `stage` (whose `part` holds `layers`); the stage
    remembers the modules whose whole forward is redone (`StageModule.recomputed`), which its
    split backward needs."""
    redone = []
    for module in recomputed_modules(stage.part, layers, kinds, kind):
        if routed_attention(module):  # its core alone, inside; its projections run once
            recompute_core(module)
            continue
        # early_stop=False: the whole forward is redone, so every deferred layer's input is
        # recorded again for W (an early stop ends the forward at its last saved tensor).
        checkpoint(module, early_stop=False)
        redone.append(module)
    stage.recomputed = tuple(redone)


def stage_layers(plan: Plan, recipe: ModelRecipe, stage: int) -> tuple[list[str], list[str]]:
    """The layer FQNs of a stage and their kinds."""
    st = plan.stages[stage]
    indices = range(st.start, st.end)
    return [recipe.layers[i] for i in indices], [recipe.layer_kind(i) for i in indices]


def check_recomputable(plan: Plan, recipe: ModelRecipe, where: str) -> None:
    """Before any rank starts: every stage that recomputes has something the executor can
    checkpoint so (a selective stage, an attention core of OctoPipe's or a transformers model)."""
    for s in range(plan.num_stages):
        kind = plan.recompute_of(s)
        if kind == "none":
            continue
        layers, kinds = stage_layers(plan, recipe, s)
        if not recomputed_modules(recipe.meta_model, layers, kinds, kind):
            what = (
                "attention core to recompute alone (OctoPipe's bundled models and hf: models have "
                "them; use full)"
                if kind == "selective"
                else "block to recompute"
            )
            raise InputError(
                where,
                f"{recipe.name}'s layers {layers[0]} to {layers[-1]} hold no {what}",
                f"stages[{s}].recompute",
            )
