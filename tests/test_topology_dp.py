"""Topology (nodes and their links) and data parallelism in the profile and the simulator.

Closed forms from docs/FORMATS.md: a transfer takes the intra- or inter-node link by whether
its two devices share a node; with D replicas a stage's gradients take a ring all-reduce of
2 (D-1) L + 2 (D-1)/D * G / B, starting when the stage's last backward ends, one reduction at
a time per device, beside compute.
"""

from __future__ import annotations

import json

import pytest
from sim_helpers import one_f_one_b, uniform_profile

from octopipe.actions import Action
from octopipe.errors import InputError
from octopipe.plan import make_plan
from octopipe.profile import DataParallel, Device, Link, Links, load_profile, profile_from_dict
from octopipe.sim import simulate


def with_grads(profile, grad_bytes: int, dp: DataParallel):
    layers = tuple(l.model_copy(update={"grad_bytes": grad_bytes}) for l in profile.layers)
    return profile.model_copy(update={"layers": layers, "data_parallel": dp})


def test_ring_allreduce_formula():
    dp = DataParallel(degree=4, bandwidth=1e9, latency=1e-5)
    assert dp.allreduce_time(2e9) == pytest.approx(2 * 3 * 1e-5 + 2 * 3 / 4 * 2.0)
    assert DataParallel(degree=1, bandwidth=1.0).allreduce_time(1e9) == 0.0


def test_one_stage_ends_with_its_reduction():
    # One device, one stage: F then B per microbatch, 2 s each, then the all-reduce.
    profile = with_grads(
        uniform_profile(1, f=1.0, b=0.5, w=0.5, devices=1),
        grad_bytes=1000,
        dp=DataParallel(degree=2, bandwidth=1000.0, latency=0.25),
    )
    plan = one_f_one_b(1, 3)
    base = simulate(uniform_profile(1, f=1.0, b=0.5, w=0.5, devices=1), plan)
    result = simulate(profile, plan)
    reduce = 2 * 1 * 0.25 + 2 * 1 / 2 * 1000 / 1000.0  # 1.5 s
    assert base.iteration_time == pytest.approx(6.0)
    assert result.iteration_time == pytest.approx(6.0 + reduce)
    (r,) = result.reductions
    assert (r.device, r.stage, r.start, r.end) == (0, 0, pytest.approx(6.0), pytest.approx(7.5))
    assert result.busy == base.busy  # busy counts compute only


def test_an_early_reduction_hides_under_the_remaining_compute():
    # Two stages on one device: stage 1's backward ends first, its reduction overlaps the rest.
    profile = with_grads(
        uniform_profile(2, f=1.0, b=1.0, w=0.0, devices=1),
        grad_bytes=100,
        dp=DataParallel(degree=2, bandwidth=100.0),  # 1 s per stage
    )
    order = ["0F0", "1F0", "1B0", "0B0"]
    plan = make_plan(1, 1, [(0, 1), (1, 2)], [0, 0], {0: [Action.parse(a) for a in order]})
    result = simulate(profile, plan)
    # Compute ends at 4; stage 1's reduction runs 3-4, stage 0's 4-5.
    assert [(r.stage, r.start, r.end) for r in result.reductions] == [(1, 3.0, 4.0), (0, 4.0, 5.0)]
    assert result.iteration_time == pytest.approx(5.0)


def test_one_replica_or_no_gradient_bytes_leave_results_exactly_as_before():
    plan = one_f_one_b(4, 8, split=True)
    base = simulate(uniform_profile(4, devices=4), plan)
    for profile in (
        with_grads(uniform_profile(4, devices=4), 10**9, DataParallel(degree=1, bandwidth=1.0)),
        with_grads(uniform_profile(4, devices=4), 0, DataParallel(degree=8, bandwidth=1.0)),
    ):
        result = simulate(profile, plan)
        assert result == base and result.reductions == ()


def test_transfers_take_the_link_of_the_nodes_they_cross():
    fast, slow = Link(bandwidth=1e12, latency=0.0), Link(bandwidth=1e12, latency=0.5)
    devices = (Device(node=0), Device(node=0), Device(node=1))
    profile = uniform_profile(3, w=0.0, b=1.0).model_copy(
        update={"devices": devices, "links": Links(intra_node=fast, inter_node=slow)}
    )
    plan = one_f_one_b(3, 1)
    # F chain 0 -> 1 (same node, free) -> 2 (other node, +0.5), and the gradient back likewise.
    assert simulate(profile, plan).iteration_time == pytest.approx(6.0 + 2 * 0.5)
    flat = profile.model_copy(update={"links": None})
    assert simulate(flat, plan).iteration_time == pytest.approx(6.0)


def test_new_keys_round_trip_and_old_profiles_are_written_as_before(tmp_path):
    old = uniform_profile(2, devices=2)
    assert set(old.to_dict()) == {"format", "name", "layers", "devices", "link"}
    assert "grad_bytes" not in old.to_dict()["layers"][0]
    assert "node" not in old.to_dict()["devices"][0]
    new = with_grads(old, 64, DataParallel(degree=3, bandwidth=2e9, latency=1e-6)).model_copy(
        update={
            "devices": (Device(node=0), Device(node=1)),
            "links": Links(intra_node=Link(bandwidth=1e11), inter_node=Link(bandwidth=1e10)),
        }
    )
    path = tmp_path / "p.json"
    path.write_text(json.dumps(new.to_dict()))
    assert load_profile(path) == new


