"""Measure a real model's per-layer costs on the local device and return a `Profile`.

For each layer, on one microbatch: the forward (F), the backward for the layer's input (I) and
the backward for its weights (W), each the median of `repeats` runs after `warmup` runs, a run
being the mean over a few microbatches timed back to back (F of each, then I, then W); the last
layer's figures include the loss. I and W are timed as the executor runs them (`weightgrad`: I
is the whole backward but for the linear and embedding weights, W their matmuls), so a profile
prices a split backward as it will run; a layer fed only data (the embedding) still has an I,
the gradients of its weights that W does not take.

Memory comes from one more forward and I: the tensors autograd saves (`saved_tensors_hooks`),
what I leaves for W (the deferred layers' inputs and output gradients), the parameters with
their gradients and Adam state, and the size of the layer's output tuple (the loss, for the last
layer).

This module measures; it does not draw progress bars (the CLI passes a callback) nor pick plans.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from octopipe.profile import LayerCost, Profile
from octopipe.runtime.data.batches import SyntheticData, replica_batch
from octopipe.runtime.model.recipe import (
    DEFAULT_MICRO_BATCH_SIZE,
    DEFAULT_SEQ_LEN,
    Activation,
    ModelRecipe,
)
from octopipe.runtime.model.weightgrad import WeightGradTape, backward_input

# Fp32 weights, their gradients, and Adam's two moments: four copies of every parameter.
ADAM_STATE_COPIES = 4
# Microbatches timed back to back in each repeat: enough for a GPU's launch queue to fill.
BACK_TO_BACK = 4

LossFn = Callable[[Activation], torch.Tensor]


@dataclass(frozen=True)
class LayerTimes:
    """Median seconds of one layer's forward, input-gradient and weight-gradient work."""

    f: float
    b: float
    w: float


@dataclass(frozen=True)
class LayerMemory:
    act_bytes: int
    wact_bytes: int
    param_bytes: int
    out_bytes: int
    wgrad_bytes: int = 0


