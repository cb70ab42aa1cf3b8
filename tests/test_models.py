"""The bundled real torch models: contract with layer_specs, training, splitting, seeding."""

from __future__ import annotations

import pytest
import torch

from octopipe.costmodel.arch import layer_specs
from octopipe.costmodel.hf_config import load_architecture
from octopipe.models import bundled_models
from octopipe.models.mamba import ssd_scan
from octopipe.runtime.data.batches import SyntheticData, replica_batch
from octopipe.runtime.model.bundled import build_model
from octopipe.runtime.model.load import load_recipe

# The fast subset runs each per-model test on tiny-llama; the other families in the full suite.
MODELS = [
    name if name == "tiny-llama" else pytest.param(name, marks=pytest.mark.slow)
    for name in bundled_models()
]
REQUIRED = {"tiny-llama", "tiny-gemma", "tiny-moe", "tiny-hybrid", "tiny-vlm"}


def make_batch(name, num_mb=1, seed=0, step=0, seq_len=32, rows=2):
    """`num_mb` microbatches of `rows` sequences of the model's synthetic data."""
    data = SyntheticData(load_recipe(name).synthetic_sequence, seq_len, seed)
    return replica_batch(data.global_batch(step, num_mb * rows), 0, num_mb, rows)


def test_required_families_are_bundled():
    assert REQUIRED <= set(bundled_models())


@pytest.mark.parametrize("name", bundled_models())
def test_layers_match_layer_specs(name):
    model = build_model(name)
    specs = layer_specs(load_architecture(name))
    assert model.pipeline_layers == [s.name for s in specs]
    assert model.layer_kinds == [s.kind for s in specs]


@pytest.mark.parametrize("name", MODELS)
def test_forward_backward_gives_finite_loss_and_gradients(name):
    model = build_model(name)
    batch = make_batch(name)
    loss = model.loss(model(*batch.inputs[0]), batch.targets[0])
    loss.backward()
    assert torch.isfinite(loss)
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    # Every layer learns something: no part of the model is cut off from the loss.
    for i in range(len(model.pipeline_layers)):
        layer_grads = [p.grad.abs().sum() for p in model.layer(i).parameters()]
        assert sum(layer_grads) > 0, model.pipeline_layers[i]


