"""Where an MoE layer's communication runs: the experts' gradients on their own ring (the
ranks holding the same experts), the all-to-all's share that leaves the node, and the
all-to-alls hidden behind another microbatch's compute (`--moe-a2a-overlap`)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from moe_configs import moe_work, write_qwen3_moe

from octopipe.cli import main
from octopipe.costmodel.hardware import hardware_preset
from octopipe.costmodel.kernels import EP_NETWORK
from octopipe.layouts import Cluster, Job, JobShape, parse_gpus
from octopipe.layouts.costs import LayoutCosts
from octopipe.layouts.estimate import Given, estimate
from octopipe.layouts.stack import Stack

H100 = hardware_preset("h100")


@pytest.fixture
def qwen3_moe(tmp_path) -> str:
    return write_qwen3_moe(tmp_path)


def _costs(config: str, gpus: int = 16) -> LayoutCosts:
    cluster = Cluster(parse_gpus(str(gpus), "h100"), 8)
    return LayoutCosts(Job(config, cluster, 64, 2048, Stack(), rank_orders=("megatron",)))


def test_expert_gradients_reduce_over_the_ranks_holding_the_same_experts(qwen3_moe):
    costs = _costs(qwen3_moe)
    layout = JobShape(tp=1, pp=1, dp=16, microbatch_size=1, num_microbatches=4, ep=8, zero=1)
    dense = costs.job.cluster.data_parallel_ring(layout)
    experts = costs.expert_ring(layout)
    # EP 8 fills a node: the two ranks holding an expert sit on two nodes, one NIC apart,
    # where the dense ring of 16 consecutive ranks drives a node's 8 NICs at once.
    assert experts.degree == layout.expert_data_parallel == 2
    assert experts.bandwidth == H100.link_bandwidth
    assert dense.bandwidth == min(H100.tp_bandwidth, 8 * H100.link_bandwidth)
    profile, _ = costs.profile(layout)
    estimates = costs.layers(layout)
    moe = next(i for i, e in enumerate(estimates) if e.expert_params)
    e = estimates[moe]
    g = costs.settings(layout).grad_bytes
    per_byte = [(r.degree - 1) / r.degree / r.bandwidth for r in (experts, dense)]
    expected = (e.params - e.expert_params) * g + e.expert_params * g * per_byte[0] / per_byte[1]
    assert profile.layers[moe].grad_bytes == pytest.approx(expected, abs=1)
    assert profile.layers[moe].grad_bytes > e.params * g  # slower than on the dense ring


def test_the_weights_gather_of_zero1_splits_by_ring(qwen3_moe):
    costs = _costs(qwen3_moe)
    layout = JobShape(tp=1, pp=1, dp=16, microbatch_size=1, num_microbatches=4, ep=8, zero=1)
    result = estimate(costs.job, Given(layout))
    profile, _ = costs.profile(layout)
    tail = costs.tail(layout, result.plan, profile)
    params = costs.device_params(layout, result.plan)[0]
    experts = costs.device_params(layout, result.plan, experts=True)[0]
    assert 0 < experts < params
    w = costs.settings(layout).weight_bytes
    expected = profile.data_parallel.allgather_time((params - experts) * w)
    expected += costs.expert_ring(layout).allgather_time(experts * w)
    assert tail.all_gather == pytest.approx(expected)


def test_only_the_copies_bound_for_other_nodes_cross_the_network(qwen3_moe):
    costs = _costs(qwen3_moe)
    layout = JobShape(tp=1, pp=1, dp=16, microbatch_size=1, num_microbatches=1, ep=16)
    assert costs.ep_across_nodes(layout) and costs.ep_node_ranks(layout) == 8

    def network_bytes(node_ranks: int) -> float:
        work = moe_work(
            qwen3_moe, expert_parallel=16, ep_across_nodes=True, ep_node_ranks=node_ranks
        )
        return sum(k.bytes for k in work.kernels if k.unit == EP_NETWORK)

    # 15 peers of which 7 share the node: 8 of 15 peers' copies leave it.
    assert network_bytes(8) == pytest.approx(network_bytes(1) * 8 / 15)


def test_overlapped_all_to_alls_expose_only_what_compute_cannot_cover(qwen3_moe):
    for hw in (H100, replace(H100, tp_bandwidth=4e9)):  # NVLink as is, and slowed 100x
        plain = moe_work(qwen3_moe, expert_parallel=8)
        hidden = moe_work(qwen3_moe, expert_parallel=8, moe_a2a_overlap=True)
        for phase in ("f", "i"):
            p, h = plain.phase(phase, hw), hidden.phase(phase, hw)
            assert p.ep_comm > 0
            assert h.compute == p.compute
            assert h.ep_comm == pytest.approx(max(0.0, p.ep_comm - p.compute))
    slow = replace(H100, tp_bandwidth=4e9)
    assert moe_work(qwen3_moe, expert_parallel=8, moe_a2a_overlap=True).phase("f", slow).ep_comm


def test_estimate_takes_the_overlap_flag(qwen3_moe, capsys):
    argv = ["estimate", "--model", qwen3_moe, "--gpus", "8", "--ep", "8", "--dp", "8"]
    argv += ["--global-batch", "16", "--seq-len", "2048", "--json"]
    exposed = []
    for extra in ([], ["--moe-a2a-overlap"]):
        assert main([*argv, *extra]) == 0
        summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        exposed.append(summary["breakdown"]["ep_comm"])
    assert exposed[0] > 0 and exposed[1] < exposed[0]
