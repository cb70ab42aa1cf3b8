"""Shared pieces of the executor tests: a small toy PipelineModel and hand-written plan builders.

The toy model exercises what real models do at stage boundaries: activation tuples with two
floating-point streams and an integer tensor riding along, a layer without weights, and a loss.
The builders write the classic orders (GPipe, 1F1B) and a greedy list scheduler that turns any
placement into a valid order, with full or split backward.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable, Sequence

import torch
from torch import nn

from octopipe.actions import Action, B, F, I, W
from octopipe.models.base import PipelineModel
from octopipe.plan import JobShape, Plan, dependencies, make_plan
from octopipe.runtime.data.batches import SyntheticData, replica_batch
from octopipe.runtime.model.load import load_recipe

# `run`'s optimizer before the job config's defaults became AdamW with warm-up and cosine: what
# the tests comparing a run of defaults with `RunConfig`'s own default (plain SGD at 0.01, no
# schedule) pass explicitly.
SGD_FLAGS = ("--optimizer", "sgd", "--lr", "0.01", "--lr-warmup", "0", "--lr-decay", "constant")
SGD_KEYWORDS = {"optimizer": "sgd", "lr": 0.01, "warmup_steps": 0, "decay": "constant"}

TOY = "executor_helpers:toy_model"
TOY_LAYERS = 8
WIDTH = 6
MB_ROWS = 3
DEGREES = ("tp", "dp", "cp", "ep", "zero")
# The flat keywords tests write, by the RunConfig group that holds each (and its name there).
GROUPED = {
    "checkpoint": {
        "checkpoint_dir": "dir",
        "checkpoint_every": "every",
        "keep_last": "keep_last",
        "resume": "resume",
        "resume_required": "required",
    },
    "evaluation": {"val_data": "data", "eval_every": "every", "eval_batches": "batches"},
    "stepping": {
        "lookahead": "lookahead",
        "reduce_at_end": "reduce_at_end",
        "autocast": "autocast",
        "overlap_steps": "overlap_steps",
        "accumulation": "accumulation",
    },
}


def shape_of(options: dict, microbatch_size: int) -> JobShape:
    """A run's shape from a test's degree keywords (popped from `options`: tp, dp, cp, ep,
    zero), microbatches of `microbatch_size`; its PP and microbatch count are the plan's (the
    runtime `Job` sets them)."""
    degrees = {k: options.pop(k, 0 if k == "zero" else 1) for k in DEGREES}
    return JobShape(pp=1, microbatch_size=microbatch_size, **degrees)


def run_config(model, microbatch_size: int = 2, **options):
    """A RunConfig from the flat keywords tests write: the degrees into its shape (microbatches
    of `microbatch_size`), the checkpoint's, the evaluation's and the steps' settings into
    their groups, the rest as they are."""
    from octopipe.runtime.job.run_config import Checkpointing, Evaluating, RunConfig, Stepping

    shape = shape_of(options, microbatch_size)
    groups = {}
    for group, cls in (
        ("checkpoint", Checkpointing),
        ("evaluation", Evaluating),
        ("stepping", Stepping),
    ):
        given = {
            name: options.pop(flat) for flat, name in GROUPED[group].items() if flat in options
        }
        if given:
            groups[group] = cls(**given)
    return RunConfig(model, shape=shape, **groups, **options)


class _Embed(nn.Module):
    """x -> (h, skip, ids): starts the two float streams and the integer one."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = torch.tanh(self.proj(x))
        return h, x * 0.5, ids


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mix = nn.Linear(WIDTH, WIDTH)
        self.gate = nn.Parameter(torch.empty(WIDTH))
        self.reset_parameters()

    def reset_parameters(self) -> None:  # its own tensor; `mix` resets itself
        nn.init.uniform_(self.gate, 0.5, 1.5)

    def forward(
        self, h: torch.Tensor, skip: torch.Tensor, ids: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        scale = (ids.float() + 1).unsqueeze(-1) / MB_ROWS  # integer stream steers the math
        return torch.tanh(self.mix(h) * self.gate + skip * scale), skip, ids


class _Swap(nn.Module):
    """No weights: exchanges the streams, so gradients must flow through both of them."""

    def forward(
        self, h: torch.Tensor, skip: torch.Tensor, ids: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        return skip * 1.5, h, ids


class _Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.out = nn.Linear(2 * WIDTH, 2)

    def forward(self, h: torch.Tensor, skip: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return self.out(torch.cat([h, skip], dim=-1))


class ToyModel(PipelineModel):
    def __init__(self) -> None:
        super().__init__()
        self.add_layer("embed", _Embed())
        for i in range(TOY_LAYERS - 2):
            self.add_layer(f"layers.{i}", _Swap() if i == 2 else _Block())
        self.add_layer("head", _Head())

    def loss(self, output, target):
        return nn.functional.mse_loss(output[0], target)

    def synthetic_sequence(self, gen: torch.Generator, _seq_len: int):
        """One row: features and an id in, two numbers out (a function of the features, so
        the model can learn it)."""
        x = torch.randn(WIDTH, generator=gen)
        ids = torch.randint(0, MB_ROWS, (), generator=gen)
        return (x, ids), torch.stack([x[: WIDTH // 2].mean(), x[WIDTH // 2 :].mean()])


def toy_model() -> ToyModel:
    return ToyModel()


class _Boom(nn.Module):
    def forward(self, h, skip, ids):
        if torch.is_grad_enabled():  # shape discovery runs without grad; training does not
            raise RuntimeError("boom: injected failure in layers.3")
        return h, skip, ids


def failing_model() -> ToyModel:
    model = toy_model()
    model.layers.add_module("3", _Boom())  # replaces the block in place: same FQN, same order
    return model


# --- plan builders ------------------------------------------------------------------------


def layer_count(model: str) -> int:
    return len(load_recipe(model).layers)


def even_ranges(num_layers: int, num_stages: int) -> list[tuple[int, int]]:
    cuts = [round(i * num_layers / num_stages) for i in range(num_stages + 1)]
    return list(itertools.pairwise(cuts))


def gpipe(num_devices: int, num_mb: int, num_layers: int = TOY_LAYERS) -> Plan:
    orders = {
        d: [Action(d, F, m) for m in range(num_mb)]
        + [Action(d, B, m) for m in reversed(range(num_mb))]
        for d in range(num_devices)
    }
    return make_plan(
        num_devices, num_mb, even_ranges(num_layers, num_devices), range(num_devices), orders
    )


def one_f_one_b(num_devices: int, num_mb: int, num_layers: int = TOY_LAYERS) -> Plan:
    orders = {}
    for d in range(num_devices):
        warmup = min(num_devices - d - 1, num_mb)
        order = [Action(d, F, m) for m in range(warmup)]
        for m in range(warmup, num_mb):
            order += [Action(d, F, m), Action(d, B, m - warmup)]
        order += [Action(d, B, m) for m in range(num_mb - warmup, num_mb)]
        orders[d] = order
    return make_plan(
        num_devices, num_mb, even_ranges(num_layers, num_devices), range(num_devices), orders
    )


def greedy(
    placement: Sequence[int],
    num_mb: int,
    num_devices: int,
    backward: Callable[[int, int], str] = lambda s, m: B,
    prefer_backward: bool = True,
    num_layers: int = TOY_LAYERS,
    rng: random.Random | None = None,
) -> Plan:
    """List-schedule every action in unit time steps; each device picks among its ready actions.

    `backward(stage, mb)` says `B` or `I` (split: I then W). Backward-first gives 1F1B-like
    orders, forward-first GPipe-like ones; with `rng` the pick is random (irregular orders).
    """
    num_stages = len(placement)
    todo = []
    for s in range(num_stages):
        for m in range(num_mb):
            todo.append(Action(s, F, m))
            todo += [Action(s, I, m), Action(s, W, m)] if backward(s, m) == I else [Action(s, B, m)]
    ranges = even_ranges(num_layers, num_stages)
    skeleton = make_plan(
        num_devices, num_mb, ranges, placement, {d: [] for d in range(num_devices)}
    )
    split = frozenset((a.stage, a.mb) for a in todo if a.kind == I)
    done: set[Action] = set()
    orders: dict[int, list[Action]] = {d: [] for d in range(num_devices)}
    rank = {F: 1, B: 0, I: 0, W: 2} if prefer_backward else {F: 0, B: 1, I: 1, W: 2}
    while todo:
        ready = [a for a in todo if all(d in done for d in dependencies(skeleton, a, split))]
        assert ready, "the builder itself deadlocked"
        chosen = []
        for dev in range(num_devices):
            mine = [a for a in ready if placement[a.stage] == dev]
            if mine:
                pick = (
                    rng.choice(mine)
                    if rng
                    else min(mine, key=lambda a: (rank[a.kind], a.mb, -a.stage))
                )
                chosen.append(pick)
                orders[dev].append(pick)
        done.update(chosen)
        todo = [a for a in todo if a not in done]
    return make_plan(num_devices, num_mb, ranges, placement, orders)


def recomputing_job(
    model: str,
    placement: Sequence[int],
    kinds: Sequence[str],
    backward: Callable[[int, int], str],
    microbatches: int = 4,
    steps: int = 2,
    **options,
):
    """A training job of `greedy`'s plan whose stages recompute `kinds`, with SGD and state
    collected, to compare with `train_reference`."""
    from dataclasses import replace

    from octopipe.runtime.job.run_config import Job
    from octopipe.runtime.step.optim import OptimizerConfig

    plan = greedy(
        list(placement), microbatches, 2, backward=backward, num_layers=layer_count(model)
    )
    config = run_config(
        model,
        2,
        steps=steps,
        optimizer=OptimizerConfig("sgd", lr=0.05, momentum=0.9),
        collect_state=True,
        seq_len=8,
        **options,
    )
    return Job(replace(plan, recompute=tuple(kinds)), config)


# --- stages in one process ----------------------------------------------------------------


def batch_of(recipe, num_mb: int, seed: int, step: int = 0, rows: int = MB_ROWS):
    """One replica's step of `recipe`'s synthetic data: `num_mb` microbatches of `rows`."""
    data = SyntheticData(recipe.synthetic_sequence, 16, seed)
    return replica_batch(data.global_batch(step, num_mb * rows), 0, num_mb, rows)


def stage_of(recipe, start: int, end: int, seed: int):
    """Layers [start, end) of the recipe's model, built as a rank builds them."""
    return recipe.stage(recipe.layers[start:end], torch.device("cpu"), seed)


# --- models that take their time ------------------------------------------------------------

NAP_S = 0.2  # per training forward of sleepy_model's layers.1 (stage 0 of a two-stage split)
STALL_S = 10.0  # stalling_model's one stall, far longer than the timeouts its tests give


class _Nap(nn.Module):
    """Sleeps in every training forward (shape discovery runs without grad and does not)."""

    def __init__(self, seconds: float, once: bool = False) -> None:
        super().__init__()
        self.seconds, self.once = seconds, once

    def forward(self, h, skip, ids):
        if torch.is_grad_enabled() and self.seconds:
            time.sleep(self.seconds)
            if self.once:
                self.seconds = 0.0
        return h, skip, ids


def sleepy_model() -> ToyModel:
    """A healthy run that takes wall-clock time without keeping the cores busy."""
    model = toy_model()
    model.layers.add_module("1", _Nap(NAP_S))
    return model


def stalling_model() -> ToyModel:
    """layers.4 (stage 1 of a two-stage split) stalls once, in its first training forward:
    its peer's wait for it outlasts any short timeout."""
    model = toy_model()
    model.layers.add_module("4", _Nap(STALL_S, once=True))
    return model


# --- jobs that collect state, for the parallel dimensions' equivalence tests ---------------

PARALLEL_STEPS, PARALLEL_SEQ, PARALLEL_MBS = 2, 8, 2


def mixed_backward(stage: int, mb: int) -> str:
    """Split backward (I, W) for odd stage + microbatch, full (B) for even."""
    return I if (stage + mb) % 2 else B


def parallel_job(model: str, plan, **options):
    """A job of `plan` that collects every weight and gradient, with clipped SGD momentum (the
    clipping acts on these steps), 8-token sequences in microbatches of 2; `options`: the
    degrees (tp, dp, cp, ep) and any other `RunConfig` field."""
    from octopipe.runtime.job.run_config import Job
    from octopipe.runtime.step.optim import OptimizerConfig

    config = run_config(
        model,
        PARALLEL_MBS,
        steps=options.pop("steps", PARALLEL_STEPS),
        optimizer=OptimizerConfig("sgd", lr=0.05, momentum=0.9, clip_norm=0.5),
        collect_state=True,
        seq_len=PARALLEL_SEQ,
        **options,
    )
    return Job(plan, config)


def two_devices(model: str) -> Plan:
    """Two stages on two devices, two microbatches, split and full backward mixed."""
    return greedy([0, 1], 2, 2, backward=mixed_backward, num_layers=layer_count(model))
