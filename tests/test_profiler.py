"""The measuring profiler: a valid profile, sane measurements, and an I/W split that adds up."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from octopipe.cli import main
from octopipe.profile import LayerCost, Profile, load_profile, save_profile
from octopipe.runtime.data.batches import SyntheticData, replica_batch
from octopipe.runtime.measure.profiler import (
    as_layer_inputs,
    measure_memory,
    median_profile,
    profile_model,
    run_layer,
)
from octopipe.runtime.model.bundled import build_model
from octopipe.runtime.model.load import load_recipe
from octopipe.runtime.model.weightgrad import WeightGradTape, backward_input

pytestmark = pytest.mark.slow  # real process groups: the full suite, not `-m "not slow"`


def sample(name, seed=0, seq_len=16, rows=2):
    """One microbatch of the model's synthetic data, as the profiler draws it."""
    data = SyntheticData(load_recipe(name).synthetic_sequence, seq_len, seed)
    batch = replica_batch(data.global_batch(0, rows), 0, 1, rows)
    return batch.inputs[0], batch.targets[0]


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-vlm", "tiny-moe", "tiny-hybrid"])
def test_profile_has_every_layer_with_positive_times(name, tmp_path):
    recipe = load_recipe(name)
    profile = profile_model(recipe, warmup=0, repeats=1, seq_len=16)
    assert [layer.name for layer in profile.layers] == list(recipe.layers)
    assert [layer.kind for layer in profile.layers] == list(recipe.kinds)
    for layer in profile.layers:
        assert layer.f > 0 and layer.b > 0 and layer.w > 0, layer.name
        assert 0 <= layer.wact_bytes <= layer.act_bytes
        assert layer.act_bytes > 0 and layer.out_bytes > 0
    path = tmp_path / "profile.json"
    save_profile(profile, path)
    assert load_profile(path) == profile


def test_sizes_match_the_tensors():
    model = build_model("tiny-vlm")
    profile = profile_model(
        load_recipe("tiny-vlm"), warmup=0, repeats=1, seq_len=16, micro_batch_size=3
    )
    x, _ = sample("tiny-vlm", rows=3)
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
    # static memory, not activation. W holds x and the output's gradient (4x16 floats), more
    # than F saved: the format caps wact_bytes at act_bytes.
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


class _Wide(nn.Module):
    """A linear layer behind an elementwise op that saves more than W will need."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(10, 2, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(torch.exp(x) * x)


def test_saved_tensors_are_counted_once_and_split_between_i_and_w():
    x = (torch.randn(10, 10),)
    square = measure_memory(_Square(), x, None, True)
    assert square.act_bytes == 400 and square.wact_bytes == 0  # no weights: nothing for W
    scaled = measure_memory(_ScaledTanh(), x, None, True)
    # tanh keeps its output; the product keeps it too, for the scale's gradient, and the scale
    # (a parameter: not counted). Only linear and embedding weights wait for W.
    assert scaled.act_bytes == 400 and scaled.wact_bytes == 0
    wide = measure_memory(_Wide(), x, None, True)
    # exp's output and x (for the product), and the product (for the linear): 3 x 400 bytes.
    # W keeps the product (an input saved from F) and the output's gradient (10x2 floats).
    assert wide.act_bytes == 1200 and wide.wact_bytes == 400 and wide.wgrad_bytes == 80


def _split_backward_grads(model, x, target):
    """Per layer: forward on cut inputs, then I from the last layer to the first, then every W;
    the layers' gradients as the profiler's split leaves them."""
    model.zero_grad(set_to_none=True)
    n = len(model.pipeline_layers)
    tapes = [WeightGradTape([model.layer(i)]) for i in range(n)]
    records = []
    for i in range(n):
        inputs = as_layer_inputs(x, needs_grad=i > 0)
        loss_fn = (lambda out: model.loss(out, target)) if i == n - 1 else None
        with tapes[i].recording() as calls:
            outputs = run_layer(model.layer(i), inputs, loss_fn)
        records.append((inputs, outputs, calls))
        x = outputs
    grads_of_outputs = [torch.ones(())]
    pending = []
    for i in reversed(range(n)):
        inputs, outputs, calls = records[i]
        roots, seeds = [], []
        for out, grad in zip(outputs, grads_of_outputs):
            if out.requires_grad:
                roots.append(out)
                seeds.append(grad if grad is not None else torch.zeros_like(out))
        wanted = [t for t in inputs if t.requires_grad]
        params = [p for p in model.layer(i).parameters() if not tapes[i].defers(p)]
        from_i, w = backward_input(roots, seeds, wanted, calls, params)
        from_i = iter(from_i)
        grads_of_outputs = [next(from_i) if t.requires_grad else None for t in inputs]
        pending.append(w)
    for w in pending:
        w.run()
    for tape in tapes:
        tape.remove()
    return {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-vlm", "tiny-moe", "tiny-hybrid"])
def test_i_and_w_give_the_full_backwards_gradients(name):
    model = build_model(name, seed=3)
    x, target = sample(name, seed=1)
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
    assert profile.num_layers == len(load_recipe("tiny-llama").layers)
    assert profile.name == "tiny-llama-cpu-s8-mb1"


def test_profile_on_two_processes_measures_the_link(tmp_path, capsys):
    out = tmp_path / "p.json"
    argv = ["profile", "--model", "tiny-llama", "--seq-len", "8", "--micro-batch-size", "1"]
    assert main(argv + ["--repeats", "1", "--warmup", "0", "--nproc", "2", "-o", str(out)]) == 0
    profile = load_profile(out)
    assert profile.name == "tiny-llama-cpu-s8-mb1-x2"
    assert profile.num_layers == len(load_recipe("tiny-llama").layers)
    assert 0 < profile.link.latency < 1.0  # a loopback round trip, not the default of 0
    assert "link" in capsys.readouterr().out


def test_median_profile_takes_each_figure_from_the_middle_rank():
    def measured(scale):
        layers = [
            LayerCost(
                name="a",
                f=scale,
                b=2.0,
                w=3.0 / scale,
                act_bytes=8,
                wact_bytes=0,
                param_bytes=0,
                out_bytes=4,
            )
        ]
        return Profile(name="p", layers=tuple(layers))

    layer = median_profile([measured(1.0), measured(3.0), measured(2.0)]).layers[0]
    assert (layer.f, layer.b, layer.w) == (2.0, 2.0, 1.5)
    assert layer.act_bytes == 8


def test_profile_command_refuses_bad_input(tmp_path, capsys):
    out = str(tmp_path / "p.json")
    assert main(["profile", "--model", "no-such-model", "-o", out]) == 2
    assert "no-such-model" in capsys.readouterr().err
    assert main(["profile", "--model", "tiny-llama", "--repeats", "0", "-o", out]) == 2
    assert "--repeats" in capsys.readouterr().err
    assert main(["profile", "--model", "tiny-llama", "--nproc", "0", "-o", out]) == 2
    assert "--nproc" in capsys.readouterr().err
    # 70B parameters would need 280 GB just for fp32 weights: refused before anything is built.
    assert main(["profile", "--model", "llama3-70b", "-o", out]) == 2
    assert "GiB of fp32 weights" in capsys.readouterr().err


def test_models_command_lists_bundled_models(capsys):
    assert main(["models"]) == 0
    listed = capsys.readouterr().out.split()
    assert {"tiny-llama", "tiny-gemma", "tiny-moe", "tiny-hybrid", "tiny-vlm"} <= set(listed)
