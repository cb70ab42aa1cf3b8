"""One stage's compute in one process: split backward (I then W) must equal full backward,
with W doing only the deferred layers' weight gradients, and tied weights left to I."""

import pytest
import torch
from executor_helpers import TOY, TOY_LAYERS, batch_of, stage_of, toy_model

from octopipe.models import bundled_models
from octopipe.runtime.model.load import load_recipe
from octopipe.runtime.step.stage import StageCompute, as_leaves


def stage_compute(recipe, start, end, seed, num_mb):
    module = stage_of(recipe, start, end, seed)
    return StageCompute(module, end == len(recipe.layers), recipe.loss, num_mb)


def whole_model_grads(recipe, seed, batch, num_mb):
    """Plain autograd over the whole model, built in one piece."""
    model = recipe.whole(torch.device("cpu"), seed)
    for m in range(num_mb):
        (recipe.loss(model(*batch.inputs[m]), batch.targets[m]) / num_mb).backward()
    return {k: p.grad for k, p in model.part.named_parameters()}


def stage_grads(stages):
    return {k: p.grad for st in stages for k, p in st.module.part.named_parameters()}


@pytest.mark.parametrize("kinds", [("B", "B"), ("IW", "IW"), ("IW", "B"), ("B", "IW")])
def test_two_stages_in_one_process_match_plain_autograd(kinds):
    num_mb, seed = 3, 5
    recipe = load_recipe(TOY)
    batch = batch_of(recipe, num_mb, seed)
    first = stage_compute(recipe, 0, 4, seed, num_mb)
    last = stage_compute(recipe, 4, TOY_LAYERS, seed, num_mb)
    for m in range(num_mb):
        out, _ = first.forward(m, batch.inputs[m], None)
        last.forward(m, as_leaves(out), batch.targets[m])
    for m in reversed(range(num_mb)):  # any order of microbatches
        split_last, split_first = (k == "IW" for k in kinds[::-1])
        grads = last.backward_input(m, None) if split_last else last.backward(m, None)
        first.backward_input(m, grads) if split_first else first.backward(m, grads)
    for m in range(num_mb):  # weight gradients deferred past every input gradient
        if kinds[1] == "IW":
            last.backward_weight(m)
        if kinds[0] == "IW":
            first.backward_weight(m)
    assert first.in_flight() == last.in_flight() == 0
    want = whole_model_grads(recipe, seed, batch, num_mb)
    got = stage_grads([first, last])
    assert set(got) == set(want)
    for name, grad in got.items():
        torch.testing.assert_close(grad, want[name], rtol=1e-5, atol=1e-7, msg=name)


def test_input_gradients_cover_every_float_stream_and_skip_integers():
    recipe = load_recipe(TOY)
    batch = batch_of(recipe, 1, 0)
    first = stage_compute(recipe, 0, 3, 0, 1)
    mid = stage_compute(recipe, 3, 5, 0, 1)
    out, _ = first.forward(0, batch.inputs[0], None)
    leaves = as_leaves(out)
    assert [t.requires_grad for t in leaves] == [True, True, False]  # h, skip, ids
    mid_out, _ = mid.forward(0, leaves, None)
    grads = mid.backward_input(0, [torch.ones_like(t) for t in mid_out if t.is_floating_point()])
    assert [g.shape for g in grads] == [leaves[0].shape, leaves[1].shape]
    assert all(g.abs().sum() > 0 for g in grads)


class _Shared(torch.nn.Module):
    """Applies one linear twice: W must add up the gradients of both calls."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)

    def forward(self, h, skip, ids):
        return torch.tanh(self.lin(torch.tanh(self.lin(h)))), skip, ids


def split_matches_full(recipe, spans, num_mb=2, seed=3):
    """Run the stages with split backward (W after every I) and compare with plain autograd."""
    batch = batch_of(recipe, num_mb, seed, rows=2)
    stages = [stage_compute(recipe, a, b, seed, num_mb) for a, b in spans]
    for m in range(num_mb):
        x = batch.inputs[m]
        for st in stages:
            out, _ = st.forward(m, x, batch.targets[m] if st.is_last else None)
            x = as_leaves(out)
    for m in range(num_mb):
        grads = None
        for st in reversed(stages):
            grads = st.backward_input(m, grads)
    for m in range(num_mb):
        for st in stages:
            st.backward_weight(m)
    want = whole_model_grads(recipe, seed, batch, num_mb)
    got = stage_grads(stages)
    assert set(got) == set(want)
    for name, grad in got.items():
        assert (grad is None) == (want[name] is None), name
        if grad is not None:
            torch.testing.assert_close(grad, want[name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize(
    "name",
    [m if m == "tiny-llama" else pytest.param(m, marks=pytest.mark.slow) for m in bundled_models()],
)
def test_split_backward_matches_plain_autograd_on_every_bundled_model(name):
    recipe = load_recipe(name)
    layers = len(recipe.layers)
    cut = layers // 2
    split_matches_full(recipe, [(0, cut), (cut, layers)])


def test_input_backward_leaves_exactly_the_linear_and_embedding_weights_to_w():
    recipe = load_recipe("tiny-llama")
    stage = stage_compute(recipe, 0, len(recipe.layers), 0, 1)
    batch = batch_of(recipe, 1, 0, rows=2)
    stage.forward(0, batch.inputs[0], batch.targets[0])
    stage.backward_input(0, None)
    model = stage.module.part
    deferred = {
        id(p)
        for m in model.modules()
        if type(m) in (torch.nn.Linear, torch.nn.Embedding)
        for p in m.parameters()
    }
    assert deferred  # the model has linears and an embedding
    for name, p in model.named_parameters():
        assert (p.grad is None) == (id(p) in deferred), name
    stage.backward_weight(0)
    assert all(p.grad is not None for p in model.parameters())


class _Tied(torch.nn.Module):
    """A linear whose weight an embedding-like lookup also reads: it cannot be deferred."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)
        self.table = torch.nn.Embedding(8, 6)
        self.table.weight = self.lin.weight

    def forward(self, h, skip, ids):
        return torch.tanh(self.lin(h)) + self.table(ids % 6), skip, ids


def with_layer_1(module):
    def factory():
        model = toy_model()
        model.layers.add_module("1", module())
        return model

    return factory


def test_weights_used_twice_or_tied_stay_exact():
    for module in (_Shared, _Tied):
        recipe = load_recipe(with_layer_1(module))
        split_matches_full(recipe, [(0, 1), (1, 4), (4, TOY_LAYERS)])


def test_a_tied_weight_is_computed_in_i():
    recipe = load_recipe(with_layer_1(_Tied))
    assert recipe.layers[2] == "layers.1"
    batch = batch_of(recipe, 1, 0)
    x = as_leaves(stage_of(recipe, 0, 2, 0)(*batch.inputs[0]))
    stage = stage_compute(recipe, 2, 3, 0, 1)
    out, _ = stage.forward(0, x, None)
    stage.backward_input(0, [torch.ones_like(t) for t in out if t.is_floating_point()])
    tied = stage.module.part.layers.get_submodule("1")
    assert tied.lin.weight.grad is not None and tied.lin.bias.grad is not None
