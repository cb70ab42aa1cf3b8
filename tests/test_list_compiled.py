"""The compiled list scheduler gives the Python loop's schedule bit for bit: the same orders,
times, peaks and memory waits (and gives up, or not, alike) for any stages, placement and
rules; the tuner and the search take it wherever numba imports."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from octopipe.costs import StageCost
from octopipe.schedules import list_scheduler
from octopipe.schedules.list_scheduler import Rules, _run, list_schedule

compiled = pytest.importorskip("octopipe.schedules.list_compiled")

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
def test_the_compiled_loop_gives_the_python_loops_schedule(problem):
    stages, nd, M, rules, give_up_after = problem
    python = _run(stages, nd, M, rules, give_up_after)
    ours = compiled.list_schedule_compiled(stages, nd, M, rules, give_up_after)
    assert ours == python  # every field, each float the same bits (None alike)


def test_a_pipeline_of_many_stages_gives_the_same_schedule():
    # A 2-chunk V of 32 devices, 64 microbatches: the size the tuner schedules millions of.
    nd, M = 32, 64
    placement = [*range(nd), *reversed(range(nd))]
    stages = [
        StageCost(d, 1.0 + 0.01 * s, 1.1, 0.7, 3.0, 1.0, 0.02 if s < 2 * nd - 1 else 0.0, 0.01)
        for s, d in enumerate(placement)
    ]
    rules = Rules(inflight=tuple(max(1, 2 * nd - s) for s in range(2 * nd)), reduce_early=True)
    ours = compiled.list_schedule_compiled(stages, nd, M, rules, math.inf)
    assert ours == _run(stages, nd, M, rules, math.inf)
    assert sum(len(o) for o in ours.codes) == 3 * 2 * nd * M


def test_the_scheduler_takes_the_compiled_loop_unless_told_not_to():
    assert list_scheduler._compiled() is compiled.list_schedule_compiled
    script = "from octopipe.schedules import list_scheduler as ls; print(ls._compiled() is None)"
    env = {**os.environ, "OCTOPIPE_COMPILED": "0"}
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.stdout.strip() == "True", out.stderr


def test_wrong_caps_are_refused_before_either_loop():
    stage = StageCost(0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0)
    with pytest.raises(ValueError, match="2 in-flight caps for 1 stages"):
        list_schedule([stage], 1, 2, Rules(inflight=(1, 1)))
