"""The MoE costs fitted or sourced on the training record: the host stall of a stack whose
token dispatcher syncs the host each layer (Megatron-Core), and the all-to-all's achieved
share of its link."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from moe_configs import moe_work, write_qwen3_moe

from octopipe.cli import main
from octopipe.costmodel.hardware import hardware_preset
from octopipe.costmodel.kernels import EP_NVLINK


@pytest.fixture
def qwen3_moe(tmp_path) -> str:
    return write_qwen3_moe(tmp_path)


def test_a_syncing_dispatcher_adds_the_host_stall_to_forward_and_input_gradient(qwen3_moe):
    hw = hardware_preset("h100")
    assert hw.moe_layer_host_seconds > 0
    plain = moe_work(qwen3_moe, expert_parallel=8)
    synced = moe_work(qwen3_moe, expert_parallel=8, moe_host_sync=True)
    for phase in ("f", "i"):
        added = synced.phase(phase, hw).compute - plain.phase(phase, hw).compute
        assert added == pytest.approx(hw.moe_layer_host_seconds)
    assert synced.phase("w", hw) == plain.phase("w", hw)  # W launches no routing


def test_the_all_to_all_runs_at_its_achieved_share_of_nvlink(qwen3_moe):
    hw = hardware_preset("h100")
    work = moe_work(qwen3_moe, expert_parallel=8)
    sent = sum(k.bytes for k in work.kernels if k.unit == EP_NVLINK and k.phase == "f")
    assert sent > 0
    for efficiency in (1.0, 0.5):
        at = replace(hw, all_to_all_efficiency=efficiency)
        expected = sent / (hw.tp_bandwidth * efficiency)
        assert work.phase("f", at).ep_comm == pytest.approx(expected)


def test_estimate_takes_the_flag_and_a_slower_step_follows(qwen3_moe, capsys):
    argv = ["estimate", "--model", qwen3_moe, "--gpus", "8", "--ep", "8", "--dp", "8"]
    argv += ["--global-batch", "16", "--seq-len", "2048", "--json"]
    steps = []
    for extra in ([], ["--moe-host-sync"]):
        assert main([*argv, *extra]) == 0
        steps.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1])["step_time"])
    assert steps[1] > steps[0]
