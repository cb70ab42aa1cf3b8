"""Split any torch model into pipeline stages by module FQNs, and give each stage its weights.

A model's *layers* are the FQNs a profile lists, in execution order. A stage keeps the modules
of its layers and removes the others (a `ModuleDict`/`ModuleList` entry is deleted, any other
submodule set to None), as torchtitan's pipeline split does; modules outside every layer (a
rotary embedding's buffers, say) stay on every stage. So the model's own `forward`, if it skips
what is missing, runs a stage unchanged, and the parameters a stage holds are its layers'.

Ranks build the model on the meta device (no memory), prune it to their stages, and only then
allocate (`to_empty`) and initialize: every module with tensors of its own is initialized with
torch's generator seeded by (seed, module FQN) alone, so a stage gets exactly the weights the
whole model has in one process, whatever the plan. Modules sharded by tensor parallelism or
FSDP2 (applied to the meta copy) are initialized at full size and keep their share
(`octopipe.runtime.parallel.init`). A parameter two layers share (tied embeddings) is
initialized by its first holder in module order; a stage holding only a later holder gets the
same values (`ties`).
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable, Iterable, Sequence

import torch
from torch import nn

from octopipe.errors import InputError
from octopipe.plan import check_layer_names
from octopipe.runtime.parallel.dtensors import local
from octopipe.runtime.parallel.init import holds_shards, init_sharded

# The two containers whose entries are layers (`layers.0`, `layers.1`, ...).
CONTAINERS = (nn.ModuleList, nn.ModuleDict)

InitModule = Callable[[nn.Module, nn.Module], None]  # (the model, one of its modules)


def default_layer_names(model: nn.Module) -> list[str]:
    """The layers of a model that does not list them: every child holding parameters, in
    registration order, with containers (and modules that hold one) opened up, so a
    torchtitan model gives `tok_embeddings, layers.0, ..., norm, output` and a Hugging Face
    causal LM `model.embed_tokens, model.layers.0, ..., model.norm, lm_head`."""
    names: list[str] = []

    def visit(module: nn.Module, prefix: str) -> None:
        for name, child in module.named_children():
            fqn = f"{prefix}{name}"
            if not any(True for _ in child.parameters()):
                continue
            if isinstance(child, CONTAINERS):
                names.extend(f"{fqn}.{entry}" for entry, _ in child.named_children())
            elif any(isinstance(c, CONTAINERS) for c in child.children()):
                visit(child, f"{fqn}.")
            else:
                names.append(fqn)

    visit(model, "")
    return names


def layer_names_of(model: nn.Module) -> list[str]:
    """The model's own list (`pipeline_layers`, as the bundled models give), else the default."""
    listed = getattr(model, "pipeline_layers", None)
    return list(listed) if listed is not None else default_layer_names(model)


def check_layers(model: nn.Module, layers: Sequence[str]) -> None:
    """Every layer names a module, no layer lies inside another, and every parameter lies in
    exactly one layer (a parameter outside all of them would be trained on every stage)."""
    if len(set(layers)) != len(layers):
        raise InputError("--model", "a layer name appears twice in the layer list")
    for name in layers:
        try:
            model.get_submodule(name)
        except AttributeError:
            raise InputError("--model", f"the model has no module {name!r}") from None
    for name in layers:
        for other in layers:
            if other != name and other.startswith(f"{name}."):
                raise InputError("--model", f"layer {other!r} lies inside layer {name!r}")
    owner = {}
    for layer in layers:
        # A parameter two layers share (tied embeddings) is theirs both: `ties` keeps a copy
        # on each stage holding one, their gradients summed.
        for p in model.get_submodule(layer).parameters():
            owner.setdefault(id(p), layer)
    loose = [n for n, p in model.named_parameters(remove_duplicate=False) if id(p) not in owner]
    if loose:
        raise InputError(
            "--model", f"parameter {loose[0]!r} belongs to no layer ({len(loose)} such)"
        )


