"""One stage's compute in one process: split backward (I then W) must equal full backward,
with W doing only the deferred layers' weight gradients, and tied weights left to I."""

import pytest
import torch
from executor_helpers import TOY_LAYERS, layer_count, toy_model

from octopipe.models import build_model, bundled_models
from octopipe.runtime.stage import StageCompute, as_leaves


def full_model_grads(seed, batch, num_mb):
    model = toy_model(seed)
    for m in range(num_mb):
        (model.loss(model(*batch.inputs[m]), batch.targets[m]) / num_mb).backward()
    return {k: p.grad.clone() for k, p in model.named_parameters()}


@pytest.mark.parametrize("kinds", [("B", "B"), ("IW", "IW"), ("IW", "B"), ("B", "IW")])
def test_two_stages_in_one_process_match_plain_autograd(kinds):
    num_mb, seed = 3, 5
    model = toy_model(seed)
    batch = model.make_batch(num_mb, seed)
    first = StageCompute(model, 0, 4, is_last=False, loss_scale=num_mb)
    last = StageCompute(model, 4, len(model.layer_names), is_last=True, loss_scale=num_mb)
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
    want = full_model_grads(seed, batch, num_mb)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, want[name], rtol=1e-5, atol=1e-7, msg=name)


def test_input_gradients_cover_every_float_stream_and_skip_integers():
    model = toy_model(0)
    batch = model.make_batch(1, 0)
    first = StageCompute(model, 0, 3, is_last=False, loss_scale=1)
    mid = StageCompute(model, 3, 5, is_last=False, loss_scale=1)
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


def split_matches_full(model_factory, spans, num_mb=2, seed=3):
    """Run the stages with split backward (W after every I) and compare with plain autograd."""
    model = model_factory(seed)
    batch = model.make_batch(num_mb, seed)
    stages = [
        StageCompute(model, a, b, is_last=(b == len(model.layer_names)), loss_scale=num_mb)
        for a, b in spans
    ]
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
    reference = model_factory(seed)
    for m in range(num_mb):
        (reference.loss(reference(*batch.inputs[m]), batch.targets[m]) / num_mb).backward()
    want = dict(reference.named_parameters())
    for name, p in model.named_parameters():
        assert (p.grad is None) == (want[name].grad is None), name
        if p.grad is not None:
            torch.testing.assert_close(p.grad, want[name].grad, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize(
    "name",
    [m if m == "tiny-llama" else pytest.param(m, marks=pytest.mark.slow) for m in bundled_models()],
)
def test_split_backward_matches_plain_autograd_on_every_bundled_model(name):
    layers = layer_count(name)
    cut = layers // 2
    split_matches_full(lambda seed: build_model(name, seed), [(0, cut), (cut, layers)])


def test_input_backward_leaves_exactly_the_linear_and_embedding_weights_to_w():
    model = build_model("tiny-llama", 0)
    last = len(model.layer_names)
    stage = StageCompute(model, 0, last, is_last=True, loss_scale=1)
    batch = model.make_batch(1, 0)
    stage.forward(0, batch.inputs[0], batch.targets[0])
    stage.backward_input(0, None)
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


def test_weights_used_twice_or_tied_stay_exact():
    for module in (_Shared, _Tied):

        def with_module(seed, module=module):
            model = toy_model(seed)
            model.layers.add_module("1", module())
            return model

        split_matches_full(with_module, [(0, 1), (1, 4), (4, TOY_LAYERS)])


def test_a_tied_weight_is_computed_in_i():
    model = toy_model(0)
    model.layers.add_module("1", _Tied())
    assert model.layer_names[2] == "layers.1"
    stage = StageCompute(model, 2, 3, is_last=False, loss_scale=1)
    batch = model.make_batch(1, 0)
    x = as_leaves(model.forward_layers(0, 2, batch.inputs[0]))
    out, _ = stage.forward(0, x, None)
    stage.backward_input(0, [torch.ones_like(t) for t in out if t.is_floating_point()])
    tied = model.layers.get_submodule("1")
    assert tied.lin.weight.grad is not None and tied.lin.bias.grad is not None
