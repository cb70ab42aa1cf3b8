"""Split backward the zero-bubble way: I does all of a backward but the weight gradients of
linear and embedding layers; W computes those later as plain matmuls and index-adds.

The weight gradient of `y = x @ A^T + b` is `dy^T @ x`: it needs the layer's input and the
gradient of its output, nothing else. So while F runs, a forward hook notes for every call of
such a layer its input and the autograd node that made its output (`WeightGradTape`). I then asks
autograd, in one call, for the stage's input gradients, for the gradients arriving at those
nodes, and for every other parameter's gradient (norms, convolutions, gates: small, computed at
once). Autograd skips the deferred weights' branches and frees the graph; what stays until W is
the layers' inputs and output gradients (the profile's `wact_bytes`). W multiplies. Every node of
the graph runs once, as in a full backward, so I + W costs what B costs.

A parameter that a deferred layer shares with another module of the stage (tied weights) is not
deferred: autograd computes its whole gradient in I; nor is a layer whose weight is computed
from other parameters (`weight_norm`, `spectral_norm`). An input changed in place between F
and W is refused, as autograd refuses it. Out of scope, because invisible to the tape: a
parameter used by a module that does not own it (`F.linear(x, other.weight)`), and reentrant
activation checkpointing (`use_reentrant=True`), whose forward runs without autograd.

Inside a module the stage recomputes (non-reentrant checkpoint, `octopipe.runtime.model.recompute`),
F keeps no layer input: I redoes the module's forward, and the tape takes the inputs from that
second forward (`refilling`), so what W holds lives from I to W, not from F. Such a module
must run once per forward (two calls would be redone in the backward's order, not F's).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn
from torch.autograd.graph import GradientEdge, Node
from torch.distributed.tensor import DTensor, distribute_tensor

from octopipe.runtime.parallel.dtensors import local, set_local_grad, whole


@dataclass
class LayerCall:
    """One call of a deferred layer in F; `grad_output` is filled in by I."""

    module: nn.Module
    # Detached: holding it must not hold the graph behind it. None until I's redone forward
    # for a layer its stage recomputes.
    input: torch.Tensor | None
    input_version: int  # to refuse an input changed in place after F
    node: Node | None  # autograd node that produced the output; dropped once I is done
    output_nr: int
    grad_output: torch.Tensor | None = None

    def check_input_unchanged(self) -> None:
        if self.input is None:
            raise RuntimeError(
                f"the input of {type(self.module).__name__} was not recomputed before its weight "
                "gradient (W) needed it"
            )
        if self.input._version != self.input_version:
            raise RuntimeError(
                f"the input of {type(self.module).__name__} was modified in place after the "
                "forward; its weight gradient (W) needs it as it was"
            )


def _accumulate(param: torch.Tensor, grad: torch.Tensor) -> None:
    if param.grad is None:
        # Autograd may hand back a tensor that is also used elsewhere (the gradient it received)
        # or a broadcast view; `.grad` must own its memory, as AccumulateGrad makes sure.
        param.grad = grad.clone(memory_format=torch.contiguous_format)
    else:
        param.grad.add_(grad)


def _linear_weight_grads(call: LayerCall) -> None:
    lin: nn.Linear = call.module  # type: ignore[assignment]
    dy = call.grad_output.reshape(-1, lin.out_features)
    x = call.input.reshape(-1, lin.in_features).to(dy.dtype)  # autocast runs in dy's dtype
    if lin.weight.grad is None:
        lin.weight.grad = (dy.t() @ x).to(lin.weight.dtype)
    elif lin.weight.grad.dtype == dy.dtype:
        lin.weight.grad.addmm_(dy.t(), x)  # in place: no temporary per microbatch
    else:
        lin.weight.grad.add_(dy.t() @ x)
    if lin.bias is not None:
        _accumulate(lin.bias, dy.sum(0).to(lin.bias.dtype))


def _embedding_weight_grads(call: LayerCall) -> None:
    emb: nn.Embedding = call.module  # type: ignore[assignment]
    if isinstance(emb.weight, DTensor):
        _sharded_embedding_weight_grads(call)
        return
    if emb.weight.grad is None:
        emb.weight.grad = torch.zeros_like(emb.weight)
    rows = call.grad_output.reshape(-1, emb.embedding_dim).to(emb.weight.dtype)
    emb.weight.grad.index_add_(0, call.input.reshape(-1), rows)


def _sharded_embedding_weight_grads(call: LayerCall) -> None:
    """A vocabulary-parallel table (rows split over ranks): each rank adds the rows it holds,
    so no rank ever holds the gradient of the whole table."""
    emb: nn.Embedding = call.module  # type: ignore[assignment]
    weight = emb.weight
    ids = whole(call.input).reshape(-1)
    rows = _rows_held(weight, ids.device)
    where = torch.full((weight.shape[0],), -1, dtype=torch.long, device=ids.device)
    where[rows] = torch.arange(len(rows), device=ids.device)
    local_ids = where[ids]
    mine = local_ids >= 0
    grad = torch.zeros_like(weight.to_local())
    dy = whole(call.grad_output).reshape(-1, emb.embedding_dim)
    grad.index_add_(0, local_ids[mine], dy[mine].to(grad.dtype))
    if weight.grad is None:
        set_local_grad(weight, grad)
        return
    if weight.grad.placements != weight.placements:  # a full backward's: the whole table
        weight.grad = weight.grad.redistribute(placements=weight.placements)  # keeps our rows
    local(weight.grad).add_(grad)


def _rows_held(weight: DTensor, device: torch.device) -> torch.Tensor:
    """The rows of the whole table this rank's shard holds, in its order."""
    rows = torch.arange(weight.shape[0], device=device)
    return distribute_tensor(
        rows, weight.device_mesh, weight.placements, src_data_rank=None
    ).to_local()


