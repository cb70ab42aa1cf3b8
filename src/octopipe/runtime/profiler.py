"""Measure a real model's per-layer costs on the local device and return a `Profile`.

For each layer, on one microbatch: the forward (F), the backward for the layer's input (I) and
the backward for its weights (W), each the median of `repeats` runs after `warmup` runs; the last
layer's figures include the loss. I and W are timed as the executor runs them (`weightgrad`: I
finds where weight gradients branch off and computes the input gradient; W then computes only
the weight gradients from there), so a profile prices a split backward as it will run.

Memory comes from one more forward and backward: the tensors autograd saves
(`saved_tensors_hooks`), the part of them the weight-gradient nodes read (what W still needs
after I), the parameters with their gradients and Adam state, and the size of the layer's output
tuple (the loss, for the last layer).

This module measures; it does not draw progress bars (the CLI passes a callback) nor pick plans.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from octopipe.models.base import Activation, PipelineModel
from octopipe.profile import LayerCost, Profile
from octopipe.runtime.weightgrad import DeferredWeightGrad, plan_deferral

# Fp32 weights, their gradients, and Adam's two moments: four copies of every parameter.
ADAM_STATE_COPIES = 4

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


def input_grads(roots, seeds, inputs: Activation) -> tuple[torch.Tensor | None, ...]:
    """I: gradients w.r.t. the layer's inputs; the graph stays for W."""
    wanted = [t for t in inputs if t.requires_grad]
    if not wanted or not roots:
        return ()
    return torch.autograd.grad(roots, wanted, seeds, retain_graph=True, allow_unused=True)


def split_input_grads(
    roots, seeds, inputs: Activation, params: Sequence[nn.Parameter]
) -> DeferredWeightGrad | None:
    """I as the executor runs it (`StageCompute.backward_input`): the input gradients, leaving
    what W needs; None where the graph cannot be split so and W must walk it again."""
    if not roots:
        return None
    wanted = [t for t in inputs if t.requires_grad]
    deferred = plan_deferral(roots, seeds, wanted, params)
    if deferred is not None:
        deferred.backward_input(roots, seeds, wanted)
    else:
        input_grads(roots, seeds, inputs)
    return deferred


def weight_grads(roots, seeds, params: Sequence[nn.Parameter]) -> tuple[torch.Tensor | None, ...]:
    """W: gradients w.r.t. the layer's parameters (None for a parameter this input skipped,
    e.g. an expert no token was routed to)."""
    if not params or not roots:
        return ()
    return torch.autograd.grad(roots, list(params), seeds, allow_unused=True)


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
    params = [p for p in layer.parameters() if p.requires_grad]
    gen = torch.Generator().manual_seed(0)
    samples: list[tuple[float, float, float]] = []
    has_input_grad = needs_input_grad and any(t.is_floating_point() for t in x)
    for run in range(warmup + repeats):
        inputs = as_layer_inputs(x, needs_input_grad)
        _synchronize(device)
        t0 = time.perf_counter()
        outputs = run_layer(layer, inputs, loss_fn)
        _synchronize(device)
        t1 = time.perf_counter()
        roots, seeds = backward_seeds(outputs, gen)
        _synchronize(device)
        t2 = time.perf_counter()
        deferred = split_input_grads(roots, seeds, inputs, params)
        _synchronize(device)
        t3 = time.perf_counter()
        if deferred is not None:
            deferred.backward_weight()
        else:
            weight_grads(roots, seeds, params)
        _synchronize(device)
        t4 = time.perf_counter()
        if run >= warmup:
            # A layer fed only data (token ids, pixels) has no input gradient to compute.
            samples.append((t1 - t0, t3 - t2 if has_input_grad else 0.0, t4 - t3))
    f, b, w = (statistics.median(column) for column in zip(*samples))
    return LayerTimes(f, b, w)


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def weight_side_nodes(roots: Sequence[torch.Tensor], params: Sequence[nn.Parameter]) -> set:
    """Autograd nodes whose work belongs to W: those that lead to a parameter's gradient,
    directly or through nodes that lead only to parameters (views, transposes, exp(a_log))."""
    param_ids = {id(p) for p in params}
    only_params: dict = {}

    def leads_only_to_params(node) -> bool:
        if node in only_params:
            return only_params[node]
        if hasattr(node, "variable"):  # AccumulateGrad of a leaf
            result = id(node.variable) in param_ids
        else:
            children = [child for child, _ in node.next_functions if child is not None]
            result = bool(children) and all(leads_only_to_params(c) for c in children)
        only_params[node] = result
        return result

    w_nodes, seen, stack = set(), set(), [t.grad_fn for t in roots if t.grad_fn is not None]
    while stack:
        node = stack.pop()
        if node in seen or hasattr(node, "variable"):
            continue
        seen.add(node)
        children = [child for child, _ in node.next_functions if child is not None]
        if leads_only_to_params(node) or any(leads_only_to_params(c) for c in children):
            w_nodes.add(node)
        stack.extend(children)
    return w_nodes


