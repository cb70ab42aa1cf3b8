"""ZeRO-2/3 and HSDP in `octopipe estimate`: what each stage holds, when it gathers and
scatters, the held-across-microbatches mode under PP, HSDP's replicas, and bad shard groups
refused in one line."""

from __future__ import annotations

from dataclasses import replace

import pytest

from octopipe.costmodel import load_architecture
from octopipe.costmodel.build import estimate_layers
from octopipe.costmodel.hardware import hardware_preset
from octopipe.costmodel.settings import Settings
from octopipe.errors import InputError
from octopipe.layouts import Cluster, Job, JobShape, parse_gpus
from octopipe.layouts.estimate import Given, estimate
from octopipe.layouts.sharded_dp import sharding, state_bytes
from octopipe.layouts.stack import Stack


def _job(gpus: int = 64, batch: int = 128) -> Job:
    return Job("llama3-8b", Cluster(parse_gpus(str(gpus), "h100"), 8), batch, 4096, Stack())


FSDP = JobShape(tp=1, pp=1, dp=64, microbatch_size=1, num_microbatches=1)


def _run(layout: JobShape, gpus: int = 64):
    return estimate(_job(gpus), Given(layout))


def test_every_zero_stage_shards_the_optimizer_state():
    assert not JobShape(1, 1, 8, 1, 1).shards_optimizer
    assert all(JobShape(1, 1, 8, 1, 1, zero=z).shards_optimizer for z in (1, 2, 3))


def test_each_stage_holds_less():
    peaks = [_run(replace(FSDP, zero=z)).peak_memory_bytes for z in range(4)]
    assert peaks == sorted(peaks, reverse=True) and len(set(peaks)) == 4


def test_state_bytes_follow_what_each_stage_shards():
    arch = load_architecture("llama3-8b")
    s = Settings(seq_len=1024)
    e = estimate_layers(arch, hardware_preset("h100"), s)[1]
    w, g, o, n = s.weight_bytes, s.grad_bytes, s.optimizer_bytes, e.params
    assert state_bytes(e, sharding(2, 8, 1, 1), s, 1) == pytest.approx(n * (w + (g + o) / 8), 1)
    assert state_bytes(e, sharding(3, 8, 1, 1), s, 1) == pytest.approx(n * (w + g + o) / 8, 1)
    held = sharding(3, 8, 1, 4)  # under PP: weights and gradients gathered for the whole step
    assert held.held and state_bytes(e, held, s, 1) == pytest.approx(n * (w + g + o / 8), 1)


def test_fp8_copies_are_held_with_whole_weights_and_in_flight_under_per_microbatch_zero3():
    arch = load_architecture("llama3-8b")
    s = Settings(seq_len=1024, precision="fp8")
    e = estimate_layers(arch, hardware_preset("h100"), s)[1]
    copies = e.param_bytes - e.params * s.bytes_per_param
    w, g, o, n = s.weight_bytes, s.grad_bytes, s.optimizer_bytes, e.params
    assert copies > 0
    held = sharding(3, 8, 1, 4)
    assert state_bytes(e, held, s, 1) == pytest.approx(n * (w + g + o / 8) + copies, 1)
    assert state_bytes(e, sharding(2, 8, 1, 1), s, 1) == pytest.approx(
        n * (w + (g + o) / 8) + copies, 1
    )
    # Per microbatch the gathered weights are cast and freed: no layer holds its copies.
    assert state_bytes(e, sharding(3, 8, 1, 1), s, 1) == pytest.approx(n * (w + g + o) / 8, 1)
    fp8 = replace(Stack(), precision="fp8")
    job = Job("llama3-8b", Cluster(parse_gpus("8", "h100"), 8), 8, 4096, fp8)
    bf16 = replace(job, stack=Stack())
    lay = replace(FSDP, dp=8, zero=3)
    static = [estimate(j, Given(lay)).static_memory_bytes for j in (job, bf16)]
    # The FP8 run holds at most the copies of the two layers in flight more than BF16 (here
    # none: the head, the largest layer in flight, has no FP8 copies), not 32 layers' copies.
    assert 0 <= static[0] - static[1] <= 2 * copies


def test_zero3_gathers_per_microbatch_without_pp_and_once_a_step_under_pp():
    per_mb = _run(replace(FSDP, zero=3))
    assert per_mb.breakdown.fsdp_comm > 0  # every microbatch's gathers, partly exposed
    pp = JobShape(tp=1, pp=4, dp=16, microbatch_size=1, num_microbatches=1)
    held, zero1 = _run(replace(pp, zero=3)), _run(replace(pp, zero=1))
    assert held.breakdown.fsdp_comm == 0  # gathered once, held across the microbatches
    assert held.step_time == pytest.approx(zero1.step_time)  # ZeRO-1's traffic
    # The state (FP32 master weights and moments) sharded, weights and gradients whole for the
    # step: what ZeRO-1 holds.
    assert held.peak_memory_bytes == zero1.peak_memory_bytes


def test_hsdp_shards_within_groups_and_reduces_across_them():
    full, hsdp = _run(replace(FSDP, zero=3)), _run(replace(FSDP, zero=3, shard_group=8))
    assert full.peak_memory_bytes < hsdp.peak_memory_bytes  # 8 shards, not 64
    # Shards inside a node over NVLink; the replicas' all-reduce of the shards is new.
    assert hsdp.breakdown.fsdp_comm < full.breakdown.fsdp_comm
    assert hsdp.breakdown.dp_exposed > 0


@pytest.mark.parametrize(
    ("layout", "says"),
    [
        (replace(FSDP, zero=1, shard_group=8), "needs --zero 2 or 3"),
        (replace(FSDP, zero=3, shard_group=7), "must divide"),
    ],
)
def test_bad_shard_groups_are_one_line(layout, says):
    with pytest.raises(InputError, match=says):
        _run(layout)
    with pytest.raises(ValueError, match="ZeRO stage 4"):  # no shape holds it at all
        replace(FSDP, zero=4)


def test_the_search_space_offers_zero_2_3_and_folded_ep_when_asked():
    from octopipe.layouts.layout import search_space

    job = _job(16, 64)

    def fits(tp, cp, ep):
        return True

    plain = search_space(job, 32, fits, experts=16)
    wider = search_space(job, 32, fits, experts=16, zero_stages=(0, 1, 2, 3), fold_experts=True)
    assert {lay.zero for lay in plain} == {0, 1}
    assert {lay.zero for lay in wider} == {0, 1, 2, 3}
    assert set(plain) < set(wider)
    # Folded: EP over TP x CP x DP, beyond what DP x CP alone allows.
    assert any(lay.ep > lay.dp * lay.cp for lay in wider)
    assert not any(lay.ep > lay.dp * lay.cp for lay in plain)
