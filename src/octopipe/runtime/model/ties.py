"""Tied weights (an embedding and a head sharing one table) across pipeline stages.

In one module a tied parameter is one tensor. When a plan puts its holders on different stages,
each stage keeps a copy, as Megatron-LM keeps the word embeddings on the first and the last
stage: the copies start equal (every copy is initialized as the first holder initializes the
shared one), their gradients are summed before the optimizer (`step.tied`), so every update
keeps them equal. Names: the first holder's FQN is the parameter's name (what
`named_parameters` of the whole model gives, what checkpoints store: one copy); the others are
aliases of it.

Nothing here communicates; the gradient sum lives with the step.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from octopipe.runtime.model.split import InitModule, module_seed
from octopipe.runtime.parallel.dtensors import is_dtensor


@dataclass(frozen=True)
class Tie:
    """One shared parameter: its name and the other FQNs it goes by, with their layers."""

    name: str  # the first holder's parameter FQN (model order)
    aliases: tuple[str, ...]
    layers: tuple[str, ...]  # the layer of the name, then of each alias

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)


def find_ties(model: nn.Module, layers: Sequence[str]) -> tuple[Tie, ...]:
    """Every parameter of `model` held under more than one FQN, with the layers holding it."""
    holders: dict[int, list[str]] = {}
    for fqn, p in model.named_parameters(remove_duplicate=False):
        holders.setdefault(id(p), []).append(fqn)
    ties = []
    for names in holders.values():
        if len(names) > 1:
            owners = tuple(_layer_of(n, layers) for n in names)
            ties.append(Tie(names[0], tuple(names[1:]), owners))
    return tuple(ties)


def _layer_of(fqn: str, layers: Sequence[str]) -> str:
    return next(layer for layer in layers if fqn.startswith(f"{layer}."))


def alias_names(ties: Sequence[Tie]) -> dict[str, str]:
    """Alias FQN -> the tied parameter's name."""
    return {alias: t.name for t in ties for alias in t.aliases}


def named_weights(part: nn.Module, aliases: dict[str, str]) -> Iterator[tuple[str, nn.Parameter]]:
    """A (pruned) model's parameters by their names in the whole model: a tied copy by the
    tied parameter's name, whichever holder the part keeps."""
    for fqn, p in part.named_parameters():
        yield aliases.get(fqn, fqn), p


@torch.no_grad()
def init_copies(
    part: nn.Module, model: nn.Module, ties: Sequence[Tie], seed: int, init: InitModule
) -> None:
    """Give every tied copy the part holds without the first holder the values the first
    holder's initialization gives the shared parameter (built aside at full size, on the CPU,
    from the meta `model`; a sharded copy keeps its share)."""
    held = dict(part.named_parameters())
    for tie in ties:
        if tie.name in held:
            continue  # the part holds the first holder: `split.initialize` did it
        copies = [held[a] for a in tie.aliases if a in held]
        if not copies:
            continue
        module_fqn, _, leaf = tie.name.rpartition(".")
        first = copy.deepcopy(model.get_submodule(module_fqn)).to_empty(device="cpu")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(module_seed(seed, module_fqn))
            init(model, first)
        full = getattr(first, leaf).detach()
        for p in copies:
            if is_dtensor(p):
                from torch.distributed.tensor import distribute_tensor

                shard = distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None)
                p.to_local().copy_(shard.to_local())
            else:
                p.copy_(full)


def _holders(stages: dict[int, nn.Module], tie: Tie) -> list[tuple[nn.Module, str, nn.Parameter]]:
    found = []
    for stage in stages.values():
        part = stage.part  # type: ignore[union-attr]
        for fqn, p in part.named_parameters():
            if fqn in tie.names:
                owner, _, leaf = fqn.rpartition(".")
                found.append((part.get_submodule(owner), leaf, p))
    return found


def spans_stages(stages: dict[int, nn.Module], ties: Sequence[Tie]) -> bool:
    """Whether two of these stages hold holders of one tie."""
    return any(len(_holders(stages, tie)) > 1 for tie in ties)


def share_across_stages(stages: dict[int, nn.Module], ties: Sequence[Tie]) -> None:
    """Stages of one rank holding holders of the same tie share one parameter (its gradient
    then accumulates both stages' parts in autograd): every later holder gets the first's."""
    for tie in ties:
        found = _holders(stages, tie)
        for module, leaf, _ in found[1:]:
            setattr(module, leaf, found[0][2])