@pytest.mark.parametrize(
    "patch, place",
    [
        ({"data_parallel": {"degree": 0}}, "data_parallel.degree"),
        ({"data_parallel": {"degree": 2, "bandwidth": -1}}, "data_parallel.bandwidth"),
        ({"links": {"intra_node": {"bandwidth": 1e9}}}, "links.inter_node"),
    ],
)
def test_bad_topology_keys_give_one_line(patch, place):
    data = {**uniform_profile(2).to_dict(), **patch}
    with pytest.raises(InputError, match=place.replace(".", r"\.")):
        profile_from_dict(data, "p.json")


def test_the_cost_model_fills_gradient_bytes_per_tensor_parallel_rank():
    from octopipe.api import profile_from_config
    from octopipe.costmodel.build import parameter_count
    from octopipe.costmodel.hf_config import load_architecture

    tp1 = profile_from_config("llama3-8b", seq_len=1024)
    tp2 = profile_from_config("llama3-8b", seq_len=1024, tp=2)
    params = parameter_count(load_architecture("llama3-8b"))
    assert sum(l.grad_bytes for l in tp1.layers) == 2 * params  # bf16 gradients
    # Every layer: its own rank's parameters x 2 bytes, i.e. 2 of param_bytes' 16 per parameter.
    assert all(16 * l.grad_bytes == 2 * l.param_bytes for l in (*tp1.layers, *tp2.layers))
    decoder = next(i for i, l in enumerate(tp1.layers) if l.kind == "decoder")
    # Split in two by TP, but for the norms each rank keeps whole.
    half = tp1.layers[decoder].grad_bytes / 2
    assert half <= tp2.layers[decoder].grad_bytes <= 1.001 * half


