"""bench_executor.py's last table: one layer's F, B, I and W as our executor runs them, and b, w
as the profiler measures them, timed in turn in one process."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from executor_runs import MODELS

from octopipe.runtime.data.batches import SyntheticData, replica_batch
from octopipe.runtime.measure.profiler import time_layer
from octopipe.runtime.model.load import load_recipe
from octopipe.runtime.model.recipe import ModelRecipe
from octopipe.runtime.step.stage import StageCompute, as_leaves


@dataclass(frozen=True)
class BackwardCosts:
    """Fastest ms of one layer's work on one microbatch, measured in turn in one process."""

    layer: str
    kind: str
    f: float  # our executor's forward (StageCompute)
    full: float  # our executor's full backward (B)
    i: float  # our executor's split backward: I, then W
    w: float
    profiled_b: float  # the profiler's way (octopipe profile): input grads, then weight grads
    profiled_w: float


def backward_costs(recipe: ModelRecipe, index: int, rounds: int = 7) -> BackwardCosts:
    """Time F, B, I and W of layer `index` as the executor runs them, and b, w as the profiler
    measures them, alternating so that machine load hits all alike."""
    size = MODELS[recipe.name]
    data = SyntheticData(recipe.synthetic_sequence, size.seq_len, 0)
    b = size.micro_batch_size
    batch = replica_batch(data.global_batch(0, b), 0, 1, b)
    cpu = torch.device("cpu")
    layer = recipe.stage([recipe.layers[index]], cpu, 0)
    with torch.no_grad():
        x = recipe.stage(recipe.layers[:index], cpu, 0)(*batch.inputs[0])
        y = layer(*x)
    stage = StageCompute(layer, False, recipe.loss, 1.0)
    seeds = [torch.randn_like(t) for t in y if t.is_floating_point()]
    samples = []
    for _ in range(rounds + 1):  # the first round warms up
        t0 = time.perf_counter()
        stage.forward(0, as_leaves(x), None)
        t1 = time.perf_counter()
        stage.backward(0, seeds)
        t2 = time.perf_counter()
        stage.forward(1, as_leaves(x), None)
        t3 = time.perf_counter()
        stage.backward_input(1, seeds)
        t4 = time.perf_counter()
        stage.backward_weight(1)
        t5 = time.perf_counter()
        prof = time_layer(layer, x, None, True, cpu, 0, 1)
        samples.append((t1 - t0, t2 - t1, t4 - t3, t5 - t4, prof.b, prof.w))
    stage.close()
    # Other jobs on the machine only ever add time: the fastest round is the least disturbed.
    f, full, i, w, pb, pw = (min(c) * 1e3 for c in zip(*samples[1:]))
    name, kind = recipe.layers[index], recipe.layer_kind(index)
    return BackwardCosts(name, kind, f, full, i, w, pb, pw)


def backward_table(model_name: str) -> list[str]:
    """One layer of every kind with weights and an input gradient (not the first nor the last)."""
    recipe = load_recipe(model_name)
    seen: set[str] = set()
    lines = [
        f"Backward of one layer of each kind ({model_name}; ms, fastest of 7, one process):",
        "",
        "| layer | kind | F | B (full) | I | W | (I+W) / B | profile b | profile w | (b+w) / B |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for index in range(1, len(recipe.layers) - 1):
        kind = recipe.layer_kind(index)
        if kind in seen or kind in ("norm",):
            continue
        seen.add(kind)
        c = backward_costs(recipe, index)
        lines.append(
            f"| {c.layer} | {c.kind} | {c.f:.2f} | {c.full:.2f} | {c.i:.2f} | {c.w:.2f} | "
            f"{(c.i + c.w) / c.full:.2f} | {c.profiled_b:.2f} | {c.profiled_w:.2f} | "
            f"{(c.profiled_b + c.profiled_w) / c.full:.2f} |"
        )
    return lines
