"""The rank spawner: every spawned process starts with the shared environment."""

import os

import pytest

from octopipe.runtime.launch.launcher import CHILD_ENVIRONMENT, RankFailure, spawn_ranks

pytestmark = pytest.mark.slow  # real process groups: the full suite, not `-m "not slow"`


def report_environment(rank, world, store):
    return {k: os.environ.get(k) for k in CHILD_ENVIRONMENT}, rank, world


def fail(rank, world, store):
    raise ValueError("boom in the body")


@pytest.mark.timeout(120)
def test_children_get_the_shared_environment_unless_the_user_set_it(monkeypatch):
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    env, rank, world = spawn_ranks(report_environment, (), 2)
    assert env == CHILD_ENVIRONMENT and (rank, world) == (0, 2)  # rank 0 answers
    assert "GLIBC_TUNABLES" not in os.environ  # the parent's own environment is left as it was

    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1")
    env, _, _ = spawn_ranks(report_environment, (), 1)
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.trim_threshold=1"


@pytest.mark.timeout(120)
def test_a_failing_body_is_raised_with_its_traceback():
    with pytest.raises(RankFailure, match="boom in the body"):
        spawn_ranks(fail, (), 2)