def _rows_only(weight: torch.Tensor) -> bool:
    # W of a sharded table handles shards of its rows, not of its columns.
    if not isinstance(weight, DTensor):
        return True
    return all(p.is_replicate() or getattr(p, "dim", None) == 0 for p in weight.placements)


def _plain_embedding(emb: nn.Embedding) -> bool:
    # Padding rows, renormalization and frequency scaling change the gradient: leave them to
    # autograd.
    return (
        emb.padding_idx is None
        and emb.max_norm is None
        and not emb.scale_grad_by_freq
        and not emb.sparse
    )


_WEIGHT_GRADS: dict[type, Callable[[LayerCall], None]] = {
    nn.Linear: _linear_weight_grads,
    nn.Embedding: _embedding_weight_grads,
}


def _deferrable(module: nn.Module) -> bool:
    if type(module) not in _WEIGHT_GRADS:  # subclasses may compute something else
        return False
    if isinstance(module, nn.Embedding) and not _plain_embedding(module):
        return False
    if isinstance(module, nn.Embedding) and not _rows_only(module.weight):
        return False
    own = dict(module.named_parameters(recurse=False))
    if set(own) - {"weight", "bias"} or own.get("weight") is not module.weight:
        return False  # the weight is computed from other parameters (weight_norm and the like)
    return all(p.requires_grad for p in own.values())


