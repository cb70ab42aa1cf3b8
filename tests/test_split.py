"""Splitting any torch model by module FQNs: which modules are layers, what a stage keeps, and
weights that depend on (seed, FQN) alone."""

from __future__ import annotations

import pytest
import torch
from model_zoo import TitanStyle
from torch import nn

from octopipe.errors import InputError
from octopipe.runtime.model.load import load_recipe
from octopipe.runtime.model.split import (
    check_layers,
    check_plan_layer_names,
    default_layer_names,
    materialize,
    prune,
    reset_parameters,
)
from octopipe.runtime.model.ties import find_ties

CPU = torch.device("cpu")
TITAN = ["tok_embeddings", "layers.0", "layers.1", "layers.2", "layers.3", "norm", "output"]


class _Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))
        self.rotary = _Buffers()  # no parameters: not a layer, kept by every stage


class _Buffers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.arange(4.0))

    def reset_parameters(self) -> None:
        self.table.copy_(torch.arange(4.0))


class _HFLike(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.model = _Inner()
        self.head = nn.Linear(4, 10)


def test_layers_are_found_with_containers_opened():
    assert default_layer_names(TitanStyle()) == TITAN
    assert default_layer_names(_HFLike()) == [
        "model.embed",
        "model.layers.0",
        "model.layers.1",
        "head",
    ]


def test_a_stage_keeps_its_layers_their_fqns_and_the_modules_outside_every_layer():
    with torch.device("meta"):
        model = _HFLike()
    layers = default_layer_names(model)
    part = prune(model, layers, ["model.layers.1", "head"])
    names = {n for n, _ in part.named_parameters()}
    assert names == {"model.layers.1.weight", "model.layers.1.bias", "head.weight", "head.bias"}
    assert part.model.embed is None and part.model.rotary is not None
    assert [n for n, _ in model.named_parameters()][0] == "model.embed.weight"  # untouched


def test_weights_depend_on_the_seed_and_the_fqn_only():
    recipe = load_recipe(TitanStyle)
    whole = recipe.whole(CPU, seed=3).part.state_dict()
    alone = recipe.stage(["layers.2"], CPU, seed=3).part.state_dict()
    torch.manual_seed(99)  # the global generator plays no part
    again = recipe.stage(["layers.2", "output"], CPU, seed=3).part.state_dict()
    other = recipe.stage(["layers.2"], CPU, seed=4).part.state_dict()
    for key, value in alone.items():
        assert torch.equal(value, whole[key]) and torch.equal(value, again[key]), key
    assert not torch.equal(alone["layers.2.qkv.weight"], other["layers.2.qkv.weight"])
    assert not torch.equal(whole["layers.1.qkv.weight"], whole["layers.2.qkv.weight"])


def test_a_tied_weight_stays_tied_after_materializing():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    model[1].weight = model[0].weight
    materialize(model, CPU, 0, reset_parameters)
    assert model[1].weight is model[0].weight and model[0].weight.device == CPU


def test_a_weight_two_layers_share_is_a_tie_of_both_layers():
    tied = TitanStyle()
    tied.output.weight = tied.tok_embeddings.weight
    check_layers(tied, TITAN)  # tied embeddings split: a copy on each stage (`ties`)
    (tie,) = find_ties(tied, TITAN)
    assert (tie.name, tie.aliases, tie.layers) == (
        "tok_embeddings.weight",
        ("output.weight",),
        ("tok_embeddings", "output"),
    )


def test_models_that_cannot_be_split_are_refused_in_one_line():
    loose = TitanStyle()
    loose.scale = nn.Parameter(torch.ones(1))
    with pytest.raises(InputError, match="'scale' belongs to no layer"):
        check_layers(loose, TITAN)
    with pytest.raises(InputError, match="no module 'layers.9'"):
        check_layers(TitanStyle(), [*TITAN, "layers.9"])
    with pytest.raises(InputError, match="lies inside layer 'layers'"):
        check_layers(TitanStyle(), ["tok_embeddings", "layers", "layers.0", "norm", "output"])

    class _NoReset(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(2))

    with pytest.raises(InputError, match="_NoReset .* no reset_parameters"):
        materialize(_NoReset(), CPU, 0, reset_parameters)


def test_plan_layer_names_must_be_the_models():
    check_plan_layer_names(None, TITAN)  # a plan without names: the count is checked elsewhere
    check_plan_layer_names(TITAN, TITAN)
    with pytest.raises(InputError, match="layer 1 is 'blocks.0' in the plan but 'layers.0'"):
        check_plan_layer_names(["tok_embeddings", "blocks.0", *TITAN[2:]], TITAN)
    with pytest.raises(InputError, match="the plan has 6 layers, the model 7"):
        check_plan_layer_names(TITAN[:6], TITAN)
