"""Exports: the schedule CSV loads in PyTorch's runtime; the torchtitan 0.2 fragment is valid
TOML (the 0.3 config module: test_export_titan.py)."""

from __future__ import annotations

import math
import tomllib
from itertools import pairwise
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

from octopipe.api import baseline
from octopipe.engines.torchtitan import (
    module_fqns_per_model_part,
    to_toml,
    toml_string,
    write_torchtitan_toml,
)
from octopipe.plan import save_schedule_csv
from octopipe.profile import Device, LayerCost, Profile
from octopipe.tuner import tune


def profile(names=None, **keys) -> Profile:
    if names is None:
        names = ["tok_embeddings", *(f"layers.{i}" for i in range(9)), "norm", "output"]
    layers = tuple(
        LayerCost(
            name=n,
            f=1.0 + (n == "output") * 2,
            b=1.0,
            w=0.5,
            act_bytes=10,
            wact_bytes=5,
            param_bytes=100,
            out_bytes=1,
        )
        for n in names
    )
    return Profile(**{"name": "toy", "layers": layers, "devices": (Device(),) * 3, **keys})


def torchtitan_toml(plan, prof, tmp_path) -> tuple[dict, str]:
    """The written fragment, parsed and as text."""
    path = tmp_path / "torchtitan.toml"
    write_torchtitan_toml(plan, prof, path, "schedule.csv")
    text = path.read_text(encoding="utf-8")
    return tomllib.loads(text), text


def two_device_plan(prof):
    return baseline(prof, "1f1b", "uniform", num_microbatches=4, num_devices=2)


@pytest.fixture(scope="module")
def tuned():
    prof = profile()
    return prof, tune(prof, 6, 3, max_chunks=3, time_budget=math.inf).best.plan


def stand_in_stages(num_stages: int, num_ranks: int, rank: int, stage_ids):
    """What the runtime reads from its stages before a step: no model, no process group."""
    return [
        SimpleNamespace(
            num_stages=num_stages,
            group_size=num_ranks,
            group_rank=rank,
            stage_index=i,
            stage_index_to_group_rank=None,
        )
        for i in stage_ids
    ]


def test_csv_loads_in_pytorch_runtime_with_the_same_actions(tuned, tmp_path):
    _prof, plan = tuned
    path = tmp_path / "schedule.csv"
    save_schedule_csv(plan, path)
    for rank in range(plan.num_devices):
        runtime = _PipelineScheduleRuntime(
            stand_in_stages(plan.num_stages, plan.num_devices, rank, plan.stages_on(rank)),
            plan.num_microbatches,
        )
        runtime._load_csv(str(path))
        loaded = {r: [str(a) for a in acts] for r, acts in runtime.pipeline_order.items()}
        assert loaded == {d: [str(a) for a in plan.schedule[d]] for d in range(plan.num_devices)}
        # The runtime infers the same placement from the actions, and lowers them with comms.
        assert runtime.stage_index_to_group_rank == dict(enumerate(plan.placement))
        assert len(runtime.pipeline_order_with_comms[rank]) > len(plan.schedule[rank])


def test_torchtitan_fragment_names_every_layer_once_in_stage_order(tuned, tmp_path):
    prof, plan = tuned
    path = tmp_path / "torchtitan.toml"
    write_torchtitan_toml(
        plan, prof.model_copy(update={"microbatch_size": 2}), path, "schedule.csv"
    )
    doc = tomllib.loads(path.read_text(encoding="utf-8"))
    par = doc["parallelism"]
    assert par["pipeline_parallel_degree"] == plan.num_devices
    assert par["pipeline_parallel_schedule_csv"] == "schedule.csv"
    assert par["pipeline_parallel_microbatch_size"] == 2
    parts = par["module_fqns_per_model_part"]
    assert parts == module_fqns_per_model_part(plan, prof)
    assert len(parts) == plan.num_stages
    assert [name for part in parts for name in part] == [layer.name for layer in prof.layers]
    # torchtitan: microbatches = local_batch_size / pipeline_parallel_microbatch_size.
    assert doc["training"]["local_batch_size"] // 2 == plan.num_microbatches


def test_toml_writer_escapes_strings():
    text = to_toml({"a": {"s": 'x "y" \\ z', "n": 3, "l": [["p"], []]}})
    assert tomllib.loads(text) == {"a": {"s": 'x "y" \\ z', "n": 3, "l": [["p"], []]}}


def test_microbatch_size_comes_from_the_plan_first_then_the_profile(tmp_path):
    prof = profile(devices=None, microbatch_size=3)
    plan = two_device_plan(prof)
    for source, size in [(plan.with_shape(tp=1, dp=1, microbatch_size=5), 5), (plan, 3)]:
        doc, text = torchtitan_toml(source, prof, tmp_path)
        assert doc["parallelism"]["pipeline_parallel_microbatch_size"] == size
        assert doc["training"]["local_batch_size"] == 4 * size
        assert "was assumed" not in text


