"""Random valid plans (partitions, placements, orders, B and I/W mixed) train like one process.

A bounded sample for CI; `python -m octopipe.runtime.fuzz --plans 300` runs hundreds.
"""

import random

import pytest
from executor_helpers import TOY, TOY_LAYERS

from octopipe.runtime.fuzz import random_plan
from octopipe.runtime.job.run_config import Job, RunConfig
from octopipe.runtime.launch.launcher import launch
from octopipe.runtime.reference import mismatches, train_reference
from octopipe.runtime.step.optim import OptimizerConfig

pytestmark = pytest.mark.slow  # real process groups: the full suite, not `-m "not slow"`

ADAM = OptimizerConfig("adam", lr=0.01)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("nproc, count, seed", [(2, 10, 101), (4, 14, 202)])
def test_random_plans_match_single_process(nproc, count, seed):
    rng = random.Random(seed)
    plans = [
        random_plan(rng, TOY_LAYERS, nproc, max_stages=8, max_microbatches=5) for _ in range(count)
    ]
    assert any(any(a.kind == "I" for acts in p.schedule.values() for a in acts) for p in plans)
    assert any(any(a.kind == "B" for acts in p.schedule.values() for a in acts) for p in plans)
    cfg = RunConfig(TOY, seed=seed, steps=2, optimizer=ADAM, collect_state=True)
    results = launch([Job(p, cfg) for p in plans], nproc, "gloo", timeout_s=60)
    references = {}
    for plan, result in zip(plans, results):
        m = plan.num_microbatches
        if m not in references:
            references[m] = train_reference(cfg, m)
        assert mismatches(result, references[m]) == [], plan.to_dict()


@pytest.mark.timeout(240)
def test_transfers_matched_by_order_alone_as_on_nccl():
    """NCCL ignores tags: with one group per channel and no tags, receives must still be posted
    in each sender's order. Gloo in that mode checks it without GPUs."""
    rng = random.Random(303)
    plans = [random_plan(rng, TOY_LAYERS, 3, max_stages=8, max_microbatches=5) for _ in range(8)]
    cfg = RunConfig(TOY, seed=5, steps=2, optimizer=ADAM, collect_state=True, order_matched=True)
    results = launch([Job(p, cfg) for p in plans], 3, "gloo", timeout_s=60)
    for plan, result in zip(plans, results):
        reference = train_reference(cfg, plan.num_microbatches)
        assert mismatches(result, reference) == [], plan.to_dict()
