"""Schedule generators: structure, deadlock freedom, and textbook bubbles in the simulator."""

from __future__ import annotations

import dataclasses

import pytest
from sim_helpers import uniform_profile

from octopipe.errors import InputError
from octopipe.plan import check_structure, make_plan
from octopipe.schedules import DEFAULT_CHUNKS, SCHEDULES, ScheduleSpec, generate
from octopipe.sim import Simulator


def plan_of(spec: ScheduleSpec, num_microbatches: int):
    """One layer per stage."""
    ranges = [(s, s + 1) for s in range(spec.num_stages)]
    return make_plan(spec.num_devices, num_microbatches, ranges, spec.placement, spec.orders)


def simulate_uniform(name, P, M, chunks=None, f=1.0, b=1.0, w=1.0, wact=4):
    """Simulate on uniform layers whose per-device totals are f, b, w (each chunk 1/V of it)."""
    spec = generate(name, P, M, chunks)
    V = spec.num_stages // P
    profile = uniform_profile(spec.num_stages, f=f / V, b=b / V, w=w / V, wact=wact, devices=P)
    return Simulator(profile).run(plan_of(spec, M))


def supported(name, P, M, V):
    try:
        generate(name, P, M, V)
    except InputError:
        return False
    return True


def test_names_and_default_chunks():
    assert SCHEDULES == ("gpipe", "1f1b", "i1f1b", "zbh1", "zbh2", "zbv", "dualpipev")
    for name in SCHEDULES:
        spec = generate(name, 4, 8)
        assert spec.name == name
        assert spec.num_stages == 4 * DEFAULT_CHUNKS[name]
        assert len(spec.placement) == spec.num_stages
        assert set(spec.orders) == set(range(4))
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.name = "other"


def test_placements():
    assert generate("i1f1b", 3, 6).placement == (0, 1, 2, 0, 1, 2)
    assert generate("zbv", 3, 6).placement == (0, 1, 2, 2, 1, 0)
    assert generate("dualpipev", 2, 4).placement == (0, 1, 1, 0)


GRID = [
    (P, M, V) for P in (1, 2, 3, 4, 5) for M in (1, 2, 3, 4, 5, 7, 8, 10, 12) for V in (1, 2, 3)
]


@pytest.mark.parametrize("name", SCHEDULES)
def test_every_supported_plan_is_well_formed_and_deadlock_free(name):
    checked = 0
    for P, M, V in GRID:
        if not supported(name, P, M, V):
            continue
        spec = generate(name, P, M, V)
        plan = plan_of(spec, M)
        check_structure(plan, num_layers=spec.num_stages)
        result = Simulator(uniform_profile(spec.num_stages, devices=P)).run(plan, detail=False)
        assert result.iteration_time >= result.lower_bound - 1e-9
        assert result.end_memory_bytes == result.static_memory_bytes  # every backward ran
        checked += 1
    assert checked >= 20  # the grid really exercised the generator


@pytest.mark.parametrize(
    "name,P,M,V,fault",
    [
        ("pipedream", 4, 8, None, "unknown schedule"),
        ("1f1b", 4, 8, 2, "one stage per device"),
        ("zbh2", 4, 8, 2, "one stage per device"),
        ("zbv", 4, 8, 3, "exactly two stages"),
        ("dualpipev", 4, 7, None, "at least 2 x devices = 8 microbatches"),
        ("i1f1b", 4, 9, 2, "2 equal rounds"),
        ("zbh1", 2, 5, 2, "2 equal rounds"),
        ("gpipe", 0, 8, None, "at least 1 of devices"),
        ("gpipe", 2, 0, None, "at least 1 of microbatches"),
        ("i1f1b", 2, 4, 0, "at least 1 of chunks"),
    ],
)
def test_unsupported_combinations_raise_one_line(name, P, M, V, fault):
    with pytest.raises(InputError) as err:
        generate(name, P, M, V)
    assert fault in str(err.value)
    assert "\n" not in str(err.value)


def test_interleaved_accepts_what_torch_accepts():
    # PyTorch relaxes Megatron's M % P == 0: M must split into max(1, M // P) equal rounds.
    for P, M in [(4, 8), (4, 10), (4, 3), (4, 6)]:
        assert supported("i1f1b", P, M, 2)
    assert not supported("i1f1b", 4, 9, 2)


