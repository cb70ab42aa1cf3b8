"""One stage's compute in one process: split backward (I then W) must equal full backward."""

import pytest
import torch
from executor_helpers import toy_model

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
