"""Tensor parallelism of a stage: torch's parallel styles applied by FQN, torchtitan style.

`apply_tp(module, mesh, plan)` is the one entry: `plan` maps FQN patterns of the whole model
(`*` matches one name, as `parallelize_module` reads them) to `ParallelStyle`s, and a pruned
stage applies the entries naming modules it holds. The plans of our model families live in
`tp_plans`; a user's model brings its own as `tp_plan` (docs/FORMATS.md). Nothing here knows a
model.

The conventions every plan keeps, so that stages compose whatever the split:
- between layers, activations are each rank's shard of the sequence (dimension 1), plain
  tensors: what crosses a stage boundary is the local shard, and a stage's input arrives so;
- the head's logits stay a DTensor sharded over the vocabulary, and the loss and its backward
  run under `loss_parallel`, so the logits are never gathered.

After a stage's last backward of a step, `settle_grads` turns gradients DTensor left partial
(replicated weights that saw sharded inputs: sequence-parallel norms) into their parameter's
layout, one all-reduce over the tensor-parallel group for all of them.
"""

from __future__ import annotations

import contextlib
import fnmatch
from collections.abc import Iterable, Mapping

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate
from torch.distributed.tensor.parallel import ParallelStyle, loss_parallel, parallelize_module

from octopipe.errors import InputError

TensorParallelPlan = Mapping[str, ParallelStyle]  # FQN pattern -> style
# Set on a module by apply_tp: the degree of the tensor parallelism it runs under.
_DEGREE = "_octopipe_tp_degree"


def apply_tp(module: nn.Module, mesh: DeviceMesh, plan: TensorParallelPlan) -> None:
    """Parallelize the submodules of `module` (the whole model, or a stage's pruned copy) that
    `plan` names; patterns naming none of them (another stage's layers) are skipped. Works on
    the meta device, before the weights are allocated."""
    styles = resolve(plan, [name for name, _ in module.named_modules()])
    ties = _tied(module)
    if styles:
        parallelize_module(module, mesh, styles, src_data_rank=None)
    _retie(ties)
    setattr(module, _DEGREE, mesh.size())


def _tied(module: nn.Module) -> list[list[tuple[nn.Module, str]]]:
    """(module, name) of every parameter held in more than one place (tied embeddings)."""
    holders: dict[int, list[tuple[nn.Module, str]]] = {}
    for m in module.modules():
        for name, p in m.named_parameters(recurse=False):
            holders.setdefault(id(p), []).append((m, name))
    return [h for h in holders.values() if len(h) > 1]


def _retie(ties: list[list[tuple[nn.Module, str]]]) -> None:
    """Each style makes its module's weights anew, which unties them: the holders share the
    first one's again. Tied holders must be split alike (a vocabulary-parallel embedding and
    head: both cut the table's rows)."""
    for holders in ties:
        first = getattr(holders[0][0], holders[0][1])
        for module, name in holders[1:]:
            other = getattr(module, name)
            if _layout(other) != _layout(first):
                raise InputError(
                    "--tp",
                    f"{type(holders[0][0]).__name__}.{holders[0][1]} and "
                    f"{type(module).__name__}.{name} share a weight the tensor-parallel plan "
                    "splits two ways",
                )
            setattr(module, name, first)


def _layout(p: torch.Tensor) -> tuple:
    return tuple(p.placements) if isinstance(p, DTensor) else ()


def resolve(styles: Mapping[str, ParallelStyle], names: Iterable[str]) -> dict[str, ParallelStyle]:
    """The plan's patterns matched against module names: FQN -> style, in the plan's order."""
    names = list(names)
    resolved: dict[str, ParallelStyle] = {}
    for pattern, style in styles.items():
        for name in names:
            if matches(pattern, name):
                if name in resolved:
                    raise ValueError(f"the tensor-parallel plan names {name!r} twice")
                resolved[name] = style
    return resolved


def check_plan(plan: TensorParallelPlan, model: nn.Module) -> None:
    """Refuse, in one line, a plan with a pattern that names no module of the whole model (a
    typo would leave a layer unsplit) or a module that two patterns name."""
    names = [name for name, _ in model.named_modules()]
    try:
        resolve(plan, names)
    except ValueError as exc:
        raise InputError("--tp", str(exc)) from None
    for pattern in plan:
        if not any(matches(pattern, name) for name in names):
            raise InputError("--tp", f"the tensor-parallel plan's {pattern!r} names no module")


def matches(pattern: str, fqn: str) -> bool:
    """`layers.*.attention.wq` matches `layers.3.attention.wq`: name by name, as
    `parallelize_module` matches its plan's keys."""
    atoms, parts = pattern.split("."), fqn.split(".")
    return len(atoms) == len(parts) and all(fnmatch.fnmatchcase(p, a) for a, p in zip(atoms, parts))


def tp_degree(module: nn.Module) -> int:
    """The tensor-parallel degree `module` runs under (1 without): under our plans, into how
    many pieces the activations between its layers cut the sequence."""
    return getattr(module, _DEGREE, 1)


def loss_context() -> contextlib.AbstractContextManager:
    """Where the last stage's loss and its backward run: on vocabulary-sharded logits."""
    return loss_parallel()


def settle_grads(params: Iterable[torch.Tensor]) -> None:
    """Give every DTensor gradient its parameter's layout. Partial sums (a replicated weight
    that saw sharded inputs) are summed over their mesh, all of one mesh in one all-reduce;
    a replicated gradient of a sharded parameter keeps only the rank's shard (no transfer)."""
    partial: dict[DeviceMesh, list[torch.Tensor]] = {}
    for p in params:
        grad = p.grad
        if not isinstance(grad, DTensor) or grad.placements == p.placements:
            continue
        mesh = grad.device_mesh
        if mesh.ndim == 1 and grad.placements[0] == Partial() and p.placements[0].is_replicate():
            partial.setdefault(mesh, []).append(p)
        else:
            p.grad = grad.redistribute(p.device_mesh, p.placements)
    for mesh, group in partial.items():
        _sum_partials(mesh, group)


def _sum_partials(mesh: DeviceMesh, params: list[torch.Tensor]) -> None:
    locals_ = [p.grad.to_local() for p in params]
    flat = torch.cat([g.reshape(-1) for g in locals_])
    dist.all_reduce(flat, group=mesh.get_group())
    offset = 0
    for p, g in zip(params, locals_):
        n = g.numel()
        total = flat[offset : offset + n].view_as(g)
        offset += n
        p.grad = DTensor.from_local(total, mesh, [Replicate()], run_check=False)
