"""`--timeout` bounds each wait inside a run (a transfer, a collective), not the whole run."""

import multiprocessing as mp

import pytest
from executor_helpers import gpipe

from octopipe.runtime.job.run_config import Job, RunConfig
from octopipe.runtime.launch.launcher import RankFailure, launch

pytestmark = pytest.mark.slow  # real process groups: the full suite, not `-m "not slow"`

TIMEOUT_S = 3.0  # small, yet above how far apart the ranks start on a loaded machine


@pytest.mark.timeout(90)
def test_a_healthy_run_longer_than_twice_the_timeout_finishes():
    # Once, the launcher gave the whole run timeout x (1 + jobs) = 2 x timeout here.
    steps = 16
    job = Job(gpipe(2, 2), RunConfig("executor_helpers:sleepy_model", steps=steps))
    (result,) = launch([job], 2, "gloo", timeout_s=TIMEOUT_S)
    assert len(result.losses) == steps
    assert sum(result.step_times) > 2 * TIMEOUT_S  # the training alone outlasted that deadline


@pytest.mark.timeout(90)
@pytest.mark.parametrize("order_matched", [False, True], ids=["default-group", "subgroups"])
def test_a_wait_stuck_longer_than_the_timeout_fails_the_run(order_matched):
    # Rank 1 stalls far longer than the timeout; rank 0's wait for its gradients gives up. With
    # `order_matched` the transfers go over per-channel subgroups, which torch would otherwise
    # give a timeout of 30 minutes: the run would wait the stall out and succeed.
    config = RunConfig("executor_helpers:stalling_model", order_matched=order_matched)
    with pytest.raises(RankFailure, match=r"rank \d failed:(.|\n)*[Tt]imed out"):
        launch([Job(gpipe(2, 2), config)], 2, "gloo", timeout_s=TIMEOUT_S)
    assert mp.active_children() == []
