"""The measuring profiler: a valid profile, sane measurements, and an I/W split that adds up."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from octopipe.cli import main
from octopipe.models import build_model
from octopipe.profile import load_profile, save_profile
from octopipe.runtime.profiler import (
    as_layer_inputs,
    input_grads,
    measure_memory,
    profile_model,
    run_layer,
    weight_grads,
)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-vlm", "tiny-moe", "tiny-hybrid"])
def test_profile_has_every_layer_with_positive_times(name, tmp_path):
    model = build_model(name, seq_len=16)
    profile = profile_model(model, warmup=0, repeats=1)
    assert [layer.name for layer in profile.layers] == model.layer_names
    assert [layer.kind for layer in profile.layers] == model.layer_kinds
    for i, layer in enumerate(profile.layers):
        assert layer.f > 0 and layer.w > 0, layer.name  # every bundled layer has weights
        assert (layer.b > 0) == (i > 0), layer.name  # the first layer is fed data only
        assert 0 <= layer.wact_bytes <= layer.act_bytes
        assert layer.act_bytes > 0 and layer.out_bytes > 0
    path = tmp_path / "profile.json"
    save_profile(profile, path)
    assert load_profile(path) == profile


def test_sizes_match_the_tensors():
    model = build_model("tiny-vlm", seq_len=16, micro_batch_size=3)
    profile = profile_model(model, warmup=0, repeats=1)
    x = model.make_batch(1, seed=0).inputs[0]
    for i, layer in enumerate(profile.layers):
        n_params = sum(p.numel() for p in model.layer(i).parameters())
        assert layer.param_bytes == 4 * 4 * n_params  # fp32 weight, grad and two Adam moments
        x = model.forward_layers(i, i + 1, x)
        if i == len(profile.layers) - 1:
            assert layer.out_bytes == 4  # the loss, not the logits: nothing is sent on
        else:
            assert layer.out_bytes == sum(t.numel() * t.element_size() for t in x)


def test_memory_of_a_linear_layer():
    # Autograd keeps the input (x, 4x8 floats) for the weight gradient; the weight itself is
    # static memory, not activation.
    memory = measure_memory(nn.Linear(8, 16), (torch.randn(4, 8),), None, True)
    assert memory.act_bytes == 4 * 8 * 4
    assert memory.wact_bytes == 4 * 8 * 4
    assert memory.param_bytes == 4 * (8 * 16 + 16) * 4
    assert memory.out_bytes == 4 * 16 * 4


class _Square(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * x  # saves x twice: one storage


class _ScaledTanh(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x) * self.scale


def test_saved_tensors_are_counted_once_and_split_between_i_and_w():
    x = (torch.randn(10, 10),)
    square = measure_memory(_Square(), x, None, True)
    assert square.act_bytes == 400 and square.wact_bytes == 0  # no weights: nothing for W
    scaled = measure_memory(_ScaledTanh(), x, None, True)
    # tanh keeps its output for I; the product keeps tanh's output for the scale's gradient
    # (W) and the scale for the input's (a parameter: not counted).
    assert scaled.act_bytes == 400 and scaled.wact_bytes == 400


def _split_backward_grads(model, x, target):
    """Per layer: forward on cut inputs, then I and W from the last layer to the first."""
    n = len(model.layer_names)
    records = []
    for i in range(n):
        inputs = as_layer_inputs(x, needs_grad=i > 0)
        loss_fn = (lambda out: model.loss(out, target)) if i == n - 1 else None
        outputs = run_layer(model.layer(i), inputs, loss_fn)
        records.append((inputs, outputs))
        x = outputs
    grads_of_outputs = [torch.ones(())]
    param_grads: dict[str, torch.Tensor] = {}
    for i in reversed(range(n)):
        inputs, outputs = records[i]
        roots, seeds = [], []
        for out, grad in zip(outputs, grads_of_outputs):
            if out.requires_grad:
                roots.append(out)
                seeds.append(grad if grad is not None else torch.zeros_like(out))
        layer = model.layer(i)
        names, params = zip(*layer.named_parameters())
        from_i = iter(input_grads(roots, seeds, inputs))
        grads_of_outputs = [next(from_i) if t.requires_grad else None for t in inputs]
        for pname, grad in zip(names, weight_grads(roots, seeds, params)):
            param_grads[f"{model.layer_names[i]}.{pname}"] = grad
    return param_grads


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-vlm", "tiny-moe", "tiny-hybrid"])
def test_i_and_w_give_the_full_backwards_gradients(name):
    model = build_model(name, seed=3, seq_len=16)
    batch = model.make_batch(1, seed=1)
    x, target = batch.inputs[0], batch.targets[0]
    model.loss(model(*x), target).backward()
    full = {n: p.grad for n, p in model.named_parameters()}
    split = _split_backward_grads(model, x, target)
    assert split.keys() == full.keys()
    for pname, want in full.items():
        got = split[pname]
        if want is None:  # an expert no token was routed to
            assert got is None, pname
            continue
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7, msg=pname)


def test_profile_command_writes_a_loadable_profile(tmp_path, capsys):
    out = tmp_path / "p.json"
    argv = ["profile", "--model", "tiny-llama", "--seq-len", "8", "--micro-batch-size", "1"]
    assert main(argv + ["--repeats", "1", "--warmup", "0", "-o", str(out)]) == 0
    profile = load_profile(out)
    assert profile.num_layers == len(build_model("tiny-llama").layer_names)
    assert profile.name == "tiny-llama-cpu-s8-mb1"


def test_profile_command_refuses_bad_input(tmp_path, capsys):
    out = str(tmp_path / "p.json")
    assert main(["profile", "--model", "no-such-model", "-o", out]) == 2
    assert "no-such-model" in capsys.readouterr().err
    assert main(["profile", "--model", "tiny-llama", "--repeats", "0", "-o", out]) == 2
    assert "--repeats" in capsys.readouterr().err
    # 70B parameters would need 280 GB just for fp32 weights: refused before anything is built.
    assert main(["profile", "--model", "llama3-70b", "-o", out]) == 2
    assert "GiB of fp32 weights" in capsys.readouterr().err


def test_models_command_lists_bundled_models(capsys):
    assert main(["models"]) == 0
    listed = capsys.readouterr().out.split()
    assert {"tiny-llama", "tiny-gemma", "tiny-moe", "tiny-hybrid", "tiny-vlm"} <= set(listed)
