import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from octopipe.actions import Action
from octopipe.errors import DeadlockError, InputError
from octopipe.plan import Plan, make_plan
from octopipe.profile import Device, LayerCost, Link, Profile
from octopipe.random_plans import random_plan
from octopipe.sim import Simulator, simulate
from tests.sim_helpers import one_f_one_b, uniform_profile


@pytest.mark.parametrize("P, M", [(2, 2), (4, 8), (8, 3), (3, 16)])
def test_1f1b_uniform_matches_textbook(P, M):
    r = simulate(uniform_profile(P), one_f_one_b(P, M))
    # F = 1, B = b + w = 2: time (M + P - 1)(F + B), each device idles (P - 1)(F + B).
    assert r.iteration_time == pytest.approx((M + P - 1) * 3)
    assert r.idle == pytest.approx([(P - 1) * 3] * P)
    assert r.bubble_ratio == pytest.approx((P - 1) / (M + P - 1))
    assert r.efficiency == pytest.approx(M / (M + P - 1))
    # Device d holds min(P - d, M) microbatches at its peak in 1F1B.
    assert r.peak_memory_bytes == tuple(100 + 10 * min(P - d, M) for d in range(P))
    assert r.end_memory_bytes == r.static_memory_bytes


@pytest.mark.parametrize("split", [False, True])
def test_action_overhead_is_paid_once_per_action(split):
    P, M, o = 3, 4, 0.25
    plan = one_f_one_b(P, M, split=split)
    default = simulate(uniform_profile(P), plan)
    with_overhead = Simulator(uniform_profile(P), action_overhead=o).run(plan)
    # Every action on the critical path of 1F1B (F then B, or F, I, W) grows by o; a full B is
    # one action, so it pays one overhead, not one for its I part and one for its W part.
    per_microbatch = (2 if not split else 3) * o
    assert with_overhead.iteration_time > default.iteration_time
    busy = [sum(e.end - e.start for e in with_overhead.events if e.device == d) for d in range(P)]
    assert busy == pytest.approx([M * (3 + per_microbatch)] * P)
    for bad in (-1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="finite number >= 0"):
            Simulator(uniform_profile(P), action_overhead=bad)


def test_split_backward_memory_and_time():
    prof = uniform_profile(2, act=10, wact=4)
    plan = make_plan(
        1,
        2,
        [(0, 2)],
        [0],
        {
            0: [
                Action(0, "F", 0),
                Action(0, "F", 1),
                Action(0, "I", 0),
                Action(0, "I", 1),
                Action(0, "W", 0),
                Action(0, "W", 1),
            ]
        },
    )
    r = simulate(prof, plan)
    assert r.iteration_time == pytest.approx(2 * 6)
    # Two microbatches of two layers held (2 * 20), then each I frees 20 - 8.
    assert r.peak_memory_bytes == (200 + 40,)
    assert [e.action for e in r.events] == list(plan.schedule[0])


def test_transfer_latency_and_bandwidth_delay_dependencies():
    link = Link(bandwidth=10.0, latency=0.5)
    prof = uniform_profile(2, out=20, link=link)
    plan = one_f_one_b(2, 1)
    r = simulate(prof, plan)
    lag = 0.5 + 20 / 10.0
    assert r.iteration_time == pytest.approx(1 + lag + 1 + 2 + lag + 2)
    # The same stages on one device transfer nothing.
    same = make_plan(
        2,
        1,
        [(0, 1), (1, 2)],
        [0, 0],
        {0: [Action(0, "F", 0), Action(1, "F", 0), Action(1, "B", 0), Action(0, "B", 0)]},
    )
    assert simulate(prof, same).iteration_time == pytest.approx(6)


def test_device_speed_scales_durations():
    prof = uniform_profile(2, devices=2).with_devices([Device(speed=2.0), Device(speed=0.5)])
    r = simulate(prof, one_f_one_b(2, 1))
    assert r.busy == pytest.approx((1.5, 6.0))
    # LB = M * max(total work / total speed, largest layer / fastest) = max(6 / 2.5, 3 / 2)
    assert r.lower_bound == pytest.approx(6 / 2.5)


def test_memory_capacity_and_fits():
    prof = uniform_profile(4, devices=4).with_devices([Device(memory_bytes=130)] * 4)
    r = simulate(prof, one_f_one_b(4, 8))
    assert r.fits_per_device == (False, True, True, True)  # 140, 130, 120, 110
    assert not r.fits
    assert r.memory_excess_bytes == (10.0, 0.0, 0.0, 0.0)


def test_deadlock_names_waiting_actions():
    prof = uniform_profile(2)
    plan = make_plan(
        2,
        1,
        [(0, 1), (1, 2)],
        [0, 1],
        {0: [Action(0, "B", 0), Action(0, "F", 0)], 1: [Action(1, "F", 0), Action(1, "B", 0)]},
    )
    with pytest.raises(DeadlockError) as err:
        simulate(prof, plan)
    msg = str(err.value)
    assert "device 0: 0B0 waits for 0F0" in msg and "device 1: 1F0 waits for 0F0" in msg
    assert "\n" not in msg


def test_profile_device_count_must_match_plan():
    with pytest.raises(InputError, match="plan has 2 devices"):
        simulate(uniform_profile(2, devices=3), one_f_one_b(2, 1))


