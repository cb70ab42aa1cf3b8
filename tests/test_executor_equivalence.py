"""Pipelined training on real gloo process groups equals single-process training.

For each plan: the loss of every step, every parameter's gradient of the last step and every
parameter after 3 optimizer steps match plain training of the same model on the same data
(fp32, relative difference <= 1e-5). One process group runs all plans of a world size.
"""

import pytest
from executor_helpers import TOY, gpipe, greedy, layer_count, one_f_one_b

from octopipe.actions import Action
from octopipe.plan import make_plan
from octopipe.runtime.job.run_config import Job, RunConfig
from octopipe.runtime.launch.launcher import launch
from octopipe.runtime.reference import mismatches, train_reference
from octopipe.runtime.step.optim import OptimizerConfig

pytestmark = pytest.mark.slow  # real process groups: the full suite, not `-m "not slow"`

STEPS = 3
ADAM = OptimizerConfig("adam", lr=0.01)
SGD = OptimizerConfig("sgd", lr=0.1, momentum=0.9)


def mixed(s, m):
    return "I" if (s + m) % 2 else "B"


def hand_made_irregular():
    """Two stages on devices 1 and 0 (reversed), microbatches out of order, B and I/W mixed."""
    orders = {
        1: [Action.parse(a) for a in ["0F2", "0F0", "0F1", "0I2", "0B0", "0W2", "0B1"]],
        0: [Action.parse(a) for a in ["1F0", "1F2", "1I2", "1B0", "1W2", "1F1", "1B1"]],
    }
    return make_plan(2, 3, [(0, 3), (3, 8)], [1, 0], orders)


def toy(plan, optimizer=ADAM):
    return Job(plan, RunConfig(TOY, seed=11, steps=STEPS, optimizer=optimizer, collect_state=True))


def real(name, plan):
    return Job(plan, RunConfig(name, seed=2, steps=STEPS, optimizer=SGD, collect_state=True))


TWO_RANKS = {
    "gpipe": toy(gpipe(2, 4)),
    "1f1b": toy(one_f_one_b(2, 4), SGD),
    "interleaved": toy(greedy([0, 1, 0, 1], 4, 2)),
    "v-shape-split": toy(greedy([0, 1, 1, 0], 4, 2, backward=lambda s, m: "I")),
    "non-adjacent-mixed": toy(greedy([1, 0, 1, 1, 0], 3, 2, backward=mixed, prefer_backward=False)),
    "hand-made-irregular": toy(hand_made_irregular()),
    "one-device-of-two": toy(greedy([0, 0, 0], 2, 1, backward=mixed)),
    "tiny-moe-interleaved": real(
        "tiny-moe", greedy([0, 1, 0, 1], 3, 2, backward=mixed, num_layers=layer_count("tiny-moe"))
    ),
    "tiny-vlm-v-shape": real(
        "tiny-vlm", greedy([0, 1, 1, 0], 3, 2, backward=mixed, num_layers=layer_count("tiny-vlm"))
    ),
}

FOUR_RANKS = {
    "1f1b": toy(one_f_one_b(4, 6)),
    "interleaved-8-stages": toy(greedy([0, 1, 2, 3, 0, 1, 2, 3], 4, 4, backward=mixed)),
    "v-shape-zb": toy(greedy([0, 1, 2, 3, 3, 2, 1, 0], 4, 4, backward=lambda s, m: "I")),
    "uneven-stages-per-device": toy(
        greedy([2, 0, 0, 3, 1, 2], 3, 4, backward=mixed, prefer_backward=False)
    ),
    "tiny-hybrid-1f1b": real(
        "tiny-hybrid", one_f_one_b(4, 4, num_layers=layer_count("tiny-hybrid"))
    ),
    "tiny-deepseek-interleaved": real(
        "tiny-deepseek",
        greedy(
            [0, 1, 2, 3, 0, 1, 2], 3, 4, backward=mixed, num_layers=layer_count("tiny-deepseek")
        ),
    ),
}


def run_all(jobs, nproc):
    results = launch(list(jobs.values()), nproc, "gloo", timeout_s=60)
    return dict(zip(jobs, results))


def check(job, result):
    plan, cfg = job.plan, job.config
    ref = train_reference(cfg, plan.num_microbatches)
    assert len(result.losses) == STEPS
    assert result.params.keys() == ref.params.keys()
    assert mismatches(result, ref, tol=1e-5) == []


@pytest.fixture(scope="module")
def two_rank_results():
    return run_all(TWO_RANKS, 2)


@pytest.fixture(scope="module")
def four_rank_results():
    return run_all(FOUR_RANKS, 4)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", TWO_RANKS)
def test_two_ranks_match_single_process(name, two_rank_results):
    check(TWO_RANKS[name], two_rank_results[name])


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", FOUR_RANKS)
def test_four_ranks_match_single_process(name, four_rank_results):
    check(FOUR_RANKS[name], four_rank_results[name])


def test_every_action_is_recorded_once_per_step(two_rank_results):
    job, result = TWO_RANKS["hand-made-irregular"], two_rank_results["hand-made-irregular"]
    for rank, records in enumerate(result.records):
        expected = [str(a) for a in job.plan.schedule[rank]] * STEPS
        assert [r.action for r in records] == expected
        assert all(r.wait_start <= r.start <= r.end for r in records)
