"""The search's inner loops compiled by numba give what the same loops give as Python, bit
for bit (the same orders, times, peaks and memory waits; the same partition table), for any
stages, placement, rules and layer work; and OCTOPIPE_COMPILED=0 leaves them as Python."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from contextlib import contextmanager

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from octopipe import partition, partition_loop
from octopipe.compiled import python_of
from octopipe.costs import StageCost
from octopipe.schedules import list_loop
from octopipe.schedules.list_scheduler import Rules, list_schedule

pytest.importorskip("numba")


@contextmanager
def as_python(module, *names):
    """`module`'s loops `names` run as Python meanwhile."""
    with pytest.MonkeyPatch.context() as patch:
        for name in names:
            patch.setattr(module, name, python_of(getattr(module, name)))
        yield


def test_a_loop_compiles_without_a_place_for_numbas_cache(monkeypatch):
    # A read-only install with no writable home: numba finds no cache locator and refuses to
    # cache; the loop is compiled all the same, each process for itself.
    from numba.core import caching

    from octopipe.compiled import jit

    monkeypatch.setattr(caching.CacheImpl, "_locator_classes", [])

    def twice(x):
        return 2 * x

    compiled = jit(twice)
    assert python_of(compiled) is twice
    assert compiled(21) == 42


def test_the_loops_are_compiled_here():
    for loop in (list_loop.schedule_loop, list_loop._to_front, partition_loop.next_row):
        assert python_of(loop) is not loop


# Few distinct values, so that actions end at the same instant and the heap's ties are tested.
SECONDS = st.sampled_from([0.25, 0.5, 1.0, 1.5, 0.1 + 0.2, 2.0 / 3.0])
BYTES = st.sampled_from([0.0, 1.0, 2.5, 4.0, 10.0])


@st.composite
def problems(draw):
    nd = draw(st.integers(1, 4))
    S = draw(st.integers(1, 8))
    M = draw(st.integers(1, 8))
    devices = draw(st.lists(st.integers(0, nd - 1), min_size=S, max_size=S))
    stages = [
        StageCost(
            device=devices[s],
            f=draw(SECONDS),
            i=draw(SECONDS),
            w=draw(SECONDS),
            act=draw(BYTES),
            wact=draw(BYTES),
            lag_next=draw(st.sampled_from([0.0, 0.05, 0.5])) if s < S - 1 else 0.0,
            overhead=draw(st.sampled_from([0.0, 0.01])),
        )
        for s in range(S)
    ]
    budget = draw(st.none() | st.lists(BYTES.map(lambda b: 2 * b), min_size=nd, max_size=nd))
    rules = Rules(
        inflight=tuple(draw(st.lists(st.integers(0, M + 1), min_size=S, max_size=S))),
        split_backward=draw(st.booleans()),
        defer_w=draw(st.booleans()),
        backward_first=draw(st.booleans()),
        oldest_first=draw(st.booleans()),
        memory_budget=tuple(budget) if budget is not None else None,
        reduce_early=draw(st.booleans()),
        tail_w=draw(st.none() | st.lists(st.integers(0, 3), min_size=nd, max_size=nd).map(tuple)),
    )
    give_up_after = draw(st.sampled_from([math.inf, 3.0, 8.0]))
    return stages, nd, M, rules, give_up_after


@settings(max_examples=300, deadline=None)
@given(problems())
def test_the_compiled_list_scheduler_gives_the_python_loops_schedule(problem):
    compiled = list_schedule(*problem)
    with as_python(list_loop, "schedule_loop", "_to_front"):
        python = list_schedule(*problem)
    assert compiled == python  # every field, each float the same bits (None alike)


def test_a_pipeline_of_many_stages_is_scheduled_alike():
    # A 2-chunk V of 32 devices, 64 microbatches: the size the tuner schedules millions of.
    nd, M = 32, 64
    placement = [*range(nd), *reversed(range(nd))]
    stages = [
        StageCost(d, 1.0 + 0.01 * s, 1.1, 0.7, 3.0, 1.0, 0.02 if s < 2 * nd - 1 else 0.0, 0.01)
        for s, d in enumerate(placement)
    ]
    rules = Rules(inflight=tuple(max(1, 2 * nd - s) for s in range(2 * nd)), reduce_early=True)
    compiled = list_schedule(stages, nd, M, rules)
    with as_python(list_loop, "schedule_loop", "_to_front"):
        assert list_schedule(stages, nd, M, rules) == compiled
    assert sum(len(o) for o in compiled.codes) == 3 * 2 * nd * M


@st.composite
def prefixes_and_speeds(draw):
    # Integer layer work as `min_max_ranges` rounds it (up to 2**40 of the total), some layers
    # equal so that starts tie.
    layer = st.sampled_from([0, 1, 7, 2**20, 2**33, 3 * 2**30])
    layers = draw(st.lists(layer, min_size=1, max_size=40))
    prefix = [0]
    for w in layers:
        prefix.append(prefix[-1] + w)
    speed = st.sampled_from([1.0, 0.5, 2.0, 1.3, 0.7])
    stages = draw(st.integers(1, len(layers)))
    return prefix, draw(st.lists(speed, min_size=stages, max_size=stages))


@settings(max_examples=300, deadline=None)
@given(prefixes_and_speeds())
def test_the_compiled_partition_table_is_the_python_loops(case):
    compiled = partition._prefix_bottlenecks(*case)
    with as_python(partition_loop, "next_row"):
        assert partition._prefix_bottlenecks(*case) == compiled


def test_octopipe_compiled_0_leaves_the_loops_as_python():
    script = (
        "from octopipe.schedules import list_loop; from octopipe.compiled import python_of; "
        "print(python_of(list_loop.schedule_loop) is list_loop.schedule_loop)"
    )
    env = {**os.environ, "OCTOPIPE_COMPILED": "0"}
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.stdout.strip() == "True", out.stderr


def test_wrong_caps_are_refused_before_the_loop():
    stage = StageCost(0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0)
    with pytest.raises(ValueError, match="2 in-flight caps for 1 stages"):
        list_schedule([stage], 1, 2, Rules(inflight=(1, 1)))
