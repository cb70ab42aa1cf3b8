"""What the executor and the profiler know of a model: the one contract every model meets.

A `ModelRecipe` says how to build the model (on the meta device), which FQNs are its layers,
how to initialize a module, how a pruned copy runs on an activation tuple, the loss, and
(optionally) one synthetic training sequence. Three sources give one:

- a bundled model's name or an architecture `config.json` (our `ArchModel`);
- `module:factory`, a function returning any `nn.Module` whose `forward` skips removed or
  None submodules (torchtitan style), optionally with `pipeline_layers`, `loss(outputs,
  target)` and `synthetic_sequence(generator, seq_len)`;
- `hf:PATH`, a Hugging Face causal LM built from its config (`octopipe.runtime.hf`).

Each may have a tensor-parallel plan (`tp_plan`: our families' from
`octopipe.runtime.parallel.tp_plans`, or the model's own `tp_plan`).

`recipe.stage(layers, device, seed)` is then all a rank needs: the layers, materialized, as
one module whose `forward(*inputs)` returns the stage's output tuple.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from octopipe.errors import InputError
from octopipe.runtime.parallel.tp_plans import PlanOf, bundled_plan, user_plan
from octopipe.runtime.split import (
    InitModule,
    allocate,
    check_layers,
    initialize,
    layer_names_of,
    materialize,
    prune,
    reset_parameters,
)

Activation = tuple[torch.Tensor, ...]
Forward = Callable[[nn.Module, Activation], Activation]
Loss = Callable[[Activation, torch.Tensor], torch.Tensor]
# One training sequence, without the batch dimension: (inputs, target).
Synthetic = Callable[[torch.Generator, int], tuple[Activation, torch.Tensor]]

ModelSpec = str | Callable[[], nn.Module]  # what `--model` names, or the factory itself
HF_PREFIX = "hf:"
# The data's sizes when a run does not give them.
DEFAULT_SEQ_LEN = 32
DEFAULT_MICRO_BATCH_SIZE = 2


def as_activation(out) -> Activation:
    return out if isinstance(out, tuple) else (out,)


def call_forward(part: nn.Module, inputs: Activation) -> Activation:
    """A torchtitan-style model runs its stage by its own forward."""
    return as_activation(part(*inputs))


def next_token_loss(outputs: Activation, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the logits (the first output) against the target token ids."""
    logits = outputs[0]
    return F.cross_entropy(logits.flatten(0, -2).float(), target.flatten())


def explained(loss: Loss) -> Loss:
    """`loss`, with a misuse of its arguments said in one line: a loss given by the user
    (`loss=`, or the model's own `loss`) gets the outputs as a tuple, which a loss written for
    one tensor trips over."""
    if loss is next_token_loss:
        return loss

    def checked(outputs: Activation, target: torch.Tensor) -> torch.Tensor:
        try:
            return loss(outputs, target)
        except (TypeError, AttributeError, IndexError) as exc:
            name = getattr(loss, "__qualname__", "the loss")
            shapes = [tuple(t.shape) for t in outputs]
            raise InputError(
                "loss",
                f"{name}(outputs, target) raised {type(exc).__name__}: {exc}. It gets the "
                f"last stage's outputs as a tuple ({len(outputs)} of shapes {shapes}: "
                f"outputs[0] is the first) and the microbatch's targets {tuple(target.shape)}",
            ) from None

    return checked


class StageModule(nn.Module):
    """Some layers of a model, materialized: `forward(*inputs)` runs them, returns a tuple.
    `part` is the pruned model, so its parameters keep their FQNs in the whole model."""

    def __init__(self, part: nn.Module, run: Forward) -> None:
        super().__init__()
        self.part = part
        self._run = run
        # The modules whose whole forward it redoes under activation checkpoint
        # (`octopipe.runtime.recompute`); not those whose attention core alone it redoes.
        self.recomputed: tuple[nn.Module, ...] = ()

    def forward(self, *inputs: torch.Tensor) -> Activation:
        return self._run(self.part, inputs)


@dataclass
class ModelRecipe:
    name: str
    build: Callable[[], nn.Module]  # called under `torch.device("meta")`
    init: InitModule = reset_parameters
    forward: Forward = call_forward
    loss: Loss = next_token_loss
    synthetic: Synthetic | None = None
    kinds: Sequence[str] | None = None  # per layer, for profiles ("layer" when unknown)
    listed_layers: Sequence[str] | None = field(default=None, repr=False)
    tp_plan: PlanOf | None = None  # the TP degree -> FQN pattern -> ParallelStyle

    @cached_property
    def meta_model(self) -> nn.Module:
        with torch.device("meta"):
            model = self.build()
        if not isinstance(model, nn.Module):
            raise InputError("--model", f"{self.name} built a {type(model).__name__}, no nn.Module")
        return model

    @cached_property
    def layers(self) -> tuple[str, ...]:
        names = tuple(self.listed_layers or layer_names_of(self.meta_model))
        if not names:
            raise InputError("--model", f"{self.name} has no layers holding parameters")
        check_layers(self.meta_model, names)
        return names

    def layer_kind(self, index: int) -> str:
        return self.kinds[index] if self.kinds else "layer"

    def stage(
        self,
        keep: Sequence[str],
        device: torch.device,
        seed: int,
        parallelize: Callable[[StageModule], None] | None = None,
    ) -> StageModule:
        """The layers `keep`, built and initialized on `device`; `parallelize` shards the
        stage (tensor parallelism, FSDP2) before its weights are allocated."""
        part = prune(self.meta_model, self.layers, keep)
        if parallelize is None:
            return StageModule(materialize(part, device, seed, self.init), self.forward)
        module = StageModule(part, self.forward)
        parallelize(module)
        allocate(module, device)
        initialize(part, seed, self.init)
        return module

    def whole(self, device: torch.device, seed: int) -> StageModule:
        return self.stage(self.layers, device, seed)

    def synthetic_sequence(
        self, gen: torch.Generator, seq_len: int
    ) -> tuple[Activation, torch.Tensor]:
        if self.synthetic is None:
            raise InputError(
                "--data", f"{self.name} has no synthetic data (synthetic_sequence); give --data"
            )
        return self.synthetic(gen, seq_len)