def test_simulate_reports_the_exposed_reduction(tmp_path, capsys):
    from octopipe.cli import main
    from octopipe.plan import save_plan
    from octopipe.profile import save_profile

    profile = with_grads(
        uniform_profile(1, f=1.0, b=0.5, w=0.5, devices=1),
        grad_bytes=1000,
        dp=DataParallel(degree=2, bandwidth=1000.0, latency=0.25),
    )
    save_profile(profile, tmp_path / "p.json")
    save_plan(one_f_one_b(1, 3), tmp_path / "plan.json")
    argv = [
        "simulate",
        "--profile",
        str(tmp_path / "p.json"),
        "--plan",
        str(tmp_path / "plan.json"),
    ]
    assert main(argv) == 0
    text = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
    assert "1.500 s of it after the last compute action" in text
    assert main([*argv, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["iteration_time"] == pytest.approx(7.5)
    assert summary["reductions"] == [{"device": 0, "stage": 0, "start": 6.0, "end": 7.5}]


# --- gradient buckets (data_parallel.bucket_bytes) -------------------------------------------


def one_stage_two_layers(bucket_bytes: int | None, split: bool = False):
    """One device, one stage of two layers (f = b = w = 1 s, 100 gradient bytes each), one
    microbatch, two replicas at 100 B/s: a 100-byte reduction takes 1 s."""
    dp = DataParallel(degree=2, bandwidth=100.0, bucket_bytes=bucket_bytes)
    profile = with_grads(uniform_profile(2, devices=1), grad_bytes=100, dp=dp)
    kinds = ["I", "W"] if split else ["B"]
    order = [Action(0, "F", 0), *(Action(0, k, 0) for k in kinds)]
    return profile, make_plan(1, 1, [(0, 2)], [0], {0: order})


@pytest.mark.parametrize(
    "bucket_bytes, windows",
    [
        (None, [(6.0, 8.0)]),  # one reduction after the backward (F 0-2, B 2-6)
        (400, [(6.0, 8.0)]),  # a bucket larger than the stage: the same
        (100, [(4.0, 5.0), (6.0, 7.0)]),  # layer 1's gradients are done at 4 s
        (50, [(3.0, 3.5), (4.0, 4.5), (5.0, 5.5), (6.0, 6.5)]),  # half a layer each
    ],
)
def test_buckets_reduce_as_the_backward_fills_them(bucket_bytes, windows):
    profile, plan = one_stage_two_layers(bucket_bytes)
    result = simulate(profile, plan)
    got = [(r.start, r.end) for r in result.reductions]
    assert got == [(pytest.approx(a), pytest.approx(b)) for a, b in windows]
    assert result.iteration_time == pytest.approx(max(6.0, windows[-1][1]))


def test_buckets_under_a_split_backward_fill_during_w():
    # F 0-2, I 2-4, W 4-6 (layer 1's weights first): 100-byte buckets ready at 5 s and 6 s.
    profile, plan = one_stage_two_layers(100, split=True)
    got = [(r.start, r.end) for r in simulate(profile, plan).reductions]
    assert got == [
        (pytest.approx(5.0), pytest.approx(6.0)),
        (pytest.approx(6.0), pytest.approx(7.0)),
    ]


def test_buckets_in_overlapped_steps_and_in_the_tuner_match_the_simulator():
    from octopipe.tuner.candidate import Candidate, Evaluator

    profile, plan = one_stage_two_layers(50)
    sync = simulate(profile, plan)
    steady = simulate(profile, plan, overlap_steps=True)
    assert steady.steady.first_step_time == pytest.approx(sync.iteration_time)
    # Steps back to back: the next F waits for the last bucket (6.5 s per step), not 8 s.
    assert steady.iteration_time == pytest.approx(6.5)
    evaluator = Evaluator(profile, profile.device_list(), 1)
    for split in (False, True):
        candidate = Candidate(((0, 2),), (0,), split_backward=split)
        plan_of = evaluator.to_plan(evaluator.evaluate(candidate))
        assert evaluator.evaluate(candidate).makespan == pytest.approx(
            simulate(profile, plan_of).iteration_time
        )


def test_a_sharded_optimizer_reduce_scatters_half_the_traffic():
    dp = DataParallel(degree=4, bandwidth=1e9, latency=1e-5, sharded=True)
    full = DataParallel(degree=4, bandwidth=1e9, latency=1e-5)
    assert dp.allreduce_time(2e9) == pytest.approx(full.allreduce_time(2e9) / 2)
    assert dp.allgather_time(2e9) == pytest.approx(3 * 1e-5 + 3 / 4 * 2.0)


def test_bucket_and_sharding_keys_round_trip_and_stay_optional(tmp_path):
    profile, _ = one_stage_two_layers(50)
    data = profile.to_dict()
    assert data["data_parallel"]["bucket_bytes"] == 50 and "sharded" not in data["data_parallel"]
    assert profile_from_dict(data) == profile
    plain, _ = one_stage_two_layers(None)
    assert "bucket_bytes" not in plain.to_dict()["data_parallel"]
    with pytest.raises(InputError, match="bucket_bytes"):
        profile_from_dict({**data, "data_parallel": {**data["data_parallel"], "bucket_bytes": 0}})


def test_reductions_at_end_wait_for_the_devices_last_action():
    # Two stages on one device (test above): stage 1's reduction would hide under stage 0's
    # backward; at the end, both run after the last action (4 s), one at a time: 4-5, 5-6.
    dp = DataParallel(degree=2, bandwidth=100.0, at_end=True)
    profile = with_grads(uniform_profile(2, f=1.0, b=1.0, w=0.0, devices=1), 100, dp)
    order = ["0F0", "1F0", "1B0", "0B0"]
    plan = make_plan(1, 1, [(0, 1), (1, 2)], [0, 0], {0: [Action.parse(a) for a in order]})
    result = simulate(profile, plan)
    assert [(r.stage, r.start, r.end) for r in result.reductions] == [
        (0, pytest.approx(4.0), pytest.approx(5.0)),
        (1, pytest.approx(5.0), pytest.approx(6.0)),
    ]
    steady = simulate(profile, plan, overlap_steps=True)
    assert steady.iteration_time == pytest.approx(6.0)  # 4 s of compute, then 2 s reducing
    from octopipe.tuner.candidate import Candidate, Evaluator

    evaluator = Evaluator(profile, profile.device_list(), 1)
    outcome = evaluator.evaluate(Candidate(((0, 1), (1, 2)), (0, 0), split_backward=False))
    assert outcome.makespan == pytest.approx(
        simulate(profile, evaluator.to_plan(outcome)).iteration_time
    )


def test_blocking_transfers_hold_the_sender_and_arrive_when_it_is_done():
    # Two devices, one layer each (f = b = w = 1 s), a 0.5 s transfer, one microbatch.
    # Overlapped: F0 0-1, F1 1.5-2.5, B1 2.5-4.5, B0 5-7. Blocking: the senders' F0 and B1
    # last 0.5 s longer and the data is there when they end: F0 0-1.5, F1 1.5-2.5,
    # B1 2.5-5, B0 5-7 -- the same makespan here, but the sender is busy, not free.
    link = Link(bandwidth=2.0, latency=0.0)  # out_bytes 1 -> 0.5 s
    overlapped = uniform_profile(2, devices=2, link=link)
    blocking = overlapped.model_copy(update={"blocking_transfers": True})
    plan = one_f_one_b(2, 1)
    a, b = simulate(overlapped, plan), simulate(blocking, plan)
    assert a.iteration_time == pytest.approx(7.0) == b.iteration_time
    assert b.busy == (pytest.approx(a.busy[0] + 0.5), pytest.approx(a.busy[1] + 0.5))
    # With two microbatches the held senders cost time: F0 of the second microbatch waits.
    plan2 = one_f_one_b(2, 2)
    assert simulate(blocking, plan2).iteration_time > simulate(overlapped, plan2).iteration_time
    assert profile_from_dict(blocking.to_dict()) == blocking
    assert "blocking_transfers" not in overlapped.to_dict()