@pytest.mark.parametrize("name", MODELS)
def test_forward_over_a_split_equals_the_whole_forward(name):
    model = build_model(name)
    x = make_batch(name, seed=3).inputs[0]
    whole = model(*x)
    n = len(model.pipeline_layers)
    for cut in (1, n // 2, n - 1):
        split = model.forward_layers(cut, n, model.forward_layers(0, cut, x))
        assert len(split) == len(whole)
        torch.testing.assert_close(split[0], whole[0], rtol=0, atol=0)


@pytest.mark.parametrize("name", MODELS)
def test_a_subset_of_layers_has_the_full_models_weights(name):
    recipe = load_recipe(name)
    full = build_model(name, seed=7)
    n = len(recipe.layers)
    subset = [recipe.layers[i] for i in (0, n // 2, n - 1)]
    part = recipe.stage(subset, torch.device("cpu"), 7).part
    want = full.state_dict()
    got = part.state_dict()
    assert got and set(got) <= set(want)
    assert {k.rsplit(".", 2)[0] for k in got} != {k.rsplit(".", 2)[0] for k in want}
    for key, value in got.items():
        assert torch.equal(value, want[key]), key
    for i, fqn in enumerate(recipe.layers):
        if fqn not in subset:
            with pytest.raises(LookupError):
                part.layer(i)
    assert sum(p.numel() for p in part.parameters()) < sum(p.numel() for p in full.parameters())


def test_weights_depend_on_the_seed_and_nothing_else():
    a, b, c = (
        build_model("tiny-llama", seed=1),
        build_model("tiny-llama", seed=1),
        build_model("tiny-llama", seed=2),
    )
    torch.manual_seed(12345)  # the global generator must not matter
    d = build_model("tiny-llama", seed=1)
    wa, wb, wc, wd = (m.state_dict()["layers.0.mixer.wq.weight"] for m in (a, b, c, d))
    assert torch.equal(wa, wb) and torch.equal(wa, wd)
    assert not torch.equal(wa, wc)


def test_layers_of_one_model_get_different_weights():
    model = build_model("tiny-llama")
    w0 = model.layer(1).mixer.wq.weight
    w1 = model.layer(2).mixer.wq.weight
    assert not torch.equal(w0, w1)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-vlm"])
def test_synthetic_batches_are_deterministic_in_seed_and_step(name):
    def batch(step):
        return make_batch(name, 2, seed=5, step=step, seq_len=16, rows=3)

    first, again, other = batch(1), batch(1), batch(2)
    assert len(first.inputs) == 2 and len(first.targets) == 2
    for x, y in zip(first.inputs, again.inputs):
        assert all(torch.equal(a, b) for a, b in zip(x, y))
    assert not torch.equal(first.inputs[0][0], other.inputs[0][0])
    tokens, target = first.inputs[0][0], first.targets[0]
    assert tokens.shape == target.shape == (3, 16)
    assert torch.equal(tokens[:, 1:], target[:, :-1])  # targets are the next tokens


def test_vlm_activations_carry_image_features_to_the_text_stack():
    model = build_model("tiny-vlm")
    x = make_batch("tiny-vlm").inputs[0]
    assert len(x) == 2 and x[1].dim() == 5  # token ids and pixels [batch, tiles, C, H, W]
    embed = model.pipeline_layers.index("tok_embeddings")
    streams = model.forward_layers(0, embed + 1, x)
    assert [t.shape[-1] for t in streams] == [64, 64]  # hidden states, image features
    assert streams[1].shape[1] == model.arch.vision.num_tokens  # as the cost model counts them
    last_cross = model.pipeline_layers.index(f"layers.{max(model.arch.cross_attention_layers)}")
    assert len(model.forward_layers(0, last_cross, x)) == 2
    assert len(model.forward_layers(0, last_cross + 1, x)) == 1  # no one reads the image after
    # The image changes the text's output through the cross-attention layers.
    other = (x[0], torch.randn_like(x[1]))
    assert not torch.allclose(model(*x)[0], model(*other)[0])


def test_sliding_window_limits_what_a_token_sees():
    model = build_model("tiny-gemma")
    arch = model.arch
    assert arch.layer_windows[0] == 8 and arch.layer_windows[1] is None
    attn = model.layer(1).mixer  # layers.0: sliding
    h = torch.randn(1, 20, arch.hidden_size)
    changed = h.clone()
    changed[:, 0] += 1.0
    # The last position is more than 8 tokens after position 0: unaffected.
    torch.testing.assert_close(attn(h)[:, -1], attn(changed)[:, -1])
    assert not torch.allclose(attn(h)[:, 5], attn(changed)[:, 5])


def test_moe_routes_each_token_to_top_k_experts():
    model = build_model("tiny-moe")
    moe = model.layer(2).ffn  # layers.1 (layers.0 is dense: mlp_only_layers)
    assert model.layer_kinds[1:3] == ["decoder", "moe"]
    calls = []
    for e, expert in enumerate(moe.experts):
        expert.register_forward_hook(lambda mod, inp, out, e=e: calls.append(inp[0].shape[0]))
    moe(torch.randn(2, 5, 64))
    assert sum(calls) == 2 * 5 * moe.top_k


def test_ssd_scan_equals_the_recurrence():
    gen = torch.Generator().manual_seed(0)
    batch, seq, heads, head_dim, state = 2, 7, 3, 4, 5
    x = torch.randn(batch, seq, heads, head_dim, generator=gen)
    dt = torch.rand(batch, seq, heads, generator=gen) + 0.1
    a = -torch.rand(heads, generator=gen) - 0.5
    b = torch.randn(batch, seq, heads, state, generator=gen)
    c = torch.randn(batch, seq, heads, state, generator=gen)
    h = torch.zeros(batch, heads, head_dim, state)
    expected = []
    for t in range(seq):
        decay = torch.exp(dt[:, t] * a)[..., None, None]
        h = decay * h + (dt[:, t, :, None, None] * x[:, t, :, :, None] * b[:, t, :, None, :])
        expected.append(torch.einsum("bhpn,bhn->bhp", h, c[:, t]))
    torch.testing.assert_close(ssd_scan(x, dt, a, b, c), torch.stack(expected, 1))


def test_mamba_mixer_is_causal():
    model = build_model("tiny-hybrid")
    mixer = model.layer(1).mixer  # layers.0 is 'M'
    assert model.layer_kinds[1] == "mamba"
    h = torch.randn(1, 12, 64)
    changed = h.clone()
    changed[:, 6:] += 1.0
    torch.testing.assert_close(mixer(h)[:, :6], mixer(changed)[:, :6])


def test_unknown_layer_name_is_refused():
    with pytest.raises(ValueError, match="not layers of the model"):
        load_recipe("tiny-llama").stage(["tok_embeddings", "layers.99"], torch.device("cpu"), 0)


@pytest.mark.parametrize("name", MODELS)
def test_a_few_adam_steps_lower_the_loss(name):
    model = build_model(name)
    # Tokens the model saw: tiny-gemma's 8192-word vocabulary is mostly unseen after 15 steps.
    seen = make_batch(name, seq_len=16)

    def loss() -> float:
        with torch.no_grad():
            return model.loss(model(*seen.inputs[0]), seen.targets[0]).item()

    before = loss()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(15):
        batch = make_batch(name, seq_len=16, step=step)
        opt.zero_grad()
        model.loss(model(*batch.inputs[0]), batch.targets[0]).backward()
        opt.step()
    assert loss() < before - 0.3


@pytest.mark.parametrize("name", bundled_models())
def test_parameters_and_boundaries_agree_with_the_cost_model(name):
    """The real model has the shapes the analytic cost model assumes for the same config:
    per layer the same parameter count and, in fp32, the same bytes crossing each boundary."""
    from octopipe.costmodel.layercost import boundary_bytes, layer_work
    from octopipe.costmodel.settings import Settings

    model = build_model(name)
    arch, specs = model.arch, layer_specs(model.arch)
    settings = Settings(seq_len=16, micro_batch_size=2, activation_bytes=4)
    x = make_batch(name, seq_len=16).inputs[0]
    for i, spec in enumerate(specs):
        n_params = sum(p.numel() for p in model.layer(i).parameters())
        assert n_params == layer_work(arch, spec, settings).params, spec.name
        if spec.kind == "head":
            break  # its output is the loss, not an activation
        x = model.forward_layers(i, i + 1, x)
        sent = sum(t.numel() * t.element_size() for t in x)
        assert sent == boundary_bytes(arch, specs, i, settings), spec.name


@pytest.mark.parametrize("name", bundled_models())
def test_parameter_count_without_building(name):
    from octopipe.models.build import parameter_count

    model = build_model(name)
    assert parameter_count(model.arch) == sum(p.numel() for p in model.parameters())