def test_critical_path_is_a_chain_ending_last():
    r = simulate(uniform_profile(4), one_f_one_b(4, 4))
    path = r.critical_path
    assert path[0] == Action(0, "F", 0) and path[-1] == Action(0, "B", 3)
    by_action = {e.action: e for e in r.events}
    for a, b in zip(path, path[1:]):
        assert by_action[b].start >= by_action[a].end - 1e-12
    assert by_action[path[-1]].end == pytest.approx(r.iteration_time)


# ---- properties over random valid plans ------------------------------------------------------


def random_profile(rng: random.Random, n: int, nd: int) -> Profile:
    layers = []
    for i in range(n):
        act = rng.randint(0, 50)
        layers.append(
            LayerCost(
                name=f"layers.{i}",
                f=rng.uniform(0, 2),
                b=rng.uniform(0, 2),
                w=rng.uniform(0, 2),
                act_bytes=act,
                wact_bytes=rng.randint(0, act),
                param_bytes=rng.randint(0, 100),
                out_bytes=rng.randint(0, 10),
            )
        )
    devices = tuple(Device(speed=rng.choice([0.5, 1.0, 2.0])) for _ in range(nd))
    return Profile(layers=tuple(layers), devices=devices, link=Link(bandwidth=5.0, latency=0.1))


def check_dependencies(prof: Profile, plan: Plan, r) -> None:
    """Every simulated event obeys its device's order and its dependencies (with transfer lag)."""
    ev = {e.action: e for e in r.events}
    link, stages = prof.link, plan.stages

    def lag(s_from: int, s_to: int) -> float:
        if stages[s_from].device == stages[s_to].device:
            return 0.0
        boundary = stages[min(s_from, s_to)].end - 1
        return link.latency + prof.layers[boundary].out_bytes / link.bandwidth

    for acts in plan.schedule.values():
        for a, b in zip(acts, acts[1:]):
            assert ev[b].start >= ev[a].end - 1e-9
    for a, e in ev.items():
        s, k, m = a
        needs = []
        if k == "F" and s > 0:
            needs.append((Action(s - 1, "F", m), lag(s - 1, s)))
        if k in "IB":
            needs.append((Action(s, "F", m), 0.0))
            if s + 1 < len(stages):
                nxt = (
                    Action(s + 1, "I", m) if Action(s + 1, "I", m) in ev else Action(s + 1, "B", m)
                )
                needs.append((nxt, lag(s + 1, s)))
        if k == "W":
            needs.append((Action(s, "I", m), 0.0))
        for dep, l in needs:
            assert e.start >= ev[dep].end + l - 1e-9, (a, dep)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(1, 8), nd=st.integers(1, 4), M=st.integers(1, 5))
def test_any_valid_plan_simulates_within_physical_limits(seed, n, nd, M):
    rng = random.Random(seed)
    prof = random_profile(rng, n, nd)
    plan = random_plan(rng, n, nd, M)
    r = simulate(prof, plan)
    assert r.iteration_time >= r.lower_bound - 1e-9
    assert r.end_memory_bytes == pytest.approx(r.static_memory_bytes)
    assert all(p >= s for p, s in zip(r.peak_memory_bytes, r.static_memory_bytes))
    assert sum(r.busy) == pytest.approx(
        M
        * sum(
            l.work / prof.devices[st.device].speed
            for st in plan.stages
            for l in prof.layers[st.start : st.end]
        )
    )
    check_dependencies(prof, plan, r)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(2, 6), nd=st.integers(1, 3), M=st.integers(1, 4))
def test_reordering_never_breaks_dependencies_silently(seed, n, nd, M):
    """A shuffled device order either deadlocks (an error) or yields a timing that obeys every
    dependency: the simulator never times an action before what it needs."""
    rng = random.Random(seed)
    prof = random_profile(rng, n, nd)
    plan = random_plan(rng, n, nd, M)
    d = rng.randrange(nd)
    acts = list(plan.schedule[d])
    rng.shuffle(acts)
    shuffled = Plan(plan.num_devices, M, plan.stages, {**plan.schedule, d: tuple(acts)})
    try:
        r = simulate(prof, shuffled)
    except DeadlockError as exc:
        assert "waits for" in str(exc)
        return
    check_dependencies(prof, shuffled, r)


def test_simulator_is_reusable_across_plans():
    prof = uniform_profile(6)
    sim = Simulator(prof)
    fast = sim.run(
        make_plan(
            2,
            2,
            [(0, 3), (3, 6)],
            [0, 1],
            {
                0: [Action(0, "F", 0), Action(0, "F", 1), Action(0, "B", 0), Action(0, "B", 1)],
                1: [Action(1, "F", 0), Action(1, "B", 0), Action(1, "F", 1), Action(1, "B", 1)],
            },
        ),
        detail=False,
    )
    assert fast.events == () and fast.critical_path == ()
    # Stage F = 3, B = 6: device 1 ends 1B1 at 21, then device 0 runs 0B1 for 6.
    assert fast.iteration_time == pytest.approx(27)
    with pytest.raises(InputError, match="cover 2 layers but the profile has 6"):
        sim.run(one_f_one_b(2, 2))