def load_recipe(spec: ModelSpec) -> ModelRecipe:
    """The recipe of a `--model` value: a bundled name or config.json, `hf:PATH`,
    `module:factory`, or (from Python) the factory itself."""
    if callable(spec):
        return _from_module(getattr(spec, "__name__", "model"), spec)
    if spec.startswith(HF_PREFIX):
        from octopipe.runtime.hf import hf_recipe

        return hf_recipe(spec[len(HF_PREFIX) :])
    if ":" in spec:
        return _from_module(spec, _factory(spec))
    return _bundled(spec)


def _from_module(name: str, factory: Callable[[], nn.Module]) -> ModelRecipe:
    """A torchtitan-style model: its own forward, and its own loss and data when it has them."""
    recipe = ModelRecipe(name, factory)
    model = recipe.meta_model
    recipe.loss = getattr(model, "loss", next_token_loss)
    recipe.synthetic = getattr(model, "synthetic_sequence", None) or token_chains(recipe)
    recipe.kinds = getattr(model, "layer_kinds", None)
    recipe.tp_plan = user_plan(model)
    return recipe


def vocabulary_size(recipe: ModelRecipe) -> int | None:
    """The token ids a model whose first layer is a token embedding takes (0 to this - 1);
    None for other models."""
    first = recipe.meta_model.get_submodule(recipe.layers[0])
    embedding = next((m for m in first.modules() if isinstance(m, nn.Embedding)), None)
    return None if embedding is None else embedding.num_embeddings


def token_chains(recipe: ModelRecipe) -> Synthetic | None:
    """Synthetic data for a model whose first layer is a token embedding: chains of its
    vocabulary that a model learns (`octopipe.models.synthetic`). None for other models."""
    vocab = vocabulary_size(recipe)
    if vocab is None:
        return None

    def sequence(gen: torch.Generator, seq_len: int) -> tuple[Activation, torch.Tensor]:
        from octopipe.models import synthetic

        tokens = synthetic.chain_tokens(gen, 1, seq_len + 1, vocab)[0]
        return (tokens[:-1],), tokens[1:]

    return sequence


_FACTORY_SPEC = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*", re.ASCII)


def _factory(spec: str) -> Callable[[], nn.Module]:
    """The function `module:factory` names (the user's own code, imported as Python imports
    it), which must be callable with no arguments."""
    if not _FACTORY_SPEC.fullmatch(spec):
        raise InputError("--model", f"{spec!r} is not module:factory (e.g. mymodel:transformer)")
    module_name, _, attr = spec.partition(":")
    _import_from_here()
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise InputError("--model", f"cannot load factory {spec!r}: {exc}") from None
    if not callable(factory):
        raise InputError("--model", f"{spec!r} is not callable: expected a factory()")
    try:
        inspect.signature(factory).bind()
    except TypeError:
        raise InputError("--model", f"{spec!r} needs arguments: expected a factory()") from None
    except ValueError:  # no signature to read (some builtins): calling it will tell
        pass
    return factory


def _import_from_here() -> None:
    """`module:factory` names the user's module in the folder they work in, as `python -m`
    finds it; the `octopipe` command's own folder is not that one. Spawned ranks inherit the
    search path."""
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)


def _bundled(name: str) -> ModelRecipe:
    from octopipe.costmodel.hf_config import load_architecture, shipped_models
    from octopipe.models import bundled_models

    if name not in shipped_models() and not Path(name).is_file():
        raise InputError(
            "--model",
            f"unknown model {name!r}; bundled: {', '.join(sorted(bundled_models()))} (or a "
            "shipped config's name, a config.json, hf:PATH, module:factory)",
        )
    return arch_recipe(load_architecture(name))


def arch_recipe(arch) -> ModelRecipe:
    """The recipe of our own model of an architecture config (`octopipe.models.ArchModel`)."""
    from octopipe.models import ArchModel

    recipe = _from_module(arch.name, lambda: ArchModel(arch))
    recipe.tp_plan = lambda tp: bundled_plan(recipe.meta_model, tp)
    return recipe
