"""A rank that raises brings the whole run down promptly, with its own error, leaving nothing."""

import multiprocessing as mp

import pytest
from executor_helpers import gpipe, one_f_one_b

from octopipe.runtime.job.run_config import Job, RunConfig
from octopipe.runtime.launch.launcher import RankFailure, launch

pytestmark = pytest.mark.slow  # real process groups: the full suite, not `-m "not slow"`


@pytest.mark.timeout(90)
def test_a_raising_rank_stops_every_rank_with_the_original_error():
    # layers.3 is layer 4 of 8: rank 2 of 4 holds it; the others block on transfers with it.
    job = Job(one_f_one_b(4, 4), RunConfig("executor_helpers:failing_model", steps=2))
    with pytest.raises(RankFailure) as caught:
        launch([job], 4, "gloo", timeout_s=60)
    assert "rank 2 failed" in str(caught.value)
    assert "RuntimeError: boom: injected failure in layers.3" in str(caught.value)
    assert len(caught.value.exit_codes) == 4
    assert all(code not in (None, 0) for code in caught.value.exit_codes)
    assert mp.active_children() == []


@pytest.mark.timeout(60)
def test_a_failure_in_a_later_job_still_stops_everything():
    good = Job(gpipe(2, 2), RunConfig("executor_helpers:toy_model"))
    bad = Job(gpipe(2, 2), RunConfig("executor_helpers:failing_model"))
    with pytest.raises(RankFailure, match="boom"):
        launch([good, bad], 2, "gloo", timeout_s=60)
    assert mp.active_children() == []