def measure_memory(
    layer: nn.Module, x: Activation, loss_fn: LossFn | None, needs_input_grad: bool
) -> LayerMemory:
    params = [p for p in layer.parameters() if p.requires_grad]
    param_storages = {_storage_key(p) for p in layer.parameters()}
    saved: dict[int, int] = {}  # storage -> bytes, for every saved non-parameter tensor
    needed_by_w: set[int] = set()
    in_w_node = [False]

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = _storage_key(t)
        if key not in param_storages:
            saved[key] = t.untyped_storage().nbytes()
        return t

    def unpack(t: torch.Tensor) -> torch.Tensor:
        if in_w_node[0]:
            needed_by_w.add(_storage_key(t))
        return t

    inputs = as_layer_inputs(x, needs_input_grad)
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        outputs = run_layer(layer, inputs, loss_fn)
    roots, seeds = backward_seeds(outputs, torch.Generator().manual_seed(0))
    w_nodes = weight_side_nodes(roots, params)
    # Autograd runs one node at a time; a pre-hook marks whose saved tensors are being read.
    handles = []
    for node in _graph_nodes(roots):
        mark = node in w_nodes
        handles.append(node.register_prehook(lambda _, mark=mark: in_w_node.__setitem__(0, mark)))
    try:
        grad_targets = [t for t in inputs if t.requires_grad] + params
        if roots and grad_targets:
            torch.autograd.grad(roots, grad_targets, seeds, allow_unused=True)
    finally:
        for handle in handles:
            handle.remove()
    wact = sum(saved[key] for key in needed_by_w if key in saved)
    return LayerMemory(
        act_bytes=sum(saved.values()),
        wact_bytes=wact,
        param_bytes=param_bytes(layer),
        out_bytes=nbytes(outputs),  # the last layer's output is its loss
    )


def _graph_nodes(roots: Sequence[torch.Tensor]) -> list:
    nodes, seen, stack = [], set(), [t.grad_fn for t in roots if t.grad_fn is not None]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        nodes.append(node)
        stack.extend(child for child, _ in node.next_functions if child is not None)
    return nodes


def profile_model(
    model: PipelineModel,
    *,
    device: str | torch.device = "cpu",
    warmup: int = 2,
    repeats: int = 5,
    seed: int = 0,
    name: str | None = None,
    on_layer: Callable[[int, str], None] | None = None,
) -> Profile:
    """Time and size every layer of `model` on one microbatch (the model's own sequence length
    and microbatch size) on `device`, to which the model is moved. The times are those of a
    device of speed 1.0 in the profile. `on_layer(index, name)` is called after each layer."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats} and {warmup}")
    device = torch.device(device)
    model.to(device)
    batch = model.make_batch(1, seed)
    x = tuple(t.to(device) for t in batch.inputs[0])
    target = batch.targets[0].to(device)
    last = len(model.layer_names) - 1
    costs = []
    for i, layer_name in enumerate(model.layer_names):
        layer = model.layer(i)
        loss_fn = (lambda out: model.loss(out, target)) if i == last else None
        needs_input_grad = i > 0  # the first layer's inputs are data
        times = time_layer(layer, x, loss_fn, needs_input_grad, device, warmup, repeats)
        memory = measure_memory(layer, x, loss_fn, needs_input_grad)
        costs.append(
            LayerCost(
                name=layer_name,
                kind=_kind(model, i),
                f=times.f,
                b=times.b,
                w=times.w,
                act_bytes=memory.act_bytes,
                wact_bytes=memory.wact_bytes,
                param_bytes=memory.param_bytes,
                out_bytes=memory.out_bytes,
            )
        )
        with torch.no_grad():
            x = run_layer(layer, x, None)
        if on_layer is not None:
            on_layer(i, layer_name)
    return Profile(name=name or _default_name(model, device), layers=tuple(costs))


def _kind(model: PipelineModel, index: int) -> str:
    kinds = getattr(model, "layer_kinds", None)
    return kinds[index] if kinds else "layer"


def _default_name(model: PipelineModel, device: torch.device) -> str:
    arch = getattr(model, "arch", None)
    base = arch.name if arch is not None else type(model).__name__
    return f"{base}-{device.type}-measured"
