"""The split backward's tape (`runtime/model/weightgrad.py`) against plain autograd, on the module
shapes that could fool it: reparametrized weights, aliasing gradients, hooks, keyword inputs,
inputs changed in place, and what it keeps alive."""

import gc
import weakref

import pytest
import torch
from torch import nn

from octopipe.runtime.model.weightgrad import WeightGradTape, backward_input


def split_grads(module: nn.Module, inputs: list[torch.Tensor], call=None) -> dict:
    """Every microbatch's F and I, then every W, through the tape; the parameters' gradients."""
    call = call or (lambda m, x: m(x))
    tape = WeightGradTape([module])
    params = [p for p in module.parameters() if p.requires_grad and not tape.defers(p)]
    pending = []
    for x in inputs:
        x = x.detach().requires_grad_()
        with tape.recording() as calls:
            loss = call(module, x).square().sum()
        _, w = backward_input([loss], [None], [x], calls, params)
        pending.append(w)
    for w in pending:
        w.run()
    tape.remove()
    return {name: p.grad for name, p in module.named_parameters()}


def plain_grads(module: nn.Module, inputs: list[torch.Tensor], call=None) -> dict:
    call = call or (lambda m, x: m(x))
    for x in inputs:
        call(module, x.detach().requires_grad_()).square().sum().backward()
    return {name: p.grad for name, p in module.named_parameters()}


def assert_split_matches_plain(make, inputs, call=None) -> dict:
    """`make()` builds the module afresh (seeded), once for each way."""
    torch.manual_seed(0)
    want = plain_grads(make(), inputs, call)
    torch.manual_seed(0)
    got = split_grads(make(), inputs, call)
    assert got.keys() == want.keys()
    for name, grad in want.items():
        assert grad is not None and got[name] is not None, name
        torch.testing.assert_close(got[name], grad, rtol=1e-5, atol=1e-6, msg=name)
    return got


class _AddsParam(nn.Module):
    """`x + p` hands p's gradient over as the very tensor that reaches x; `x * q.sum()` hands
    over a broadcast view. `.grad` must own its memory all the same."""

    def __init__(self) -> None:
        super().__init__()
        self.p = nn.Parameter(torch.zeros(4, 6))
        self.q = nn.Parameter(torch.ones(6))
        self.lin = nn.Linear(6, 6)

    def forward(self, x):
        return self.lin(torch.tanh(x + self.p) * self.q.sum())


def test_gradients_that_autograd_hands_over_shared_are_copied():
    got = assert_split_matches_plain(_AddsParam, [torch.randn(4, 6) for _ in range(3)])
    assert got["q"].stride() == (1,)


def test_weight_grads_record_no_graph_and_free_what_they_held():
    torch.manual_seed(0)
    module = nn.Sequential(nn.LayerNorm(8), nn.Linear(8, 8))
    tape = WeightGradTape([module])
    x = torch.randn(5, 8, requires_grad=True)
    with tape.recording() as calls:
        loss = module(x).square().sum()
    params = [p for p in module.parameters() if not tape.defers(p)]
    _, pending = backward_input([loss], [None], [x], calls, params)
    alive = weakref.ref(x)
    del x, loss, calls
    gc.collect()
    assert alive() is None  # I kept the layer's input (detached), not the stage input
    pending.run()
    assert all(p.grad is not None and p.grad.grad_fn is None for p in module.parameters())
    tape.remove()


@pytest.mark.filterwarnings("ignore:.*weight_norm.*:FutureWarning")
def test_old_style_weight_norm_is_left_to_autograd():
    def make():
        return nn.utils.weight_norm(nn.Linear(6, 3))

    module = make()
    assert not WeightGradTape([module]).defers(module.weight_v)
    assert_split_matches_plain(make, [torch.randn(4, 6) for _ in range(2)])


def test_a_hook_that_replaces_the_output_does_not_change_the_weight_gradient():
    def make():
        module = nn.Linear(6, 6)
        module.register_forward_hook(lambda m, args, out: out * 3.0)
        return module

    assert_split_matches_plain(make, [torch.randn(4, 6) for _ in range(2)])


def test_a_linear_called_with_a_keyword_input():
    assert_split_matches_plain(
        lambda: nn.Linear(6, 2), [torch.randn(3, 6)], call=lambda m, x: m(input=torch.tanh(x))
    )


def test_an_input_changed_in_place_before_w_is_refused():
    module = nn.Linear(6, 2)
    tape = WeightGradTape([module])
    x = torch.randn(3, 6)  # data: no gradient of its own, so autograd would not notice
    with tape.recording() as calls:
        loss = module(x).sum()
    _, pending = backward_input([loss], [None], [], calls, [])
    x.mul_(2)
    with pytest.raises(RuntimeError, match="modified in place"):
        pending.run()
