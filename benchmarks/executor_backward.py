"""bench_executor.py's last table: one layer's F, B, I and W as our executor runs them, and b, w
as the profiler measures them, timed in turn in one process."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from executor_runs import sized_model

from octopipe.models.base import PipelineModel
from octopipe.runtime.profiler import time_layer
from octopipe.runtime.stage import StageCompute, as_leaves


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


def backward_costs(model: PipelineModel, index: int, rounds: int = 7) -> BackwardCosts:
    """Time F, B, I and W of layer `index` as the executor runs them, and b, w as the profiler
    measures them, alternating so that machine load hits all alike."""
    batch = model.make_batch(1, 0)
    with torch.no_grad():
        x = model.forward_layers(0, index, batch.inputs[0])
        y = model.forward_layers(index, index + 1, x)
    stage = StageCompute(model, index, index + 1, False, 1.0)
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
        prof = time_layer(model.layer(index), x, None, True, torch.device("cpu"), 0, 1)
        samples.append((t1 - t0, t2 - t1, t4 - t3, t5 - t4, prof.b, prof.w))
    stage.close()
    # Other jobs on the machine only ever add time: the fastest round is the least disturbed.
    f, full, i, w, pb, pw = (min(c) * 1e3 for c in zip(*samples[1:]))
    return BackwardCosts(model.layer_names[index], model.layer_kinds[index], f, full, i, w, pb, pw)


def backward_table(model_name: str) -> list[str]:
    """One layer of every kind with weights and an input gradient (not the first nor the last)."""
    model = sized_model(model_name, 0)
    seen: set[str] = set()
    lines = [
        f"Backward of one layer of each kind ({model_name}; ms, fastest of 7, one process):",
        "",
        "| layer | kind | F | B (full) | I | W | (I+W) / B | profile b | profile w | (b+w) / B |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for index in range(1, len(model.layer_names) - 1):
        kind = model.layer_kinds[index]
        if kind in seen or kind in ("norm",):
            continue
        seen.add(kind)
        c = backward_costs(model, index)
        lines.append(
            f"| {c.layer} | {c.kind} | {c.f:.2f} | {c.full:.2f} | {c.i:.2f} | {c.w:.2f} | "
            f"{(c.i + c.w) / c.full:.2f} | {c.profiled_b:.2f} | {c.profiled_w:.2f} | "
            f"{(c.profiled_b + c.profiled_w) / c.full:.2f} |"
        )
    return lines