# --- bubbles on uniform costs: idle time per device in one iteration ----------------------
# f, b, w below are one device's per-microbatch totals (b: input gradient, w: weight gradient),
# so the papers' full backward is B = b + w.

COSTS = [(1.0, 1.0, 1.0), (1.0, 2.0, 1.0), (1.0, 3.0, 1.0), (2.0, 1.0, 1.0)]
SHAPES = [(2, 8), (3, 9), (4, 8), (4, 16), (5, 15)]


@pytest.mark.parametrize("f,b,w", COSTS)
@pytest.mark.parametrize("P,M", SHAPES)
@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_gpipe_and_1f1b_idle_is_p_minus_1_times_f_plus_b(name, P, M, f, b, w):
    r = simulate_uniform(name, P, M, f=f, b=b, w=w)
    assert r.idle == pytest.approx([(P - 1) * (f + b + w)] * P)


@pytest.mark.parametrize("f,b,w", COSTS)
@pytest.mark.parametrize("P,M", [(2, 8), (3, 9), (4, 8), (4, 16), (4, 4)])
@pytest.mark.parametrize("V", [2, 3, 4])
def test_interleaved_idle_is_divided_by_chunks(P, M, V, f, b, w):
    r = simulate_uniform("i1f1b", P, M, V, f=f, b=b, w=w)
    assert r.idle == pytest.approx([(P - 1) * (f + b + w) / V] * P)


@pytest.mark.parametrize("P,M", SHAPES)
@pytest.mark.parametrize("f,b,w", COSTS)
def test_zbh1_idle_is_p_minus_1_times_f_plus_b_minus_w(P, M, f, b, w):
    # Qi et al.: (P-1)(T_F + T_B - T_W) with T_B the input-gradient part; with F=B=W that is
    # (P-1)(F + B_full - 2W) in full-backward terms, a third of 1F1B's.
    r = simulate_uniform("zbh1", P, M, f=f, b=b, w=w)
    assert r.idle == pytest.approx([(P - 1) * (f + b - w)] * P)


@pytest.mark.parametrize("P,M", SHAPES)
@pytest.mark.parametrize("f,b,w", COSTS)
def test_zbh2_idle_is_the_start_up_floor(P, M, f, b, w):
    # Qi et al. give (P-1)(T_F + T_B - 2T_W), zero with F=B=W, counting across iterations with
    # the optimizer step unsynchronized. Within one synchronous iteration the last device cannot
    # start before (P-1)F, so no schedule idles less than (P-1)F per device; ZB-H2 reaches
    # max of the two.
    r = simulate_uniform("zbh2", P, M, f=f, b=b, w=w)
    assert r.idle == pytest.approx([(P - 1) * max(f, f + b - 2 * w)] * P)


@pytest.mark.parametrize("P,M", SHAPES)
@pytest.mark.parametrize("name", ["zbv", "dualpipev"])
def test_v_schedules_reach_the_v_start_up_floor_with_equal_costs(name, P, M):
    # In a V the last device's first stage is P-1 chunk forwards deep: (P-1)F/2 is the floor,
    # and with F=B=W both schedules idle exactly that long (ZB-V's "zero bubble").
    if not supported(name, P, M, 2):
        pytest.skip("too few microbatches")
    r = simulate_uniform(name, P, M)
    assert r.idle == pytest.approx([(P - 1) * 1.0 / 2] * P)


def test_zero_bubble_orders_rank_as_the_papers_say():
    P, M, cost = 4, 16, dict(f=1.0, b=2.0, w=1.0)
    names = ("1f1b", "zbh1", "zbh2", "zbv")
    t = {n: simulate_uniform(n, P, M, **cost).iteration_time for n in names}
    assert t["zbh2"] < t["zbh1"] < t["1f1b"]
    assert t["zbv"] <= t["zbh2"]


def test_zbh1_keeps_1f1b_activation_memory_and_zbh2_about_doubles_it():
    # Activations only (W holds nothing): ZB-H1 is designed to fit in 1F1B's memory.
    peaks = {
        n: simulate_uniform(n, 4, 16, wact=0).peak_memory_bytes for n in ("1f1b", "zbh1", "zbh2")
    }
    assert peaks["zbh1"] == peaks["1f1b"]
    assert max(peaks["zbh2"]) - 100 >= 1.5 * (max(peaks["1f1b"]) - 100)