class WeightGradTape:
    """Notes the calls of the deferrable layers among `modules` made inside `recording()`."""

    def __init__(self, modules: Iterable[nn.Module], recomputed: Iterable[nn.Module] = ()) -> None:
        recomputed = tuple(recomputed)
        every = list({id(m): m for top in modules for m in top.modules()}.values())
        owners: dict[int, int] = {}  # parameter -> how many modules hold it
        for module in every:
            for p in module.parameters(recurse=False):
                owners[id(p)] = owners.get(id(p), 0) + 1
        self._layers = [
            m
            for m in every
            if _deferrable(m) and all(owners[id(p)] == 1 for p in m.parameters(recurse=False))
        ]
        self._calls: list[LayerCall] | None = None
        # First among the hooks: a later one may replace the output, but the weight gradient
        # is the layer's own.
        self._hooks = [
            m.register_forward_hook(self._note, prepend=True, with_kwargs=True)
            for m in self._layers
        ]
        # Deferred layers inside recomputed modules: their inputs come from I's redone forward.
        deferred = {id(m) for m in self._layers}
        self._refilled = {id(m) for top in recomputed for m in top.modules() if id(m) in deferred}
        self._waiting: dict[int, deque[LayerCall]] | None = None  # while refilling
        self._runs: dict[int, int] = {}  # recorded forwards of each recomputed module
        self._hooks += [
            m.register_forward_pre_hook(self._count_run) for m in recomputed if self._refilled
        ]

    def defers(self, param: torch.Tensor) -> bool:
        """Whether W, not I, computes this parameter's gradient."""
        return not self.not_deferred([param])

    def not_deferred(self, params: Iterable[torch.Tensor]) -> list[torch.Tensor]:
        """Those of `params` whose gradient I computes, not W. Asked at the time: FSDP2 swaps
        a module's parameters (sharded, unsharded) between steps."""
        deferred = {id(p) for m in self._layers for p in m.parameters(recurse=False)}
        return [p for p in params if id(p) not in deferred]

    @contextmanager
    def recording(self) -> Iterator[list[LayerCall]]:
        """The calls of one forward, appended as they happen."""
        outer, self._calls = self._calls, []
        self._runs = {}
        try:
            yield self._calls
        finally:
            self._calls = outer

    @contextmanager
    def refilling(self, calls: Sequence[LayerCall]) -> Iterator[None]:
        """Around I: the redone forwards of recomputed modules give `calls` their inputs, each
        deferred layer's in the order F called it."""
        waiting: dict[int, deque[LayerCall]] = {}
        for call in calls:
            if call.input is None:
                waiting.setdefault(id(call.module), deque()).append(call)
        outer, self._waiting = self._waiting, waiting
        try:
            yield
        finally:
            self._waiting = outer

    def _count_run(self, module: nn.Module, args: tuple) -> None:
        if self._calls is None:  # not F (a redone forward, or no recording)
            return
        runs = self._runs[id(module)] = self._runs.get(id(module), 0) + 1
        if runs > 1:
            raise RuntimeError(
                f"{type(module).__name__} runs twice in one forward: a stage that recomputes "
                "it with a split backward needs each recomputed module to run once"
            )

    def remove(self) -> None:
        """Take the hooks off the modules (the tape records nothing after this)."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    def _note(self, module: nn.Module, args: tuple, kwargs: dict, output: torch.Tensor) -> None:
        x = args[0] if args else kwargs["input"]
        if self._waiting is not None and id(module) in self._refilled:  # I's redone forward
            queue = self._waiting.get(id(module))
            if queue:
                call = queue.popleft()
                call.input, call.input_version = x.detach(), x._version
            return
        if self._calls is None or output.grad_fn is None:  # not recording, or no_grad
            return
        if id(module) in self._refilled:  # recomputed: hold nothing from F
            self._calls.append(LayerCall(module, None, 0, output.grad_fn, output.output_nr))
            return
        self._calls.append(
            LayerCall(module, x.detach(), x._version, output.grad_fn, output.output_nr)
        )


class PendingWeightGrad:
    """The W of one microbatch: what I left for the deferred layers."""

    def __init__(self, calls: list[LayerCall]) -> None:
        self._calls = calls

    @property
    def held(self) -> list[torch.Tensor]:
        """The tensors kept alive until W runs."""
        return [t for c in self._calls for t in (c.input, c.grad_output)]

    @torch.no_grad()  # the inputs may require grad; `.grad` must not record a graph
    def run(self) -> None:
        """Accumulate the deferred weight gradients into `.grad`; frees what was held."""
        for call in self._calls:
            call.check_input_unchanged()
            _WEIGHT_GRADS[type(call.module)](call)
        self._calls = []


def backward_input(
    roots: Sequence[torch.Tensor],
    root_grads: Sequence[torch.Tensor | None],
    inputs: Sequence[torch.Tensor],
    calls: Sequence[LayerCall],
    params: Sequence[torch.Tensor],
) -> tuple[list[torch.Tensor | None], PendingWeightGrad]:
    """I: the gradients of `inputs` (None where none flows); the gradients of `params` (those
    not deferred) accumulate into `.grad`; the graph is freed. Returns what W still has to do."""
    edges = [GradientEdge(c.node, c.output_nr) for c in calls]
    targets = [*inputs, *edges, *params]
    if not roots or not targets:
        return [None] * len(inputs), PendingWeightGrad([])
    got = torch.autograd.grad(roots, targets, root_grads, allow_unused=True)
    n_in, n_calls = len(inputs), len(calls)
    for param, grad in zip(params, got[n_in + n_calls :]):
        if grad is not None:
            _accumulate(param, grad)
    pending = []
    for call, grad in zip(calls, got[n_in : n_in + n_calls]):
        call.node = None  # the graph is freed; keep nothing of it
        if grad is not None:  # None: the output did not reach the roots (an unused expert)
            call.check_input_unchanged()
            call.grad_output = grad
            pending.append(call)
    return list(got[:n_in]), PendingWeightGrad(pending)