def check_plan_layer_names(plan_names: Sequence[str] | None, model_names: Sequence[str]) -> None:
    """A plan made for another model must not run: same layers, same order (by name when the
    plan lists them, else by count)."""
    check_layer_names(plan_names, model_names, "--plan", of="the model")


def prune(model: nn.Module, layers: Sequence[str], keep: Iterable[str]) -> nn.Module:
    """A copy of `model` holding only the layers in `keep` (and the modules outside all layers).
    Cheap on the meta device, where a copy has no data."""
    keep = set(keep)
    unknown = keep - set(layers)
    if unknown:
        raise ValueError(f"not layers of the model: {sorted(unknown)}")
    part = copy.deepcopy(model)
    for name in layers:
        if name not in keep:
            _remove(part, name)
    return part


def _remove(root: nn.Module, fqn: str) -> None:
    parent_name, _, leaf = fqn.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    if isinstance(parent, CONTAINERS):
        del parent._modules[leaf]  # the others keep their keys, hence their FQNs
    else:
        setattr(parent, leaf, None)


def module_seed(seed: int, fqn: str) -> int:
    """A seed that depends only on the run's seed and the module's FQN."""
    digest = hashlib.sha256(f"{seed}/{fqn}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF


def materialize(part: nn.Module, device: torch.device, seed: int, init: InitModule) -> nn.Module:
    """Allocate a (pruned, meta) model on `device` and initialize every module that holds tensors
    of its own, each from its own seed."""
    allocate(part, device)
    initialize(part, seed, init)
    return part


def allocate(root: nn.Module, device: torch.device) -> None:
    """Give a meta module's tensors memory on `device` (through `root`: an FSDP2 unit must
    allocate its shards itself)."""
    ties = _shared_parameters(root)
    root.to_empty(device=device)
    for holders in ties:  # to_empty gives every holder of a shared tensor a copy of its own
        module, name = holders[0]
        for other, other_name in holders[1:]:
            setattr(other, other_name, getattr(module, name))


def initialize(part: nn.Module, seed: int, init: InitModule) -> None:
    """Initialize every module of an allocated (pruned) model that holds tensors of its own,
    each from (seed, its FQN in the model)."""
    done: set[int] = set()  # tied parameters: their first holder initializes them
    for fqn, module in part.named_modules():
        own = [*module.parameters(recurse=False), *module.buffers(recurse=False)]
        if not own or all(id(t) in done for t in own):
            continue
        kept = {id(t): local(t).detach().clone() for t in own if id(t) in done}
        # fork_rng keeps the caller's generators untouched; devices=[] leaves CUDA's alone,
        # so a module is initialized on the CPU generator's stream wherever it lives.
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(module_seed(seed, fqn))
            if holds_shards(module):  # tensor-parallel or FSDP shards: at full size, then cut
                init_sharded(module, lambda m: init(part, m))
            else:
                init(part, module)
            for t in own:
                if id(t) in kept:
                    local(t).copy_(kept[id(t)])
        done.update(id(t) for t in own)


def _shared_parameters(model: nn.Module) -> list[list[tuple[nn.Module, str]]]:
    """(module, attribute) of every parameter held in more than one place (tied weights)."""
    holders: dict[int, list[tuple[nn.Module, str]]] = {}
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            holders.setdefault(id(p), []).append((module, name))
    return [h for h in holders.values() if len(h) > 1]


def reset_parameters(_model: nn.Module, module: nn.Module) -> None:
    """The initialization of torch's own modules, and of any module that defines it alike."""
    reset = getattr(module, "reset_parameters", None)
    if reset is None:
        raise InputError(
            "--model",
            f"{type(module).__name__} holds parameters or buffers of its own but has no "
            "reset_parameters() to initialize them after a meta-device build",
        )
    reset()


def parameter_bytes(module: nn.Module) -> int:
    """The bytes of the module's weights this rank holds (its shards of sharded ones)."""
    return sum(local(p).numel() * p.element_size() for p in module.parameters())