def test_unknown_microbatch_size_is_taken_as_1_and_said_so(tmp_path):
    prof = profile(devices=None)
    doc, text = torchtitan_toml(two_device_plan(prof), prof, tmp_path)
    assert doc["parallelism"]["pipeline_parallel_microbatch_size"] == 1
    assert doc["training"]["local_batch_size"] == 4
    assert "# The profile does not record its microbatch size, so 1 was assumed" in text
    assert "# For torchtitan up to 0.2 (TOML job files); for 0.3, see octopipe_torchtitan" in text


def test_tp_and_dp_degrees_come_from_the_plan_first_then_the_profile(tmp_path):
    prof = profile(devices=None, tensor_parallel=2, data_parallel={"degree": 3}, microbatch_size=2)
    plan = two_device_plan(prof)
    for source, (tp, dp) in [
        (plan.with_shape(tp=4, dp=5, microbatch_size=2), (4, 5)),
        (plan, (2, 3)),
    ]:
        doc, _ = torchtitan_toml(source, prof, tmp_path)
        par = doc["parallelism"]
        assert (par["tensor_parallel_degree"], par["data_parallel_replicate_degree"]) == (tp, dp)
        assert par["data_parallel_shard_degree"] == 1  # whole replicas, no FSDP
        assert doc["training"]["global_batch_size"] == doc["training"]["local_batch_size"] * dp
    bare = profile(devices=None)
    doc, _ = torchtitan_toml(two_device_plan(bare), bare, tmp_path)
    assert doc["parallelism"]["tensor_parallel_degree"] == 1
    assert doc["parallelism"]["data_parallel_replicate_degree"] == 1


def test_toml_string_escapes_only_what_toml_requires():
    assert toml_string('a"b\\c') == '"a\\"b\\\\c"'
    assert toml_string("\x00\b\t\n\f\r\x1f\x7f") == '"\\u0000\\b\\t\\n\\f\\r\\u001F\\u007F"'
    assert toml_string("é😀\x85") == '"é😀\x85"'  # no surrogate pairs, no escaped non-ASCII


@settings(max_examples=200, deadline=None)
@given(name=st.text(), layer_names=st.lists(st.text(), min_size=2, max_size=4))
def test_any_names_give_valid_toml_that_reads_back(tmp_path_factory, name, layer_names):
    prof = profile(layer_names, name=name, devices=None)
    doc, text = torchtitan_toml(two_device_plan(prof), prof, tmp_path_factory.mktemp("t"))
    parts = doc["parallelism"]["module_fqns_per_model_part"]
    assert [n for part in parts for n in part] == layer_names
    # The header comment names the profile as a TOML string, on one line.
    first = text.split("\n")[0]
    quoted = first.removeprefix("# torchtitan settings for an OctoPipe plan of profile ")
    assert tomllib.loads(f"name = {quoted}")["name"] == name
    assert tomllib.loads(to_toml({"a": {"s": name}})) == {"a": {"s": name}}


def test_torchtitan_style_and_schedule_name_follow_the_placement(tmp_path):
    from octopipe.placement import interleaved, torchtitan_style, v_shape
    from octopipe.plan import make_plan

    assert torchtitan_style(interleaved(range(3), 2), 3) == "loop"
    assert torchtitan_style(v_shape(range(3), 2), 3) == "v"
    assert torchtitan_style(v_shape(range(3), 4), 3) is None  # torchtitan's V has two per rank
    assert torchtitan_style((1, 0, 2), 3) is None
    prof = profile()
    cuts = [0, 2, 4, 6, 8, 10, 12]
    ranges = list(pairwise(cuts))
    for placement, name, warned in [
        (v_shape(range(3), 2), "ZBVZeroBubble", False),
        ((0, 1, 2, 2, 0, 1), "PipelineScheduleMulti", True),
    ]:
        plan = make_plan(3, 2, ranges, placement, {})
        path = tmp_path / "t.toml"
        write_torchtitan_toml(plan, prof, path, "schedule.csv")
        text = path.read_text(encoding="utf-8")
        assert tomllib.loads(text)["parallelism"]["pipeline_parallel_schedule"] == name
        assert ("WARNING" in text) == warned


def test_tuning_for_torchtitan_keeps_to_its_placements():
    from octopipe.placement import torchtitan_style

    prof = profile()
    best = tune(prof, 6, 3, time_budget=math.inf, torchtitan=True).best
    assert torchtitan_style(best.plan.placement, 3) is not None
