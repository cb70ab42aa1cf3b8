"""Split backward without doing the input path twice: what I leaves behind so W computes only dW.

I runs autograd from a stage's outputs to its inputs only. On that *input path* sit the nodes
where weight gradients branch off (a matmul's backward yields dX on the path and dW on a
branch). Before I runs, a pre-hook on each such *branch node* records the gradient arriving at
it; W later re-enters the graph at exactly those nodes and asks only for the weights on their
branches, so no node of the input path runs twice (only the branch nodes, for their dW part).

Calls are grouped so that no call can reach, through the input path, a weight that another
branch node already covers (that would count it twice). A graph where one weight is reached
both on a branch and further down the input path from the same node (weights shared across
layers) cannot be split this way: `plan_deferral` returns None and the stage falls back to a
W that runs backward from the outputs again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.autograd.graph import GradientEdge, Node, get_gradient_edge


@dataclass
class _BranchSource:
    """Where W enters the graph: a node, and the gradient that reached its outputs in I."""

    node: Node
    on_branch: int  # bitmask over the stage's weights: those below its off-path children
    down_the_path: int  # bitmask: weights below its input-path children
    edges: list[GradientEdge] | None = None  # set for outputs (roots) that are off the path
    grads: Sequence[torch.Tensor | None] | None = None


@dataclass
class _Group:
    sources: list[_BranchSource]
    on_branch: int = 0
    down_the_path: int = 0

    def accepts(self, src: _BranchSource) -> bool:
        return not (src.down_the_path & self.on_branch or src.on_branch & self.down_the_path)

    def add(self, src: _BranchSource) -> None:
        self.sources.append(src)
        self.on_branch |= src.on_branch
        self.down_the_path |= src.down_the_path


class DeferredWeightGrad:
    """The I of one microbatch, run so that its W can later compute only weight gradients."""

    def __init__(self, groups: list[_Group], params: Sequence[torch.Tensor]) -> None:
        self._groups, self._params = groups, list(params)

    def backward_input(
        self,
        roots: Sequence[torch.Tensor],
        root_grads: Sequence[torch.Tensor | None],
        inputs: Sequence[torch.Tensor],
    ) -> tuple[torch.Tensor | None, ...]:
        """Input gradients; the branch nodes' incoming gradients are kept for `backward_weight`."""
        hooked = [s for g in self._groups for s in g.sources if s.edges is None]
        handles = [s.node.register_prehook(_recorder(s)) for s in hooked]
        try:
            if not inputs:
                return ()
            return torch.autograd.grad(
                roots, inputs, root_grads, retain_graph=True, allow_unused=True
            )
        finally:
            for h in handles:
                h.remove()

    def backward_weight(self) -> list[torch.Tensor | None]:
        """Weight gradients (aligned with the stage's params; None where none reached)."""
        out: list[torch.Tensor | None] = [None] * len(self._params)
        for group in self._groups:
            edges, grads = [], []
            for src in group.sources:
                if src.edges is not None:
                    edges += src.edges
                    grads += list(src.grads or ())
                elif src.grads is not None:
                    for k, g in enumerate(src.grads):
                        if g is not None:
                            edges.append(GradientEdge(src.node, k))
                            grads.append(g)
            wanted = [i for i in range(len(self._params)) if group.on_branch >> i & 1]
            if not edges or not wanted:
                continue
            got = torch.autograd.grad(
                edges,
                [self._params[i] for i in wanted],
                grads,
                retain_graph=True,
                allow_unused=True,
            )
            for i, g in zip(wanted, got):
                if g is not None:
                    out[i] = g if out[i] is None else out[i] + g
        self._groups = []  # drop the graph references: W is the last use
        return out


def _recorder(src: _BranchSource):
    def record(grad_outputs):
        src.grads = tuple(grad_outputs)

    return record


def plan_deferral(
    roots: Sequence[torch.Tensor],
    root_grads: Sequence[torch.Tensor | None],
    inputs: Sequence[torch.Tensor],
    params: Sequence[torch.Tensor],
) -> DeferredWeightGrad | None:
    """Find the branch nodes of this microbatch's graph; None if the graph cannot be split."""
    root_edges = [get_gradient_edge(r) for r in roots]
    input_nodes = {get_gradient_edge(x).node for x in inputs}
    param_bit = {get_gradient_edge(p).node: 1 << i for i, p in enumerate(params)}
    order, kids_of = _children_first([e.node for e in root_edges])
    on_path: set[Node] = set()
    below: dict[Node, int] = {}  # node -> bitmask of the weights reachable from it
    for node in order:
        kids = kids_of[node]
        mask = param_bit.get(node, 0)
        for kid in kids:
            mask |= below[kid]
        below[node] = mask
        if node in input_nodes or any(k in on_path for k in kids):
            on_path.add(node)
    sources: list[_BranchSource] = []
    for node in order:
        if node not in on_path:
            continue
        off = on = 0
        for kid in kids_of[node]:
            if kid in on_path:
                on |= below[kid]
            else:
                off |= below[kid]
        if off & on:
            return None  # a weight both on a branch and down the path: shared weights
        if off:
            sources.append(_BranchSource(node, off, on))
    for edge, root, grad in zip(root_edges, roots, root_grads):
        if edge.node not in on_path and below.get(edge.node, 0):
            sources.append(
                _BranchSource(
                    edge.node,
                    below[edge.node],
                    0,
                    [edge],
                    [torch.ones_like(root) if grad is None else grad],
                )
            )
    groups: list[_Group] = []
    for src in sources:
        group = next((g for g in groups if g.accepts(src)), None)
        if group is None:
            group = _Group([])
            groups.append(group)
        group.add(src)
    return DeferredWeightGrad(groups, params)


def _children_first(roots: list[Node]) -> tuple[list[Node], dict[Node, list[Node]]]:
    """Every node below the roots, each after all of its children, and each node's children.

    Iterative, since graphs are deep; `next_functions` is read once per node, as it is costly.
    """
    order: list[Node] = []
    kids_of: dict[Node, list[Node]] = {}
    for root in roots:
        if root is None or root in kids_of:
            continue
        kids_of[root] = [k for k, _ in root.next_functions if k is not None]
        stack = [(root, iter(kids_of[root]))]
        while stack:
            node, kids = stack[-1]
            kid = next(kids, None)
            if kid is None:
                stack.pop()
                order.append(node)
            elif kid not in kids_of:
                kids_of[kid] = [k for k, _ in kid.next_functions if k is not None]
                stack.append((kid, iter(kids_of[kid])))
    return order, kids_of
