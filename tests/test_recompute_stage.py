"""A stage that recomputes (`runtime/model/recompute.py`), in one process: the same gradients as no
recomputation under B and under I then W, less held from F (measured by torch's profiler), and
W's inputs taken from I's redone forward."""

import pytest
import torch
from executor_helpers import TOY, batch_of, stage_of
from torch import nn
from torch.profiler import ProfilerActivity, profile

from octopipe.runtime.model.load import load_recipe
from octopipe.runtime.model.recipe import StageModule
from octopipe.runtime.model.recompute import apply_recompute, recomputed_modules
from octopipe.runtime.step.stage import StageCompute, as_leaves

LLAMA = "tiny-llama"
RECOMPUTE_KINDS = ("none", "selective", "full")


def stage(recipe, start, end, kind, seed=3, num_mb=3):
    module = stage_of(recipe, start, end, seed)
    kinds = [recipe.layer_kind(i) for i in range(start, end)]
    apply_recompute(module, recipe.layers[start:end], kinds, kind)
    return StageCompute(module, end == len(recipe.layers), recipe.loss, num_mb)


def train_two_stages(name, kinds, backward, num_mb=3, seed=3):
    """Stages [0, 3) and [3, end) of `name`, recomputing `kinds`, every microbatch through F
    then its backward (`B` or I then W, W deferred past every I): the gradients by FQN."""
    recipe = load_recipe(name)
    cut, end = 3, len(recipe.layers)
    first, last = stage(recipe, 0, cut, kinds[0], seed), stage(recipe, cut, end, kinds[1], seed)
    batch = batch_of(recipe, num_mb, seed)
    for m in range(num_mb):
        out, _ = first.forward(m, batch.inputs[m], None)
        last.forward(m, as_leaves(out), batch.targets[m])
    for m in range(num_mb):
        if backward == "B":
            first.backward(m, last.backward(m, None))
        else:
            first.backward_input(m, last.backward_input(m, None))
    if backward == "IW":
        for m in range(num_mb):
            last.backward_weight(m)
            first.backward_weight(m)
    return {k: p.grad for st in (first, last) for k, p in st.module.part.named_parameters()}


@pytest.mark.parametrize("backward", ["B", "IW"])
@pytest.mark.parametrize(
    "name, kinds",
    [
        (LLAMA, ("full", "selective")),
        (LLAMA, ("selective", "full")),
        ("tiny-hybrid", ("full", "none")),
        ("tiny-vlm", ("selective", "full")),
        (TOY, ("full", "full")),  # layers of no named kind: each one checkpointed
    ],
)
def test_recomputing_stages_give_the_gradients_of_no_recomputation(name, kinds, backward):
    want = train_two_stages(name, ("none", "none"), backward)
    got = train_two_stages(name, kinds, backward)
    assert set(got) == set(want)
    for fqn, grad in got.items():
        torch.testing.assert_close(grad, want[fqn], rtol=1e-5, atol=1e-7, msg=fqn)


def held_after_forward(kind: str, name: str = LLAMA) -> int:
    """Bytes one microbatch's F leaves allocated in layers 0-4 of `name`, output aside."""
    recipe = load_recipe(name)
    compute = stage(recipe, 0, 4, kind, num_mb=1)
    inputs = batch_of(recipe, 1, 0).inputs[0]
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out, _ = compute.forward(0, inputs, None)
    allocated = sum(e.cpu_memory_usage for e in prof.events() if e.cpu_parent is None)
    return allocated - sum(t.untyped_storage().nbytes() for t in out)


def test_full_recomputation_holds_least_from_f_and_selective_less_than_none():
    # tiny-gemma's soft-capped attention runs unfused: its cores keep the score matrices, which
    # selective recomputation drops.
    none, selective, full = (held_after_forward(k, "tiny-gemma") for k in RECOMPUTE_KINDS)
    assert full < 0.25 * none  # the three blocks' inputs, about: not their activations
    assert full < selective < 0.9 * none


def test_selective_recomputation_of_a_fused_core_drops_only_its_log_sum_exp():
    # The fused kernel keeps q, k, v, its output and the log-sum-exp; selective recomputation
    # keeps q, k, v (and the RNG state it replays): about what no recomputation holds.
    none, selective, full = (held_after_forward(k) for k in RECOMPUTE_KINDS)
    assert full < 0.25 * none
    assert abs(selective - none) < 0.05 * none


def test_under_full_recomputation_w_takes_its_inputs_from_i_and_f_keeps_none():
    recipe = load_recipe(LLAMA)
    compute = stage(recipe, 0, 4, "full", num_mb=1)
    plain = stage(recipe, 0, 4, "none", num_mb=1)
    inputs = batch_of(recipe, 1, 0).inputs[0]
    outs = [st.forward(0, inputs, None)[0] for st in (compute, plain)]
    calls = compute._flight[0].calls
    inside = {id(m) for block in compute.module.recomputed for m in block.modules()}
    recomputed = [c for c in calls if id(c.module) in inside]
    assert recomputed and all(c.input is None for c in recomputed)  # nothing held from F
    assert all(c.input is not None for c in calls if id(c.module) not in inside)  # embedding
    grads = [torch.ones_like(o[0]) for o in outs]
    for st, g in zip((compute, plain), grads):
        st.backward_input(0, [g])
    redone = [t for c in compute._flight[0].pending._calls for t in [c.input]]
    kept = [t for c in plain._flight[0].pending._calls for t in [c.input]]
    assert len(redone) == len(kept) > 0
    for a, b in zip(redone, kept):
        torch.testing.assert_close(a, b)  # the same inputs, recomputed
    compute.backward_weight(0)


def test_selective_checkpoints_each_attention_core_and_full_each_block():
    recipe = load_recipe(LLAMA)
    part = recipe.meta_model
    layers, kinds = list(recipe.layers), [recipe.layer_kind(i) for i in range(len(recipe.layers))]
    decoders = [part.get_submodule(n) for n, k in zip(layers, kinds) if k == "decoder"]
    assert recomputed_modules(part, layers, kinds, "full") == decoders  # not embedding, head
    cores = recomputed_modules(part, layers, kinds, "selective")
    assert [c is d.mixer.core for c, d in zip(cores, decoders, strict=True)] == [True] * 4


class _Twice(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = nn.Linear(4, 4)

    def forward(self, x):
        return self.block(self.block(x))


def test_a_recomputed_module_run_twice_in_one_forward_is_refused_under_a_split_backward():
    part = _Twice()
    module = StageModule(part, lambda p, inputs: (p(*inputs),))
    apply_recompute(module, ["block"], ["layer"], "full")
    compute = StageCompute(module, False, None, 1)
    with pytest.raises(RuntimeError, match="Linear runs twice in one forward"):
        compute.forward(0, (torch.ones(2, 4, requires_grad=True),), None)
