"""The tuner on a cluster: node-aware cuts and W orders that hide data-parallel all-reduces.

Closed forms under docs/FORMATS.md's rules: a stage's all-reduce starts when its last B or W
ends; a transfer between nodes takes `links.inter_node`.
"""

from __future__ import annotations

import pytest
from sim_helpers import uniform_profile

from octopipe.api import baseline, profile_from_config, simulate, tune
from octopipe.profile import DataParallel, Device, Link, Links
from octopipe.sim import Simulator
from octopipe.tuner.candidate import Candidate, Evaluator


def one_device_two_stages_with_a_heavy_last_stage():
    """Two one-layer stages on one device (f = i = w = 1 s), two microbatches; only stage 1
    has gradients: a 3 s all-reduce (2 replicas, 300 bytes at 100 B/s)."""
    profile = uniform_profile(2, f=1.0, b=1.0, w=1.0, devices=1)
    layers = list(profile.layers)
    layers[1] = layers[1].model_copy(update={"grad_bytes": 300})
    dp = DataParallel(degree=2, bandwidth=100.0)
    return profile.model_copy(update={"layers": tuple(layers), "data_parallel": dp})


@pytest.mark.parametrize("early, iteration", [(False, 14.0), (True, 12.0)])
def test_running_a_finished_stages_w_first_hides_its_reduction(early, iteration):
    # 12 s of compute. Deferred W run oldest first: stage 1's last W ends at 11 s, its 3 s
    # all-reduce sticks out to 14 s. reduce_early runs stage 1's W right after its last I:
    # they end at 9 s and the all-reduce ends at 12 s, under stage 0's last I and its W.
    profile = one_device_two_stages_with_a_heavy_last_stage()
    evaluator = Evaluator(profile, profile.device_list(1), 2)
    cand = Candidate(((0, 1), (1, 2)), (0, 0), warmup=3.0, reduce_early=early)
    outcome = evaluator.evaluate(cand)
    result = Simulator(profile).run(evaluator.to_plan(outcome))
    assert outcome.schedule.makespan == pytest.approx(12.0)
    assert outcome.makespan == pytest.approx(iteration)
    assert result.iteration_time == pytest.approx(iteration)
    (r,) = result.reductions
    assert r.end == pytest.approx(iteration) and r.end - r.start == pytest.approx(3.0)


def test_the_tuner_finds_the_order_that_hides_the_reduction():
    profile = one_device_two_stages_with_a_heavy_last_stage()
    # One device holding two one-layer stages: the search must use the chunked placement.
    result = tune(profile, 2, max_chunks=2, time_budget=20.0, with_baselines=False)
    assert result.best.sim.iteration_time == pytest.approx(12.0)


def test_the_evaluator_counts_reductions_as_the_simulator_does():
    profile = profile_from_config("llama3-8b", devices=4, seq_len=1024)
    profile = profile.model_copy(
        update={"data_parallel": DataParallel(degree=8, bandwidth=25e9, latency=1e-5)}
    )
    evaluator = Evaluator(profile, profile.device_list(), 8)
    n = profile.num_layers
    cuts = [0, 9, 17, 26, n]
    looped = [0, 1, 2, 3] * 2
    ranges8 = [(i * n // 8, (i + 1) * n // 8) for i in range(8)]
    for cand in (
        Candidate(tuple(zip(cuts, cuts[1:])), (0, 1, 2, 3)),
        Candidate(tuple(ranges8), tuple(looped), reduce_early=True),
        Candidate(tuple(ranges8), tuple(looped), reduce_early=False, defer_w=False),
    ):
        outcome = evaluator.evaluate(cand)
        result = Simulator(profile).run(evaluator.to_plan(outcome))
        assert result.reductions  # the case has all-reduces to count
        assert outcome.makespan == pytest.approx(result.iteration_time, rel=1e-9)


def two_node_profile(same_node: bool):
    """Four layers (3 s of work each) on two devices; the boundary after layer 1 (the balanced
    cut) carries 30 GB, the one after layer 2 one byte, at 1 GB/s between nodes."""
    profile = uniform_profile(4, f=1.0, b=1.0, w=1.0, devices=2)
    out = [30e9, 30e9, 1, 30e9]
    layers = tuple(
        layer.model_copy(update={"out_bytes": int(o)}) for layer, o in zip(profile.layers, out)
    )
    nodes = (0, 0) if same_node else (0, 1)
    links = Links(intra_node=Link(), inter_node=Link(bandwidth=1e9))
    return profile.model_copy(
        update={
            "layers": layers,
            "devices": tuple(Device(node=n) for n in nodes),
            "links": links,
        }
    )


def stage_cuts(plan):
    return [s.end for s in plan.stages[:-1]]


def test_across_nodes_the_tuner_cuts_at_the_light_boundary():
    # Within a node the balanced cut (2 | 2) is free; across nodes each of its 16 transfers
    # costs 30 s, so the 3 | 1 cut at the one-byte boundary wins despite its imbalance.
    options = dict(max_chunks=1, time_budget=20.0, with_baselines=False)
    near = tune(two_node_profile(same_node=True), 8, **options)
    far_profile = two_node_profile(same_node=False)
    far = tune(far_profile, 8, **options)
    assert stage_cuts(near.best.plan) == [2]
    assert stage_cuts(far.best.plan) == [3]
    balanced = baseline(far_profile, "1f1b", "balanced", num_microbatches=8)
    assert stage_cuts(balanced) == [2]
    assert far.best.sim.iteration_time < simulate(far_profile, balanced).iteration_time
