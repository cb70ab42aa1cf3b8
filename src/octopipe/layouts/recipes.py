"""Published layouts of the shipped models: the `recipe` row every cluster answer is set beside.

A recipe is the layout a framework or a paper publishes for a model at one GPU count
(docs/LAYOUTS.md cites each). It is the recipe of any model of that architecture, named or not:
a config.json of Llama 3 8B takes llama3-8b's (`recipe_model`: the family, layers, hidden size,
attention and KV heads, feed-forward width, experts and vocabulary alike; the model's name does
not count). For a job on another count, the recipe at the nearest count (then
the nearest sequence length) is taken as a team would scale it: its TP, CP, PP, EP, chunks and
microbatch size kept, DP the GPUs left, the microbatches the job's global batch. It is planned
as its framework runs it: its schedule over the uniform partition, the distributed optimizer
(ZeRO-1), no recomputation unless the recipe turns it on. Nothing here searches.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from octopipe.costmodel.arch import Architecture
from octopipe.errors import InputError
from octopipe.layouts.layout import Job
from octopipe.plan.shape import JobShape

RECIPE_LABEL = "recipe"


@dataclass(frozen=True)
class Recipe:
    model: str  # the shipped model's name
    source: str  # where it is published (docs/LAYOUTS.md, "Published recipes")
    gpus: int
    seq_len: int
    tp: int
    pp: int
    cp: int = 1
    ep: int = 1
    chunks: int = 1  # virtual pipeline stages per device (interleaved 1F1B when more than 1)
    microbatch_size: int = 1
    schedule: str = ""  # "" : interleaved 1F1B with chunks, else 1F1B
    # How its framework numbers ranks: NeMo's Megatron-Core PP outermost; None: unstated (the
    # job's default order).
    rank_order: str | None = "megatron"

    @property
    def plan_schedule(self) -> tuple[str, int | None]:
        if self.schedule:
            return self.schedule, None
        return ("i1f1b", self.chunks) if self.chunks > 1 else ("1f1b", None)

    def describe(self) -> str:
        return f"{self.source}, {self.gpus:,} GPUs at {self.seq_len // 1024}K"


RECIPES = (
    Recipe("llama3-8b", "NeMo llama3_8b", 8, 8192, tp=1, pp=1, cp=2),
    Recipe("llama3-70b", "NeMo llama3_70b", 32, 8192, tp=4, pp=4, cp=2, chunks=5),
    Recipe("llama3-405b", "NeMo llama31_405b", 576, 8192, tp=8, pp=9, cp=4, chunks=2),
    # Llama 3's Table 4 (Dubey et al. 2024); the schedule's depth is not stated: 2 chunks.
    # Its ranks ordered [TP, CP, PP, DP] (section 3.3.2, "network-aware parallelism"): OctoPipe's.
    Recipe(
        "llama3-405b", "Llama 3 paper", 8192, 8192, tp=8, pp=16, chunks=2, rank_order="octopipe"
    ),
    Recipe(
        "llama3-405b", "Llama 3 paper", 16384, 8192, tp=8, pp=16, chunks=2, rank_order="octopipe"
    ),
    Recipe(
        "llama3-405b",
        "Llama 3 paper",
        16384,
        131072,
        tp=8,
        pp=16,
        cp=16,
        chunks=2,
        rank_order="octopipe",
    ),  # fmt: skip
    Recipe("mixtral-8x7b", "NeMo mixtral_8x7b", 64, 4096, tp=1, pp=4, ep=8, chunks=8),
    # DeepSeek-V3's report (DeepSeek-AI 2024, section 3.2): PP 16, EP 64, ZeRO-1, DualPipe
    # (DualPipeV is its V-shaped form here), no TP.
    Recipe(
        "deepseek-v3",
        "DeepSeek-V3 report",
        2048,
        4096,
        tp=1,
        pp=16,
        ep=64,
        schedule="dualpipev",
        rank_order=None,
    ),  # fmt: skip
)


def architecture_key(arch: Architecture) -> tuple:
    """What makes two configs the same model for its recipes: the family and the shapes that
    set its costs (not its name, positions or rotary settings)."""
    moe = arch.moe
    return (
        arch.family,
        arch.num_layers,
        arch.hidden_size,
        arch.attention.num_heads,
        arch.attention.num_kv_heads,
        arch.intermediate_size,
        None if moe is None else (moe.num_experts, moe.top_k, moe.expert_intermediate_size),
        arch.vocab_size,
    )


@functools.cache
def _shipped_key(name: str) -> tuple:
    from octopipe.costmodel import load_architecture

    return architecture_key(load_architecture(name))


def recipe_model(config: str) -> str | None:
    """The shipped model whose recipes a job's model (`Job.config`: a shipped name or a
    config.json) takes: itself where it has recipes, else the one of its architecture
    (`architecture_key`); None where no recipe's model has it, or the config does not load."""
    models = dict.fromkeys(r.model for r in RECIPES)
    if config in models:
        return config
    from octopipe.costmodel import load_architecture

    try:
        key = architecture_key(load_architecture(config))
    except InputError:
        return None
    return next((m for m in models if _shipped_key(m) == key), None)


def nearest_recipe(job: Job) -> Recipe | None:
    """The recipe of the job's model (by name, else by architecture: `recipe_model`) at the
    GPU count nearest the job's (by ratio), then the sequence length nearest its; None for
    models without one."""
    model = recipe_model(job.config)
    mine = [r for r in RECIPES if r.model == model]
    if not mine:
        return None
    n = job.cluster.size
    return min(
        mine,
        key=lambda r: (abs(math.log(r.gpus / n)), abs(math.log(r.seq_len / job.seq_len))),
    )


def recipe_layout(job: Job, recipe: Recipe) -> JobShape | None:
    """The recipe's layout on the job's GPUs and batch: its degrees kept, DP the GPUs left
    (None where they do not divide the GPUs, the global batch, or the sequence)."""
    n, per_group = job.cluster.size, recipe.tp * recipe.cp * recipe.pp
    if n % per_group or recipe.tp > min(job.cluster.gpus_per_node, n):
        return None
    dp = n // per_group
    samples = dp * recipe.microbatch_size
    if job.global_batch % samples or job.seq_len % recipe.cp:
        return None
    if (dp * recipe.cp) % recipe.ep:
        return None
    return JobShape(
        recipe.tp,
        recipe.pp,
        dp,
        recipe.microbatch_size,
        job.global_batch // samples,
        zero=int(dp * recipe.cp > 1),
        cp=recipe.cp,
        ep=recipe.ep,
        rank_order=recipe.rank_order or job.rank_order,
    )
