"""Fused attention's rate rises with the queries a sequence has (`kernels.attention_efficiency`),
anchored at the preset's measured figure at 4,096 queries and capped at a big GEMM's."""

from __future__ import annotations

from dataclasses import replace

import pytest

from octopipe.costmodel.hardware import hardware_preset
from octopipe.costmodel.kernels import (
    ATTENTION_CEILING,
    ATTENTION_REFERENCE_LENGTH,
    attention_efficiency,
)


def test_the_preset_figure_holds_at_the_reference_length_and_rises_with_it():
    hw = hardware_preset("h100")
    assert hw.attention_half_length > 0
    at = [attention_efficiency(hw, q) for q in (1024, 2048, ATTENTION_REFERENCE_LENGTH, 8192)]
    assert at[2] == pytest.approx(hw.attention_efficiency)
    assert at == sorted(at) and at[0] < at[-1]
    assert attention_efficiency(hw, 1 << 20) == ATTENTION_CEILING


def test_no_half_length_keeps_it_flat():
    hw = replace(hardware_preset("h100"), attention_half_length=0.0)
    assert (
        attention_efficiency(hw, 512) == attention_efficiency(hw, 65536) == hw.attention_efficiency
    )
    assert hardware_preset("a100").attention_half_length == 0  # the A100 table is unchanged


def test_context_parallelism_shortens_the_kernels_sequence():
    from octopipe.costmodel import layer_specs, load_architecture
    from octopipe.costmodel.layercost import layer_work
    from octopipe.costmodel.settings import Settings

    hw = hardware_preset("h100")
    arch = load_architecture("tiny-llama")
    spec = next(s for s in layer_specs(arch) if s.kind == "decoder")
    whole = layer_work(arch, spec, Settings(seq_len=8192))
    split = layer_work(arch, spec, Settings(seq_len=8192, context_parallel=4))
    q_lens = {k.q_len for k in whole.kernels if k.unit == "attention"}
    assert q_lens == {8192}
    assert {k.q_len for k in split.kernels if k.unit == "attention"} == {2048}
    assert attention_efficiency(hw, 2048) < attention_efficiency(hw, 8192)
