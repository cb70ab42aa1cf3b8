"""`max_chunks=None` (`--max-chunks auto`): deeper interleaving while it pays, never a loss."""

import math

from sim_helpers import uniform_profile

from octopipe.profile import Link
from octopipe.tuner import tune
from octopipe.tuner.search import chunk_count

FREE_LINK = Link(bandwidth=1e12, latency=0.0)


def tuned(num_layers, devices, microbatches, max_chunks):
    profile = uniform_profile(num_layers, devices=devices, link=FREE_LINK)
    return tune(profile, microbatches, devices, time_budget=math.inf, max_chunks=max_chunks).best


def test_many_cheap_layers_interleave_deeper_than_the_default_cap():
    capped, deeper = tuned(64, 4, 8, 4), tuned(64, 4, 8, None)
    assert chunk_count(capped.plan.placement) <= 4
    assert chunk_count(deeper.plan.placement) > 4
    assert deeper.sim.iteration_time < capped.sim.iteration_time


def test_where_deeper_does_not_pay_the_result_stays_the_capped_one():
    for layers, devices, microbatches in [(48, 4, 4), (40, 2, 2)]:
        capped = tuned(layers, devices, microbatches, 4)
        auto = tuned(layers, devices, microbatches, None)
        assert auto.sim.iteration_time == capped.sim.iteration_time
        assert chunk_count(auto.plan.placement) == chunk_count(capped.plan.placement) < 4
