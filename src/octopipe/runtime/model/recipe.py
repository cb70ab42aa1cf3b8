"""What the executor and the profiler know of a model: the one contract every model meets.

A `ModelRecipe` says how to build the model (on the meta device), which FQNs are its layers,
how to initialize a module, how a pruned copy runs on an activation tuple, the loss, and
(optionally) one synthetic training sequence. Three sources give one (`load.load_recipe`
dispatches on the spelling):

- a bundled model's name or an architecture `config.json` (our `ArchModel`, `bundled`);
- `module:factory`, a function returning any `nn.Module` whose `forward` skips removed or
  None submodules (torchtitan style), optionally with `pipeline_layers`, `loss(outputs,
  target)` and `synthetic_sequence(generator, seq_len)`;
- `hf:PATH`, a Hugging Face causal LM built from its config (`hf`).

Each may have a tensor-parallel plan (`tp_plan`: our families' from
`octopipe.runtime.parallel.tp_plans`, or the model's own `tp_plan`).

`recipe.stage(layers, device, seed)` is then all a rank needs: the layers, materialized, as
one module whose `forward(*inputs)` returns the stage's output tuple.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from octopipe.errors import InputError
from octopipe.runtime.model.split import (
    InitModule,
    allocate,
    check_layers,
    initialize,
    layer_names_of,
    materialize,
    prune,
    reset_parameters,
)
from octopipe.runtime.model.ties import Tie, alias_names, find_ties, init_copies, named_weights

if TYPE_CHECKING:  # the styles import torch.distributed.tensor, which a launcher need not
    from octopipe.runtime.parallel.tp_plans import PlanOf

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

    def __init__(
        self, part: nn.Module, run: Forward, aliases: dict[str, str] | None = None
    ) -> None:
        super().__init__()
        self.part = part
        self._run = run
        self.aliases = aliases or {}  # a tied copy's FQN -> the tied parameter's name
        # The modules whose whole forward it redoes under activation checkpoint
        # (`octopipe.runtime.model.recompute`); not those whose attention core alone it redoes.
        self.recomputed: tuple[nn.Module, ...] = ()

    def forward(self, *inputs: torch.Tensor) -> Activation:
        return self._run(self.part, inputs)

    def named_weights(self) -> dict[str, nn.Parameter]:
        """The stage's parameters by their names in the whole model (a tied copy by the tied
        parameter's: checkpoints and reports hold one copy)."""
        return dict(named_weights(self.part, self.aliases))


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
    max_positions: int | None = None  # the longest sequence the model is made for, if known
    # The TP plan under expert parallelism (MoE blocks on each rank's own tokens); None: the
    # model's experts cannot be divided (`parallel.experts`).
    expert_tp_plan: PlanOf | None = None

    @cached_property
    def meta_model(self) -> nn.Module:
        with torch.device("meta"), _values_skipped():
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

    @cached_property
    def ties(self) -> tuple[Tie, ...]:
        """The parameters several layers share (tied embeddings)."""
        return find_ties(self.meta_model, self.layers)

    def plans_by(self, maker: str) -> None:
        """TP plans, with and without expert parallelism, from `tp_plans.<maker>(meta model,
        tp, expert_parallel)`: the styles' module is imported only by a run that shards (it
        imports DTensor's, which a launcher's checks need not)."""

        def plans(expert_parallel: bool) -> PlanOf:
            def plan(tp: int):
                from octopipe.runtime.parallel import tp_plans

                return getattr(tp_plans, maker)(self.meta_model, tp, expert_parallel)

            return plan

        self.tp_plan, self.expert_tp_plan = plans(False), plans(True)

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
        aliases = alias_names(self.ties)
        if parallelize is None:
            module = StageModule(materialize(part, device, seed, self.init), self.forward, aliases)
        else:
            module = StageModule(part, self.forward, aliases)
            parallelize(module)
            allocate(module, device)
            initialize(part, seed, self.init)
        init_copies(part, self.meta_model, self.ties, seed, self.init)
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


class _values_skipped(TorchFunctionMode):  # noqa: N801 - used as a context, like torch.device
    """Random fills of meta tensors done as nothing: they only set values, which a meta tensor
    does not hold, and torch runs some of them (`normal_`) through its Python references, whose
    first call imports torch._dynamo (half a second; a launcher that only checks never needs
    it)."""

    FILLS = frozenset(
        {
            torch.Tensor.normal_,
            torch.Tensor.exponential_,
            torch.Tensor.log_normal_,
            torch.Tensor.cauchy_,
            torch.Tensor.geometric_,
            torch.Tensor.erfinv_,
            torch.nn.init.normal_,
            torch.nn.init.xavier_normal_,
            torch.nn.init.kaiming_normal_,
        }
    )

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        first = args[0] if args else kwargs.get("tensor")  # torch.nn.init passes it by name
        if func in self.FILLS and isinstance(first, torch.Tensor) and first.is_meta:
            return first
        return func(*args, **kwargs)


def from_module(name: str, factory: Callable[[], nn.Module]) -> ModelRecipe:
    """The recipe of any `nn.Module` factory, a torchtitan-style model: its own forward, and
    its own loss and data when it has them."""
    recipe = ModelRecipe(name, factory)
    model = recipe.meta_model
    recipe.loss = getattr(model, "loss", next_token_loss)
    recipe.synthetic = getattr(model, "synthetic_sequence", None) or token_chains(recipe)
    recipe.kinds = getattr(model, "layer_kinds", None)
    recipe.tp_plan = _own_plan(model)
    return recipe


def _own_plan(model: nn.Module) -> PlanOf | None:
    """A model's `tp_plan`: a dict of FQN pattern -> style, or a function of the TP degree
    returning one. None when the model has none."""
    hook = getattr(model, "tp_plan", None)
    if hook is None:
        return None
    if callable(hook):
        return hook
    if isinstance(hook, dict):
        return lambda _tp: dict(hook)
    raise InputError(
        "--model", f"tp_plan is a {type(hook).__name__}: expected a dict or a function"
    )


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
        from octopipe.models.synthetic import chain_tokens

        tokens = chain_tokens(gen, 1, seq_len + 1, vocab)[0]
        return (tokens[:-1],), tokens[1:]

    return sequence
