"""One stage's compute in one process: split backward (I then W) must equal full backward,
with W entering the graph at the weight branches where it can, and falling back where not."""

import pytest
import torch
from executor_helpers import TOY_LAYERS, layer_count, toy_model

from octopipe.models import build_model, bundled_models
from octopipe.runtime.stage import StageCompute, as_leaves
from octopipe.runtime.weightgrad import plan_deferral


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
    """Applies one weight twice, so the weight sits both on a branch and down the input path."""

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


@pytest.mark.parametrize("name", bundled_models())
def test_split_backward_matches_plain_autograd_on_every_bundled_model(name):
    layers = layer_count(name)
    cut = layers // 2
    split_matches_full(lambda seed: build_model(name, seed), [(0, cut), (cut, layers)])


def test_weight_gradients_skip_the_input_path_on_a_real_model():
    model = build_model("tiny-llama", 0)
    batch = model.make_batch(1, 0)
    x = as_leaves(model.forward_layers(0, 1, batch.inputs[0]))
    outputs = model.forward_layers(1, 3, x)
    params = [p for i in (1, 2) for p in model.layer(i).parameters()]
    deferral = plan_deferral(list(outputs), [torch.ones_like(outputs[0])], [x[0]], params)
    assert deferral is not None


def test_a_weight_used_twice_in_a_stage_falls_back_and_stays_exact():
    def shared(seed):
        model = toy_model(seed)
        model.layers.add_module("1", _Shared())
        return model

    model = shared(0)
    batch = model.make_batch(1, 0)
    x = as_leaves(model.forward_layers(0, 1, batch.inputs[0]))
    out = model.forward_layers(1, 4, x)
    params = [p for i in (1, 2, 3) for p in model.layer(i).parameters()]
    floats = [t for t in out if t.requires_grad]
    assert plan_deferral(floats, [torch.ones_like(t) for t in floats], [x[0], x[1]], params) is None
    split_matches_full(shared, [(0, 1), (1, 4), (4, TOY_LAYERS)])
