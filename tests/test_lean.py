"""The lean autograd functions (`octopipe.models.lean`): eager PyTorch's gradients, only the
tensors a fused kernel keeps, and a tiny-llama decoder layer keeping what its profile prices."""

import pytest
import torch
import torch.nn.functional as F

from octopipe import profile_from_config
from octopipe.models import lean
from octopipe.runtime.model.load import load_recipe

ACTIVATIONS = {
    "silu": F.silu,
    "gelu": F.gelu,
    "relu2": lambda x: F.relu(x).square(),
}


def saved_storages(fn, *args):
    """What autograd keeps for the backward of `fn(*args)`: storage pointer -> bytes."""
    kept = {}

    def pack(t):
        kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args)
    return out, kept


def eager_rms_norm(x, weight, eps, offset=0.0):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (weight + offset)


def eager_rope(x, theta, positions=None):
    seq, d = x.shape[-2], x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, dtype=x.dtype) / d)
    pos = torch.arange(seq) if positions is None else positions
    angles = torch.outer(pos.to(x.dtype), inv)
    angles = torch.cat([angles, angles], -1)
    first, second = x.chunk(2, -1)
    return x * angles.cos() + torch.cat([-second, first], -1) * angles.sin()


@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_rms_norm_has_eager_gradients(offset):
    torch.manual_seed(0)
    x = torch.randn(3, 5, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(8, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda x, w: lean.rms_norm(x, w, 1e-6, offset), (x, w))
    grad = torch.randn(3, 5, 8, dtype=torch.float64)
    got = torch.autograd.grad(lean.rms_norm(x, w, 1e-6, offset), (x, w), grad)
    want = torch.autograd.grad(eager_rms_norm(x, w, 1e-6, offset), (x, w), grad)
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e)


@pytest.mark.parametrize("act", sorted(ACTIVATIONS))
def test_gated_activation_has_eager_gradients(act):
    torch.manual_seed(0)
    fn = ACTIVATIONS[act]
    gate = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    up = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda g, u: lean.gated(g, u, fn), (gate, up))
    grad = torch.randn(4, 6, dtype=torch.float64)
    got = torch.autograd.grad(lean.gated(gate, up, fn), (gate, up), grad)
    want = torch.autograd.grad(fn(gate) * up, (gate, up), grad)
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e)


@pytest.mark.parametrize("given", [False, True])
def test_rope_has_eager_gradients(given):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 7, 8, dtype=torch.float64, requires_grad=True)
    positions = torch.tensor([5, 6, 7, 8, 9, 10, 11]) if given else None
    torch.autograd.gradcheck(lambda x: lean.rope(x, 10000.0, positions), (x,))
    torch.testing.assert_close(lean.rope(x, 10000.0, positions), eager_rope(x, 1e4, positions))


def test_each_function_keeps_only_what_a_fused_kernel_keeps():
    x = torch.randn(4, 16, 32, dtype=torch.bfloat16, requires_grad=True)
    w = torch.ones(32, dtype=torch.bfloat16, requires_grad=True)
    _, kept = saved_storages(lambda: lean.rms_norm(x, w, 1e-6))
    rows = 4 * 16
    stats = rows * 4  # 1/rms in float32
    assert sorted(kept.values()) == sorted([x.nbytes, w.nbytes, stats])
    gate, up = (torch.randn(64, 48, dtype=torch.bfloat16, requires_grad=True) for _ in "gu")
    _, kept = saved_storages(lambda: lean.gated(gate, up, F.silu))
    assert sorted(kept.values()) == [gate.nbytes, up.nbytes]
    _, kept = saved_storages(lambda: lean.rope(x.view(4, 16, 4, 8), 10000.0))
    assert kept == {}


def test_under_autocast_the_residual_stream_and_the_norms_answer_in_bfloat16():
    recipe = load_recipe("tiny-llama")
    stage = recipe.whole(torch.device("cpu"), 0)
    tokens = torch.randint(0, 256, (2, 16))
    with torch.autocast("cpu", torch.bfloat16):
        (stream,) = stage.part.get_submodule(recipe.layers[0])(tokens)
        normed = stage.part.get_submodule(recipe.layers[1]).mixer_norm(stream)
    assert stream.dtype == normed.dtype == torch.bfloat16
    (plain,) = stage.part.get_submodule(recipe.layers[0])(tokens)
    assert plain.dtype == torch.float32


@pytest.mark.parametrize("autocast", [False, True])
def test_a_decoder_layer_keeps_the_bytes_its_profile_prices(autocast):
    seq, mbs = 128, 2
    recipe = load_recipe("tiny-llama")
    stage = recipe.whole(torch.device("cpu"), 0)
    if not autocast:
        stage = stage.to(torch.bfloat16)
    layer = stage.part.get_submodule(recipe.layers[1])
    own = {t.untyped_storage().data_ptr() for t in stage.parameters()}
    stream = torch.randn(mbs, seq, layer.mixer_norm.weight.shape[0], dtype=torch.bfloat16)
    stream.requires_grad_(True)
    context = torch.autocast("cpu", torch.bfloat16, enabled=autocast)
    with context:
        _, kept = saved_storages(layer, stream)
    activations = sum(n for ptr, n in kept.items() if ptr not in own)
    # Under autocast the layer keeps BF16 copies of its FP32 weights too (not activations).
    if autocast:
        weights = sum(p.numel() * 2 for p in layer.parameters() if p.dim() == 2)
        activations -= weights
    profile = profile_from_config("tiny-llama", seq_len=seq, micro_batch_size=mbs)
    priced = profile.layers[1].act_bytes
    assert activations == pytest.approx(priced, rel=0.01)