def nbytes(tensors: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def param_bytes(layer: nn.Module) -> int:
    return ADAM_STATE_COPIES * nbytes([p for p in layer.parameters() if p.requires_grad])


def as_layer_inputs(x: Activation, needs_grad: bool) -> Activation:
    """A layer's inputs cut from the previous graph; float streams become gradient leaves."""
    return tuple(t.detach().requires_grad_(needs_grad and t.is_floating_point()) for t in x)


def run_layer(layer: nn.Module, inputs: Activation, loss_fn: LossFn | None) -> Activation:
    out = layer(*inputs)
    out = out if isinstance(out, tuple) else (out,)
    return (loss_fn(out),) if loss_fn is not None else out


def backward_seeds(outputs: Activation, gen: torch.Generator) -> tuple[list, list]:
    """The outputs that carry gradient, and fixed random gradients for them (1 for a loss)."""
    roots = [t for t in outputs if t.requires_grad]
    seeds = [
        torch.ones_like(t) if t.dim() == 0 else torch.randn(t.shape, generator=gen).to(t)
        for t in roots
    ]
    return roots, seeds


def time_split_backward(
    tape: WeightGradTape,
    layer: nn.Module,
    microbatches: Sequence[Activation],
    loss_fn: LossFn | None,
    gen: torch.Generator,
    clock: Callable[[], float],
) -> tuple[float, float, float]:
    """Mean F, I and W of one layer, run as the executor runs them, phase by phase over the
    microbatches back to back: `clock` synchronizes the device only around each phase, so on a
    GPU the launch of one op overlaps the work of the one before, as in a run, instead of
    every op paying a launch and a synchronization."""
    forwards = []
    t0 = clock()
    for inputs in microbatches:
        with tape.recording() as calls:
            forwards.append((inputs, run_layer(layer, inputs, loss_fn), calls))
    t1 = clock()
    params = [p for p in layer.parameters() if p.requires_grad and not tape.defers(p)]
    backwards = []
    for inputs, outputs, calls in forwards:
        roots, seeds = backward_seeds(outputs, gen)
        backwards.append((roots, seeds, [t for t in inputs if t.requires_grad], calls))
    t2 = clock()
    pending = [backward_input(r, s, wanted, calls, params)[1] for r, s, wanted, calls in backwards]
    t3 = clock()
    for w in pending:
        w.run()
    t4 = clock()
    n = len(microbatches)
    return (t1 - t0) / n, (t3 - t2) / n, (t4 - t3) / n


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_layer(
    layer: nn.Module,
    x: Activation,
    loss_fn: LossFn | None,
    needs_input_grad: bool,
    device: torch.device,
    warmup: int,
    repeats: int,
) -> LayerTimes:
    gen = torch.Generator().manual_seed(0)

    def clock() -> float:
        _synchronize(device)
        return time.perf_counter()

    tape = WeightGradTape([layer])
    try:
        samples = [
            time_split_backward(
                tape,
                layer,
                [as_layer_inputs(x, needs_input_grad) for _ in range(BACK_TO_BACK)],
                loss_fn,
                gen,
                clock,
            )
            for _ in range(warmup + repeats)
        ][warmup:]
    finally:
        tape.remove()
    layer.zero_grad(set_to_none=True)
    f, b, w = (statistics.median(column) for column in zip(*samples))
    return LayerTimes(f, b, w)


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def measure_memory(
    layer: nn.Module, x: Activation, loss_fn: LossFn | None, needs_input_grad: bool
) -> LayerMemory:
    param_storages = {_storage_key(p) for p in layer.parameters()}
    saved: dict[int, int] = {}  # storage -> bytes, for every saved non-parameter tensor

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = _storage_key(t)
        if key not in param_storages:
            saved[key] = t.untyped_storage().nbytes()
        return t

    inputs = as_layer_inputs(x, needs_input_grad)
    tape = WeightGradTape([layer])
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            with tape.recording() as calls:
                outputs = run_layer(layer, inputs, loss_fn)
        roots, seeds = backward_seeds(outputs, torch.Generator().manual_seed(0))
        wanted = [t for t in inputs if t.requires_grad]
        params = [p for p in layer.parameters() if p.requires_grad and not tape.defers(p)]
        _, pending = backward_input(roots, seeds, wanted, calls, params)
    finally:
        tape.remove()
    # What I leaves for W: the deferred layers' inputs (saved from F) and output gradients.
    held = {_storage_key(t): t.untyped_storage().nbytes() for t in pending.held}
    act = sum(saved.values())
    kept_inputs = sum(n for key, n in held.items() if key in saved)
    layer.zero_grad(set_to_none=True)
    return LayerMemory(
        act_bytes=act,
        wact_bytes=min(kept_inputs, act),
        param_bytes=param_bytes(layer),
        out_bytes=nbytes(outputs),  # the last layer's output is its loss
        wgrad_bytes=sum(held.values()) - kept_inputs,
    )


def profile_model(
    recipe: ModelRecipe,
    *,
    device: str | torch.device = "cpu",
    warmup: int = 2,
    repeats: int = 5,
    seed: int = 0,
    seq_len: int = DEFAULT_SEQ_LEN,
    micro_batch_size: int = DEFAULT_MICRO_BATCH_SIZE,
    name: str | None = None,
    on_layer: Callable[[int, str], None] | None = None,
) -> Profile:
    """Time and size every layer of the model on one microbatch of its synthetic data on
    `device`, building one layer at a time (a layer is the stage of that layer alone, so it runs
    as the executor runs it). The times are those of a device of speed 1.0 in the profile.
    `on_layer(index, name)` is called after each layer."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats} and {warmup}")
    device = torch.device(device)
    data = SyntheticData(recipe.synthetic_sequence, seq_len, seed)
    batch = replica_batch(data.global_batch(0, micro_batch_size), 0, 1, micro_batch_size)
    x = tuple(t.to(device) for t in batch.inputs[0])
    target = batch.targets[0].to(device)
    last = len(recipe.layers) - 1
    costs = []
    for i, layer_name in enumerate(recipe.layers):
        layer = recipe.stage([layer_name], device, seed)
        loss_fn = (lambda out: recipe.loss(out, target)) if i == last else None
        needs_input_grad = i > 0  # the first layer's inputs are data
        times = time_layer(layer, x, loss_fn, needs_input_grad, device, warmup, repeats)
        memory = measure_memory(layer, x, loss_fn, needs_input_grad)
        costs.append(
            LayerCost(
                name=layer_name,
                kind=recipe.layer_kind(i),
                f=times.f,
                b=times.b,
                w=times.w,
                act_bytes=memory.act_bytes,
                wact_bytes=memory.wact_bytes,
                wgrad_bytes=memory.wgrad_bytes,
                param_bytes=memory.param_bytes,
                out_bytes=memory.out_bytes,
            )
        )
        with torch.no_grad():
            x = run_layer(layer, x, None)
        del layer  # one layer's weights at a time
        if on_layer is not None:
            on_layer(i, layer_name)
    return Profile(
        name=name or f"{recipe.name}-{device.type}-measured",
        layers=tuple(costs),
        microbatch_size=micro_batch_size,
        seq_len=seq_len,
    )


def median_profile(profiles: Sequence[Profile]) -> Profile:
    """One profile from several ranks' measurements of the same model: each layer's f, b and w
    the median over the ranks (memory is the same on every rank)."""
    first = profiles[0]
    layers = tuple(
        layer.model_copy(
            update={k: statistics.median(getattr(p.layers[i], k) for p in profiles) for k in "fbw"}
        )
        for i, layer in enumerate(first.layers)
    )
    return first.model_copy(update={"layers": layers})
