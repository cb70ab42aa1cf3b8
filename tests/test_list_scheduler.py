"""The memory-aware list scheduler: named schedules as rule settings, validity, memory, timing."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from octopipe.actions import I_CODE, W_CODE
from octopipe.costs import StageCost, stage_costs
from octopipe.plan import check_structure, make_plan
from octopipe.profile import Device, LayerCost, Link, Profile, Recomputation, Recomputed
from octopipe.schedules import generate
from octopipe.schedules.list_scheduler import Rules, list_schedule
from octopipe.sim import Simulator


def uniform(P: int, act: int = 10, wact: int = 4) -> Profile:
    layer = LayerCost(
        name="l", f=1.0, b=1.0, w=1.0, act_bytes=act, wact_bytes=wact, param_bytes=100, out_bytes=0
    )
    return Profile(layers=(layer,) * P, devices=(Device(),) * P)


def sequential_stages(P: int, profile: Profile) -> tuple[StageCost, ...]:
    sim = Simulator(profile)
    return stage_costs(
        sim.costs,
        [(s, s + 1) for s in range(P)],
        list(range(P)),
        profile.device_list(P),
    )


def simulate_orders(profile: Profile, P: int, M: int, ranges, placement, orders):
    plan = make_plan(P, M, ranges, placement, orders)
    check_structure(plan, "<test>", profile.num_layers)
    return plan, Simulator(profile).run(plan, detail=False)


@pytest.mark.parametrize("P, M", [(2, 4), (4, 8), (4, 3), (5, 12)])
def test_1f1b_is_a_rule_setting(P, M):
    profile = uniform(P)
    rules = Rules(inflight=tuple(P - s for s in range(P)), split_backward=False)
    sched = list_schedule(sequential_stages(P, profile), P, M, rules)
    assert sched.orders == generate("1f1b", P, M).orders
    # F = 1, B = 2: the textbook (M + P - 1)(F + B).
    assert sched.makespan == pytest.approx((M + P - 1) * 3)


@pytest.mark.parametrize("P, M", [(4, 8), (4, 16), (6, 12)])
def test_zb_h1_like_rules_match_zb_h1_in_its_memory(P, M):
    profile = uniform(P)
    spec = generate("zbh1", P, M)
    _, zbh1 = simulate_orders(
        profile, P, M, [(s, s + 1) for s in range(P)], spec.placement, spec.orders
    )
    budget = tuple(p - s for p, s in zip(zbh1.peak_memory_bytes, zbh1.static_memory_bytes))
    caps = tuple(P - s for s in range(P))
    stages = sequential_stages(P, profile)
    ours = list_schedule(stages, P, M, Rules(inflight=caps, defer_w=True, memory_budget=budget))
    assert ours.makespan <= zbh1.iteration_time + 1e-9
    assert all(p <= b for p, b in zip(ours.peak_activation_bytes, budget))
    one_f_one_b = list_schedule(stages, P, M, Rules(inflight=caps, split_backward=False))
    assert ours.makespan < one_f_one_b.makespan


def test_memory_budget_caps_the_activations_in_flight():
    P, M = 4, 16
    profile = uniform(P, act=10, wact=10)
    stages = sequential_stages(P, profile)
    free = list_schedule(stages, P, M, Rules(inflight=(M,) * P))
    tight = list_schedule(stages, P, M, Rules(inflight=(M,) * P, memory_budget=(20,) * P))
    assert max(free.peak_activation_bytes) > 20
    assert max(tight.peak_activation_bytes) <= 20
    assert tight.makespan >= free.makespan


def test_w_deferral_off_runs_w_right_after_its_input_gradient():
    P, M = 3, 4
    profile = uniform(P)
    sched = list_schedule(
        sequential_stages(P, profile), P, M, Rules(inflight=(P,) * P, defer_w=False)
    )
    for acts in sched.orders.values():
        for k, a in enumerate(acts):
            if a.kind == "I":
                assert acts[k + 1] == (a.stage, "W", a.mb)


@st.composite
def cases(draw):
    L = draw(st.integers(2, 9))
    P = draw(st.integers(1, min(L, 4)))
    S = draw(st.integers(P, min(L, 3 * P)))
    M = draw(st.integers(1, 6))
    layers = tuple(
        LayerCost(
            name=f"layers.{i}",
            f=draw(st.floats(0.1, 3)),
            b=draw(st.floats(0, 3)),
            w=draw(st.floats(0, 3)),
            act_bytes=draw(st.integers(0, 50)),
            wact_bytes=0,
            param_bytes=1,
            out_bytes=draw(st.integers(0, 100)),
        )
        for i in range(L)
    )
    speeds = draw(st.lists(st.sampled_from([0.5, 1.0, 2.0]), min_size=P, max_size=P))
    profile = Profile(
        layers=layers,
        devices=tuple(Device(speed=s) for s in speeds),
        link=Link(bandwidth=100.0, latency=draw(st.floats(0, 0.5))),
    )
    cuts = sorted(
        draw(st.lists(st.integers(1, L - 1), min_size=S - 1, max_size=S - 1, unique=True))
    )
    bounds = [0, *cuts, L]
    placement = [draw(st.integers(0, P - 1)) for _ in range(S)]
    rules = Rules(
        inflight=tuple(draw(st.integers(1, M + 1)) for _ in range(S)),
        split_backward=draw(st.booleans()),
        defer_w=draw(st.booleans()),
        backward_first=draw(st.booleans()),
        oldest_first=draw(st.booleans()),
        memory_budget=draw(st.none() | st.just((30.0,) * P)),
    )
    return profile, P, M, list(itertools.pairwise(bounds)), placement, rules


@settings(max_examples=150, deadline=None)
@given(cases())
def test_any_placement_gives_a_valid_order_that_the_simulator_times_alike(case):
    profile, P, M, ranges, placement, rules = case
    stages = stage_costs(Simulator(profile).costs, ranges, placement, profile.devices)
    sched = list_schedule(stages, P, M, rules)
    _, result = simulate_orders(profile, P, M, ranges, placement, sched.orders)  # no deadlock
    assert result.iteration_time == pytest.approx(sched.makespan, rel=1e-9, abs=1e-12)
    assert result.busy == pytest.approx(sched.busy)
    dynamic_peaks = [p - s for p, s in zip(result.peak_memory_bytes, result.static_memory_bytes)]
    assert dynamic_peaks == pytest.approx(sched.peak_activation_bytes)


def test_gives_up_only_on_schedules_that_end_later_than_asked():
    P, M = 4, 8
    stages = sequential_stages(P, uniform(P))
    rules = Rules(inflight=(P,) * P)
    full = list_schedule(stages, P, M, rules)
    assert list_schedule(stages, P, M, rules, give_up_after=full.makespan) == full
    assert list_schedule(stages, P, M, rules, give_up_after=full.makespan * 0.99) is None


@pytest.mark.parametrize("split", [False, True])
def test_list_scheduler_and_simulator_agree_under_an_action_overhead(split):
    from octopipe.tuner.candidate import Candidate, Evaluator

    profile = uniform(4).with_devices((Device(), Device()))
    sim = Simulator(profile, action_overhead=0.3)
    evaluator = Evaluator(profile, profile.device_list(2), 6, sim.costs)
    cand = Candidate(((0, 1), (1, 2), (2, 3), (3, 4)), (0, 1, 1, 0), split_backward=split)
    outcome = evaluator.evaluate(cand)
    plan = evaluator.to_plan(outcome)
    # A B pays the overhead once in both; so do F, I and W.
    assert outcome.makespan == pytest.approx(sim.run(plan, detail=False).iteration_time)
    kinds = {a.kind for acts in plan.schedule.values() for a in acts}
    assert kinds == ({"F", "I", "W"} if split else {"F", "B"})


@st.composite
def recomputing_cases(draw):
    """`cases()` whose layers price full recomputation (a longer I, less held from F, W's
    inputs held from I, possibly more than F held) and whose stages choose it or not."""
    profile, P, M, ranges, placement, rules = draw(cases())
    alternative = st.builds(
        Recomputed,
        b=st.floats(0, 6),
        act_bytes=st.integers(0, 20),
        wact_bytes=st.integers(0, 60),
    )
    layers = tuple(
        layer.model_copy(update={"recompute": Recomputation(full=draw(alternative))})
        for layer in profile.layers
    )
    kinds = [draw(st.sampled_from(["none", "full"])) for _ in ranges]
    return profile.model_copy(update={"layers": layers}), P, M, ranges, placement, rules, kinds


@settings(max_examples=100, deadline=None)
@given(recomputing_cases())
def test_recomputing_stages_are_timed_and_held_alike_by_the_scheduler_and_the_simulator(case):
    profile, P, M, ranges, placement, rules, kinds = case
    stages = stage_costs(Simulator(profile).costs, ranges, placement, profile.devices, kinds)
    sched = list_schedule(stages, P, M, rules)
    plan = make_plan(P, M, ranges, placement, sched.orders, kinds)
    result = Simulator(profile).run(plan, detail=False)
    assert result.iteration_time == pytest.approx(sched.makespan, rel=1e-9, abs=1e-12)
    dynamic_peaks = [p - s for p, s in zip(result.peak_memory_bytes, result.static_memory_bytes)]
    assert dynamic_peaks == pytest.approx(sched.peak_activation_bytes)


@pytest.mark.parametrize("kept", [0, 1, 3])
def test_tail_w_keeps_that_many_deferred_w_past_the_last_backward(kept):
    # A slow first stage leaves the later devices idle within the step: they spend it on
    # deferred W only while more than `kept` wait, so past each one's last I come the `kept` W
    # it held back and that I's own; the first device, never idle, runs its W at the end.
    P, M = 4, 8
    stages = [StageCost(s, 3.0 if s == 0 else 1.0, 1.0, 1.0, 10, 4, 0.0) for s in range(P)]
    rules = Rules(inflight=tuple(P - s for s in range(P)), tail_w=(kept,) * P)
    sched = list_schedule(stages, P, M, rules)
    for device, order in enumerate(sched.codes):
        kinds = [k for _, k, _ in order]
        after_last_i = len(kinds) - 1 - max(i for i, k in enumerate(kinds) if k == I_CODE)
        assert set(kinds[len(kinds) - after_last_i :]) == {W_CODE}
        if device:
            assert after_last_i == kept + 1
        else:
            assert after_last_i >= kept + 1
