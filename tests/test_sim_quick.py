"""The one-pass timing of a search's plans (`sim/quick.py`) gives the graph's figures bit for
bit, or None where the graph's way would report a deadlock: its loop (`sim/quick_loop.py`)
compiled and as Python alike."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from octopipe.actions import Action
from octopipe.errors import DeadlockError
from octopipe.plan import Plan, make_plan
from octopipe.profile import DataParallel, Profile
from octopipe.random_plans import random_plan
from octopipe.sim import Simulator, lower_bound
from octopipe.sim.evaluate import evaluate
from octopipe.sim.graph import build_graph, devices_for
from octopipe.sim.quick import quick_evaluate
from tests.sim_helpers import one_f_one_b, uniform_profile
from tests.test_sim import random_profile


@pytest.fixture(autouse=True, scope="module", params=["compiled", "python"])
def loop(request):
    """Every test of this module once with the pass compiled, once as Python."""
    from octopipe.compiled import python_of
    from octopipe.sim import quick_loop

    if request.param == "compiled":
        yield request.param
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(quick_loop, "one_pass", python_of(quick_loop.one_pass))
        yield request.param


FIELDS = (
    "iteration_time",
    "busy",
    "peak_memory_bytes",
    "static_memory_bytes",
    "capacity_bytes",
    "lower_bound",
    "critical_path",
    "end_memory_bytes",
    "reductions",
)


def both(profile: Profile, plan: Plan):
    """(the quick pass's result, the graph's result or its DeadlockError)."""
    sim = Simulator(profile)
    devices = devices_for(profile, plan)
    bound = lower_bound(profile, devices, plan.num_microbatches)
    quick = quick_evaluate(sim.costs, plan, devices, bound)
    try:
        graph = evaluate(build_graph(sim.costs, plan, devices, check=False), bound, detail=False)
    except DeadlockError as exc:
        graph = exc
    return quick, graph


def with_replicas(profile: Profile, dp: DataParallel) -> Profile:
    """`profile` with `dp`'s replicas, every layer reducing 100 bytes of gradients."""
    layers = tuple(layer.model_copy(update={"grad_bytes": 100}) for layer in profile.layers)
    return profile.model_copy(update={"layers": layers, "data_parallel": dp})


def assert_same(quick, graph) -> None:
    assert quick is not None
    for name in FIELDS:
        assert getattr(quick, name) == getattr(graph, name), name


@settings(max_examples=80, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    n=st.integers(1, 8),
    nd=st.integers(1, 4),
    M=st.integers(1, 5),
    replicas=st.sampled_from([1, 4]),
    at_end=st.booleans(),
    buckets=st.sampled_from([None, 40]),
)
def test_random_plans_time_the_same_as_the_graph(seed, n, nd, M, replicas, at_end, buckets):
    rng = random.Random(seed)
    dp = DataParallel(degree=replicas, bandwidth=50.0, bucket_bytes=buckets, at_end=at_end)
    profile = with_replicas(random_profile(rng, n, nd), dp)
    quick, graph = both(profile, random_plan(rng, n, nd, M))
    assert_same(quick, graph)


@pytest.mark.parametrize("at_end", [False, True])
@pytest.mark.parametrize("buckets", [None, 150])
def test_data_parallel_reductions_time_the_same_as_the_graph(at_end, buckets):
    dp = DataParallel(degree=4, bandwidth=50.0, bucket_bytes=buckets, at_end=at_end)
    profile = with_replicas(uniform_profile(4), dp)
    quick, graph = both(profile, one_f_one_b(4, 6, split=True))
    assert quick.reductions  # the reductions were exercised
    assert_same(quick, graph)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(2, 6), nd=st.integers(1, 3), M=st.integers(1, 4))
def test_a_shuffled_order_times_the_same_or_deadlocks_in_both(seed, n, nd, M):
    rng = random.Random(seed)
    profile = random_profile(rng, n, nd)
    plan = random_plan(rng, n, nd, M)
    d = rng.randrange(nd)
    acts = list(plan.schedule[d])
    rng.shuffle(acts)
    shuffled = Plan(plan.num_devices, M, plan.stages, {**plan.schedule, d: tuple(acts)})
    quick, graph = both(profile, shuffled)
    if isinstance(graph, DeadlockError):
        assert quick is None
    else:
        assert_same(quick, graph)


def test_a_deadlocked_plan_still_names_its_waits_without_detail():
    plan = make_plan(
        2,
        1,
        [(0, 1), (1, 2)],
        [0, 1],
        {0: [Action(0, "B", 0), Action(0, "F", 0)], 1: [Action(1, "F", 0), Action(1, "B", 0)]},
    )
    with pytest.raises(DeadlockError, match="device 0: 0B0 waits for 0F0"):
        Simulator(uniform_profile(2)).run(plan, detail=False)
