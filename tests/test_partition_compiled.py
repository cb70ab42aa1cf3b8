"""The compiled prefix bottlenecks (`partition_compiled.py`) give the Python loop's table bit
for bit, so the min-max partitioner splits alike with numba or without."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from octopipe import partition

compiled = pytest.importorskip("octopipe.partition_compiled")


def python_table(prefix, speeds):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(partition, "compiled", lambda module, name: None)
        return partition._prefix_bottlenecks(prefix, speeds)


@st.composite
def prefixes_and_speeds(draw):
    # Integer layer work as `min_max_ranges` rounds it (up to 2**40 of the total), some layers
    # equal so that starts tie.
    layers = draw(
        st.lists(st.sampled_from([0, 1, 7, 2**20, 2**33, 3 * 2**30]), min_size=1, max_size=40)
    )
    prefix = [0]
    for w in layers:
        prefix.append(prefix[-1] + w)
    stages = draw(st.integers(1, len(layers)))
    speeds = draw(
        st.lists(st.sampled_from([1.0, 0.5, 2.0, 1.3, 0.7]), min_size=stages, max_size=stages)
    )
    return prefix, speeds


@settings(max_examples=300, deadline=None)
@given(prefixes_and_speeds())
def test_the_compiled_table_is_the_python_one(case):
    prefix, speeds = case
    assert compiled.prefix_bottlenecks(prefix, speeds) == python_table(prefix, speeds)


def test_the_partitioner_takes_the_compiled_table():
    assert partition.compiled("octopipe.partition_compiled", "prefix_bottlenecks") is (
        compiled.prefix_bottlenecks
    )
    work = [0.0, 1.0, 3.0, 4.5, 8.0, 9.0, 12.0]
    fast = partition.min_max_ranges(work, [1.0, 2.0, 1.0])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(partition, "compiled", lambda module, name: None)
        assert partition.min_max_ranges(work, [1.0, 2.0, 1.0]) == fast
