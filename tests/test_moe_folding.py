"""MoE as trained today in `octopipe estimate`: EP folded over TP x CP x DP with its own expert
TP (Megatron-Core's MoE parallel folding), where the all-to-alls run, capacity-factor padding
against dropless routing, and degrees that do not fold refused in one line."""

from __future__ import annotations

import pytest
from moe_configs import moe_work, write_qwen3_moe

from octopipe.costmodel import load_architecture
from octopipe.costmodel.build import estimate_layers
from octopipe.costmodel.hardware import hardware_preset
from octopipe.costmodel.kernels import EP_NETWORK, EP_NVLINK, GROUPED
from octopipe.costmodel.settings import Settings
from octopipe.errors import InputError
from octopipe.layouts import Cluster, Job, JobShape, parse_gpus
from octopipe.layouts.estimate import Given, estimate
from octopipe.layouts.stack import Stack


@pytest.fixture
def qwen3_moe(tmp_path) -> str:
    return write_qwen3_moe(tmp_path)


def _expert_flops(work) -> float:
    return sum(k.flops for k in work.kernels if k.unit == GROUPED)


def test_folding_keeps_each_ranks_expert_work_and_splits_the_experts_weights(qwen3_moe):
    classic = moe_work(qwen3_moe, tensor_parallel=2, sequence_parallel=True)
    folded = moe_work(qwen3_moe, tensor_parallel=2, sequence_parallel=True, expert_parallel=4)
    etp = moe_work(
        qwen3_moe,
        tensor_parallel=2,
        sequence_parallel=True,
        expert_parallel=4,
        expert_tensor_parallel=2,
    )
    # Balanced routing: every rank computes the same expert FLOPs however the grid folds.
    assert _expert_flops(folded) == pytest.approx(_expert_flops(classic))
    assert _expert_flops(etp) == pytest.approx(_expert_flops(classic))
    # Classic expert-TP holds every expert at 1/TP; EP 4 a quarter whole; ETP 2 a quarter at 1/2.
    assert folded.expert_params == 2 * classic.expert_params / 4
    assert etp.expert_params == classic.expert_params / 4
    moved = [k.bytes for k in etp.kernels if k.unit in (EP_NVLINK, EP_NETWORK)]
    assert moved and all(b > 0 for b in moved)


def test_capacity_factor_pads_the_experts_input(qwen3_moe):
    dropless = moe_work(qwen3_moe, expert_parallel=4)
    padded = moe_work(qwen3_moe, expert_parallel=4, moe_capacity_factor=1.25)
    assert _expert_flops(padded) == pytest.approx(1.25 * _expert_flops(dropless))


def _job(config: str, gpus: int) -> Job:
    return Job(config, Cluster(parse_gpus(str(gpus), "h100"), 8), 64, 2048, Stack())


def test_ep_folds_over_tp_cp_dp_beyond_the_dp_ranks(qwen3_moe):
    # TP 2 x PP 2 x DP 4 on 16 GPUs: EP 8 exceeds DP x CP = 4 but folds over TP x DP = 8.
    layout = JobShape(tp=2, pp=2, dp=4, microbatch_size=1, num_microbatches=1, ep=8)
    result = estimate(_job(qwen3_moe, 16), Given(layout))
    assert result.breakdown.ep_comm > 0
    with pytest.raises(InputError, match="TP x CP x DP"):
        estimate(_job(qwen3_moe, 16), Given(JobShape(2, 2, 4, 1, 1, ep=16)))


def test_the_all_to_all_stays_on_nvlink_inside_a_node_and_crosses_nics_beyond(qwen3_moe):
    from octopipe.layouts.costs import LayoutCosts

    inside = LayoutCosts(_job(qwen3_moe, 16))
    assert not inside.ep_across_nodes(JobShape(1, 1, 16, 1, 1, ep=8))
    assert inside.ep_across_nodes(JobShape(1, 1, 16, 1, 1, ep=16))
    # Under PP the DP ranks of a stage sit PP nodes' worth apart: EP 8 over DP spans nodes.
    assert inside.ep_across_nodes(JobShape(1, 2, 8, 1, 1, ep=8))
    arch = load_architecture(qwen3_moe)
    h100 = hardware_preset("h100")
    near = estimate_layers(arch, h100, Settings(seq_len=2048, expert_parallel=8))[1]
    far = estimate_layers(
        arch, h100, Settings(seq_len=2048, expert_parallel=8, ep_across_nodes=True)
    )[1]
    assert far.parts.ep_comm > near.parts.ep_comm


def test_megatrons_rank_order_keeps_a_stages_ep_group_inside_a_node(qwen3_moe):
    from dataclasses import replace

    from octopipe.layouts.costs import LayoutCosts

    layout = JobShape(1, 2, 8, 1, 1, ep=8)  # PP 2: OctoPipe's DP ranks sit two GPUs apart
    costs = LayoutCosts(_job(qwen3_moe, 16))
    megatron = replace(layout, rank_order="megatron")
    assert costs.ep_across_nodes(layout) and not costs.ep_across_nodes(megatron)
    with pytest.raises(InputError, match="--rank-order"):
        replace(_job(qwen3_moe, 16), rank_orders=("pp-first",))
