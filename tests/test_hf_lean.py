"""`transformers` models run with lean norms and gated MLPs (`runtime/model/hf_lean.py`): the
loss and gradients of the models' own modules, for every family `hf:` runs, and a decoder
layer keeping no more than its profile prices."""

from __future__ import annotations

import pytest
import torch
from executor_helpers import batch_of
from model_zoo import FAMILIES, hf_family_models

import octopipe as op
from octopipe.runtime.model.load import load_recipe

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def hf_models(tmp_path_factory):
    return hf_family_models(tmp_path_factory.mktemp("hf_lean"))


def loss_and_grads(model, recipe, batch):
    model.zero_grad()
    loss = recipe.loss(model(*batch.inputs[0]), batch.targets[0])
    loss.backward()
    return loss.detach(), {k: p.grad.clone() for k, p in model.named_parameters()}


def eager(module: torch.nn.Module) -> None:
    """The modules' own forwards back (the class's, not the instance's lean one)."""
    for m in module.modules():
        m.__dict__.pop("forward", None)


@pytest.mark.parametrize("family", FAMILIES)
def test_lean_modules_train_as_the_models_own(hf_models, family):
    recipe = load_recipe(hf_models[family])
    model = recipe.whole(torch.device("cpu"), seed=1)
    lean = [m for m in model.modules() if "forward" in m.__dict__]
    assert any(type(m).__name__.endswith("RMSNorm") for m in lean)
    batch = batch_of(recipe, 1, seed=0)
    got_loss, got = loss_and_grads(model, recipe, batch)
    eager(model)
    want_loss, want = loss_and_grads(model, recipe, batch)
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-6, atol=1e-6)
    for fqn, grad in got.items():
        torch.testing.assert_close(grad, want[fqn], rtol=1e-5, atol=1e-6, msg=fqn)


def test_a_llama_decoder_layer_keeps_what_its_profile_prices(hf_models):
    seq, mbs = 64, 2
    path = hf_models["llama"]
    recipe = load_recipe(path)
    stage = recipe.whole(torch.device("cpu"), 0).to(torch.bfloat16)
    own = {t.untyped_storage().data_ptr() for t in stage.parameters()}
    kept: dict[int, int] = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in own:
            kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    tokens = torch.randint(0, 64, (mbs, seq))
    part = stage.part
    hidden = part.model.embed_tokens(tokens).detach().requires_grad_(True)
    positions = torch.arange(seq)[None].expand(mbs, -1)
    rotary = part.model.rotary_emb(hidden, positions)
    layer = part.model.layers[1]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(hidden, position_embeddings=rotary, attention_mask=None, position_ids=positions)
    rope_tables = sum(t.nbytes for t in rotary)  # shared by every layer of a stage
    priced = op.profile_from_config(
        path.removeprefix("hf:"), layer_names="hf", seq_len=seq, micro_batch_size=mbs
    ).layers[2]
    assert sum(kept.values()) - rope_tables == pytest.approx(priced.act_bytes, rel=0.01)
