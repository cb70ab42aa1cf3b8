"""The executor's pre-flight checks: dependency graph, cycle detection, fit to model and world."""

import random

import pytest
from executor_helpers import TOY_LAYERS, gpipe, greedy, one_f_one_b
from hypothesis import given, settings
from hypothesis import strategies as st

from octopipe.actions import Action, B, F, I, W
from octopipe.errors import InputError
from octopipe.plan import make_plan
from octopipe.runtime.fuzz import random_plan
from octopipe.runtime.step.deps import check_runnable, dependencies, find_cycle


def two_stage_plan(order0, order1, num_mb=2):
    return make_plan(2, num_mb, [(0, 4), (4, TOY_LAYERS)], [0, 1], {0: order0, 1: order1})


def acts(text):
    return [Action.parse(a) for a in text.split()]


def test_dependencies_follow_the_default_semantics():
    plan = greedy([0, 1, 0], 2, 2, backward=lambda s, m: I if s == 1 else B)

    def deps(a):
        return list(dependencies(plan, Action.parse(a)))

    assert deps("0F1") == []
    assert deps("2F1") == [Action(1, F, 1)]
    assert deps("2B0") == [Action(2, F, 0)]  # the last stage needs only its own forward
    assert deps("1I0") == [Action(1, F, 0), Action(2, B, 0)]
    assert deps("0B0") == [Action(0, F, 0), Action(1, I, 0)]  # waits for I, not W, downstream
    assert deps("1W0") == [Action(1, I, 0)]


@pytest.mark.parametrize(
    "plan",
    [
        gpipe(2, 4),
        one_f_one_b(4, 6),
        greedy([0, 1, 1, 0], 3, 2),
        greedy([0, 2, 1, 0, 2], 4, 3, backward=lambda s, m: I, prefer_backward=False),
    ],
)
def test_valid_plans_are_acyclic_and_runnable(plan):
    assert find_cycle(plan) is None
    check_runnable(plan, TOY_LAYERS, plan.num_devices)


def test_a_cross_device_cycle_is_found_and_named():
    # Device 1 runs 1B1 before 1F1: 1B1 needs 1F1, which comes after it on the same device.
    # Through device 0: 1F1 needs 0F1, which waits for 0B0, which needs 1B0, behind 1B1.
    plan = two_stage_plan(acts("0F0 0B0 0F1 0B1"), acts("1F0 1B1 1B0 1F1"))
    cycle = find_cycle(plan)
    assert cycle is not None
    assert {str(a) for a in cycle} >= {"1F1", "0F1", "0B0", "1B0", "1B1"}
    with pytest.raises(InputError, match=r"deadlocks: .* waits for "):
        check_runnable(plan, TOY_LAYERS, 2)


def test_a_same_device_order_cycle_is_found():
    plan = make_plan(1, 1, [(0, 4), (4, TOY_LAYERS)], [0, 0], {0: acts("0F0 0B0 1F0 1B0")})
    assert find_cycle(plan) is not None


def test_wrong_layer_count_is_refused_in_one_line():
    with pytest.raises(InputError, match="cover 8 layers but the model has 9"):
        check_runnable(gpipe(2, 2), TOY_LAYERS + 1, 2)


def test_more_devices_than_processes_is_refused():
    with pytest.raises(InputError, match="needs 4 devices but only 2 processes"):
        check_runnable(one_f_one_b(4, 4), TOY_LAYERS, 2)


def test_an_action_on_a_device_without_its_stage_is_refused():
    plan = two_stage_plan(acts("0F0 0B0 1F0 1B0"), acts(""), num_mb=1)
    with pytest.raises(InputError, match="stage 1 is placed on device 1"):
        check_runnable(plan, TOY_LAYERS, 2)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 4))
def test_random_plans_are_valid_and_acyclic(seed, devices):
    plan = random_plan(random.Random(seed), TOY_LAYERS, devices, max_stages=6, max_microbatches=4)
    check_runnable(plan, TOY_LAYERS, devices)
    kinds = {a.kind for acts_ in plan.schedule.values() for a in acts_}
    assert kinds <= {F, B, I, W}
