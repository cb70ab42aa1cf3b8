"""The MoE costs fitted or sourced on the training record: the host stall of a stack whose
token dispatcher syncs the host each layer (Megatron-Core), and the all-to-all's achieved
share of its link."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from octopipe.cli import main
from octopipe.costmodel import layer_specs, load_architecture
from octopipe.costmodel.hardware import hardware_preset
from octopipe.costmodel.kernels import EP_NVLINK
from octopipe.costmodel.layercost import layer_work
from octopipe.costmodel.settings import Settings

QWEN3_MOE = {  # Qwen3-MoE's public config.json fields, smaller
    "model_type": "qwen3_moe",
    "hidden_size": 1024,
    "num_hidden_layers": 4,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "intermediate_size": 3072,
    "moe_intermediate_size": 384,
    "num_experts": 32,
    "num_experts_per_tok": 4,
    "vocab_size": 32000,
}


@pytest.fixture
def qwen3_moe(tmp_path) -> str:
    path = tmp_path / "qwen3_moe.json"
    path.write_text(json.dumps(QWEN3_MOE))
    return str(path)


def _moe_work(config: str, **settings):
    arch = load_architecture(config)
    spec = next(s for s in layer_specs(arch) if s.kind == "moe")
    return layer_work(arch, spec, Settings(seq_len=2048, **settings))


def test_a_syncing_dispatcher_adds_the_host_stall_to_forward_and_input_gradient(qwen3_moe):
    hw = hardware_preset("h100")
    assert hw.moe_layer_host_seconds > 0
    plain = _moe_work(qwen3_moe, expert_parallel=8)
    synced = _moe_work(qwen3_moe, expert_parallel=8, moe_host_sync=True)
    for phase in ("f", "i"):
        added = synced.phase(phase, hw).compute - plain.phase(phase, hw).compute
        assert added == pytest.approx(hw.moe_layer_host_seconds)
    assert synced.phase("w", hw) == plain.phase("w", hw)  # W launches no routing


def test_the_all_to_all_runs_at_its_achieved_share_of_nvlink(qwen3_moe):
    hw = hardware_preset("h100")
    work = _moe_work(qwen3_moe, expert_parallel=8)
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
