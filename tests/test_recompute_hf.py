"""Selective recomputation of Hugging Face `transformers` models (`runtime/model/hf_attention.py`):
the attention function each attention module calls is redone in the backward, and only it; the
gradients are those of no recomputation, in one process for every Llama-structured family and
on real gloo process groups (split backward, interleaving, TP, FSDP2) against single-process
training; the cost model offers selective exactly where the executor can run it."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
import torch
from executor_helpers import batch_of, greedy, recomputing_job, stage_of
from model_zoo import FAMILIES, hf_family_models, titan_style

import octopipe as op
from octopipe.actions import B, I
from octopipe.costmodel.hf_config import HF_RUNNABLE
from octopipe.errors import InputError
from octopipe.runtime.launch.launcher import launch
from octopipe.runtime.model.hf_attention import route_attention
from octopipe.runtime.model.load import load_recipe
from octopipe.runtime.model.recompute import apply_recompute, check_recomputable, recomputed_modules
from octopipe.runtime.reference import mismatches, train_reference
from octopipe.runtime.step.stage import StageCompute, as_leaves

pytest.importorskip("transformers")


def test_the_families_tested_here_are_those_hf_runs():
    # HF_RUNNABLE is the one rule `hf:` and `profile-arch --layer-names hf` refuse by: a model
    # type joins it with a family here, which holds its recomputation and its layer names.
    assert set(FAMILIES) == set(HF_RUNNABLE)


CUT = 3  # stage 0: the embedding and layers 0, 1; stage 1: layer 2, the norm and the head


@pytest.fixture(scope="module")
def hf_models(tmp_path_factory):
    return hf_family_models(tmp_path_factory.mktemp("hf"))


def stage(recipe, start, end, kind, num_mb):
    module = stage_of(recipe, start, end, seed=3)
    apply_recompute(module, recipe.layers[start:end], recipe.kinds[start:end], kind)
    return StageCompute(module, end == len(recipe.layers), recipe.loss, num_mb)


def train_two_stages(model, kinds, backward, num_mb=2):
    """Stages [0, CUT) and [CUT, end), recomputing `kinds`, every F then every backward (B, or
    I then W, W deferred past every I): the gradients by FQN."""
    recipe = load_recipe(model)
    first = stage(recipe, 0, CUT, kinds[0], num_mb)
    last = stage(recipe, CUT, len(recipe.layers), kinds[1], num_mb)
    batch = batch_of(recipe, num_mb, seed=3)
    for m in range(num_mb):
        out, _ = first.forward(m, batch.inputs[m], None)
        last.forward(m, as_leaves(out), batch.targets[m])
    for m in range(num_mb):
        if backward == B:
            first.backward(m, last.backward(m, None))
        else:
            first.backward_input(m, last.backward_input(m, None))
    if backward == I:
        for m in range(num_mb):
            last.backward_weight(m)
            first.backward_weight(m)
    return {k: p.grad for st in (first, last) for k, p in st.module.part.named_parameters()}


@pytest.mark.parametrize("backward", [B, I])
@pytest.mark.parametrize("family", FAMILIES)
def test_selective_stages_give_the_gradients_of_no_recomputation(hf_models, family, backward):
    want = train_two_stages(hf_models[family], ("none", "none"), backward)
    for kinds in (("selective", "selective"), ("selective", "full")):
        got = train_two_stages(hf_models[family], kinds, backward)
        assert set(got) == set(want)
        for fqn, grad in got.items():
            torch.testing.assert_close(grad, want[fqn], rtol=1e-5, atol=1e-7, msg=fqn)


@pytest.fixture
def counted(monkeypatch):
    """Per decoder layer: calls of the inner attention function (sdpa) and of q_proj."""
    from transformers import AttentionInterface

    sdpa = AttentionInterface._global_mapping["sdpa"]
    calls: Counter = Counter()

    def counting_sdpa(module, *args, **kwargs):
        calls["core", module.layer_idx] += 1
        return sdpa(module, *args, **kwargs)

    monkeypatch.setitem(AttentionInterface._global_mapping, "sdpa", counting_sdpa)
    return calls


@pytest.mark.parametrize("backward", [B, I])
@pytest.mark.parametrize(
    "kinds, core, projections",  # per decoder layer 0, 1 (stage 0) and 2 (stage 1)
    [
        (("none", "none"), (1, 1, 1), (1, 1, 1)),
        (("selective", "none"), (2, 2, 1), (1, 1, 1)),
        (("none", "selective"), (1, 1, 2), (1, 1, 1)),
        (("selective", "full"), (2, 2, 2), (1, 1, 2)),  # full redoes the whole layer
    ],
)
@pytest.mark.parametrize("family", ["llama", "qwen2_moe"])
def test_a_selective_stage_redoes_its_attention_cores_and_nothing_else(
    hf_models, counted, family, kinds, core, projections, backward
):
    recipe = load_recipe(hf_models[family])
    first = stage(recipe, 0, CUT, kinds[0], 1)
    last = stage(recipe, CUT, len(recipe.layers), kinds[1], 1)
    for st in (first, last):
        for name, module in st.module.part.named_modules():
            if name.endswith("self_attn.q_proj"):
                layer = int(name.split(".")[2])
                module.register_forward_hook(lambda *_, i=layer: counted.update([("q", i)]))
    batch = batch_of(recipe, 1, seed=0)
    out, _ = first.forward(0, batch.inputs[0], None)
    last.forward(0, as_leaves(out), batch.targets[0])
    if backward == B:
        first.backward(0, last.backward(0, None))
    else:
        first.backward_input(0, last.backward_input(0, None))
        last.backward_weight(0)
        first.backward_weight(0)
    assert tuple(counted["core", i] for i in range(3)) == core
    assert tuple(counted["q", i] for i in range(3)) == projections


def loss_and_grads(model, inputs, target, loss):
    model.zero_grad()
    value = loss(model(*inputs), target)
    value.backward()
    return value.detach(), {k: p.grad.clone() for k, p in model.named_parameters()}


@pytest.mark.parametrize("inner", ["sdpa", "eager"])
def test_the_routed_attention_computes_what_the_models_own_does(hf_models, inner):
    """Routed over sdpa or eager (each family's own eager function), recomputing or not: the
    loss and gradients of the model's own attention."""
    recipe = load_recipe(hf_models["qwen2_moe"])
    model = recipe.whole(torch.device("cpu"), seed=1)
    config = model.part.config
    assert config._attn_implementation == "octopipe_sdpa"
    batch = batch_of(recipe, 1, seed=0)
    args = (model, batch.inputs[0], batch.targets[0], recipe.loss)
    config._attn_implementation = inner
    want_loss, want = loss_and_grads(*args)
    route_attention(config)
    assert config._attn_implementation == f"octopipe_{inner}"
    for kind in ("none", "selective"):
        apply_recompute(model, list(recipe.layers), list(recipe.kinds), kind)
        got_loss, got = loss_and_grads(*args)
        torch.testing.assert_close(got_loss, want_loss, rtol=0, atol=0)
        for fqn, grad in got.items():
            torch.testing.assert_close(grad, want[fqn], rtol=1e-6, atol=1e-8, msg=fqn)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_cost_model_offers_each_recomputation_where_the_executor_runs_it(hf_models, family):
    path = hf_models[family].removeprefix("hf:")
    profile = op.profile_from_config(path, layer_names="hf", seq_len=16)
    recipe = load_recipe(hf_models[family])
    assert [layer.name for layer in profile.layers] == list(recipe.layers)
    for i, layer in enumerate(profile.layers):
        for kind in ("selective", "full"):
            offered = layer.recompute is not None and layer.recompute.of(kind) is not None
            runnable = recomputed_modules(
                recipe.meta_model, [layer.name], [recipe.layer_kind(i)], kind
            )
            assert offered == bool(runnable), (layer.name, kind)


@pytest.mark.parametrize("model, refused_stage", [("hf llama", 2), ("titan_style", 1)])
def test_a_selective_stage_without_an_attention_core_is_refused_in_one_line(
    hf_models, model, refused_stage
):
    """hf llama's stage 2 holds a norm and the head; titan_style's stage 1 holds decoder blocks
    that compute their attention inline (no module to recompute alone)."""
    recipe = load_recipe(hf_models["llama"] if model == "hf llama" else titan_style)
    plan = greedy([0, 1, 0], 2, 2, num_layers=len(recipe.layers))
    kinds = ["none"] * 3
    kinds[refused_stage] = "selective"
    plan = replace(plan, recompute=tuple(kinds))
    with pytest.raises(InputError) as refused:
        check_recomputable(plan, recipe, "plan.json")
    message = str(refused.value)
    st = plan.stages[refused_stage]
    assert "\n" not in message
    assert f"layers {recipe.layers[st.start]} to {recipe.layers[st.end - 1]} hold no" in message
    assert "attention core to recompute alone" in message
    assert f"stages[{refused_stage}].recompute" in message


# --- on real process groups ------------------------------------------------------------------

STEPS = 2


def mixed(stage: int, mb: int) -> str:
    return I if (stage + mb) % 2 else B


def split(_stage: int, _mb: int) -> str:
    return I


def job_spec(family, placement, kinds, backward=split, **options):
    return family, placement, kinds, backward, options


JOBS = {
    "hf llama, interleaved, split backward, selective/full/none": job_spec(
        "llama", (0, 1, 0, 1), ("selective", "full", "selective", "none")
    ),
    "hf qwen2-moe, 1F1B, B and I/W mixed": job_spec(
        "qwen2_moe", (0, 1), ("selective", "selective"), mixed
    ),
    "hf llama, TP2 x PP2, split backward": job_spec("llama", (0, 1), ("selective", "full"), tp=2),
    "hf qwen2-moe, PP2 x DP2, zero 3, split backward": job_spec(
        "qwen2_moe", (0, 1), ("selective", "none"), dp=2, zero=3
    ),
}


@pytest.fixture(scope="module")
def runs(hf_models):
    jobs = {
        name: recomputing_job(hf_models[family], placement, kinds, backward, steps=STEPS, **options)
        for name, (family, placement, kinds, backward, options) in JOBS.items()
    }
    results = launch(list(jobs.values()), 4, "gloo", timeout_s=120)
    return {name: (jobs[name], result) for name, result in zip(jobs, results)}


@pytest.mark.slow  # real process groups: the full suite, not `-m "not slow"`
@pytest.mark.parametrize("name", JOBS)
def test_selective_hf_plans_train_as_one_process_without_recomputation(name, runs):
    job, result = runs[name]
    assert "selective" in job.plan.recompute  # the reference never recomputes
    reference = train_reference(job.config, job.plan.num_microbatches)
    assert len(result.losses) == STEPS
    assert mismatches(result, reference, tol=1e-5) == []
