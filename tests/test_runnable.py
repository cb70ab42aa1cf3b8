"""`plan --gpus` answers only with layouts `octopipe run` carries out: the layout rule
(`engines/octopipe.py`) and the executor's own refusal agree on every bundled model, and the
search keeps to the rule."""

from __future__ import annotations

import pytest

from octopipe.costmodel.hf_config import load_architecture
from octopipe.engines.octopipe import context_parallel_refusal, run_refusal
from octopipe.errors import InputError
from octopipe.layouts.layout import JobShape
from octopipe.models import bundled_models


class _NoGroup:
    """Stands for a CP group: applying CP to a model on the meta device needs none."""


@pytest.mark.parametrize("name", sorted(bundled_models()))
def test_the_rule_is_the_executors_refusal(name):
    from octopipe.runtime.model.bundled import arch_recipe
    from octopipe.runtime.parallel.context import apply_cp

    arch = load_architecture(name)
    why = context_parallel_refusal(arch)
    model = arch_recipe(arch).meta_model
    if why is None:
        apply_cp(model, _NoGroup())  # type: ignore[arg-type]
    else:
        with pytest.raises(InputError, match="context parallelism does not run"):
            apply_cp(model, _NoGroup())  # type: ignore[arg-type]


def test_refusals_name_what_does_not_run():
    deepseek, llama = load_architecture("tiny-deepseek"), load_architecture("tiny-llama")
    assert "MLA" in context_parallel_refusal(deepseek)
    assert context_parallel_refusal(llama) is None
    cp2 = JobShape(1, 1, 2, 1, 1, cp=2)
    assert run_refusal(cp2, llama) is None
    assert "context parallelism" in str(run_refusal(cp2, deepseek))
    ep2 = JobShape(1, 1, 2, 1, 1, ep=2)
    assert run_refusal(ep2, deepseek) is None
    assert "--overlap-steps" in str(run_refusal(ep2, deepseek, overlap_steps=True))


@pytest.mark.timeout(300)
def test_the_answer_for_an_mla_model_at_long_sequences_has_no_cp():
    """At 256K tokens a dense model's answer splits the sequence (CP); an MLA model's, which the
    executor cannot split so, never does."""
    import octopipe as op

    options = dict(global_batch=2, seq_len=262144, time_budget=5, gpus_per_node=8)
    dense = op.plan_layout("tiny-llama", 8, **options)
    assert dense.rows[0].layout.cp > 1  # the rule has something to keep the MLA model from
    mla = op.plan_layout("tiny-deepseek", 8, **options)
    assert mla.rows and all(row.layout.cp == 1 for row in mla.rows)
