"""What a rank holds for its backwards (`HeldTensors`, runtime/step/records.py), counted from
the tensors: a storage once however many hold it, released with the last holder, parameters
apart; and on real ranks, each rank's high-water mark against the plan's peak for its device."""

from __future__ import annotations

import gc

import pytest
import torch

from octopipe import baseline
from octopipe.config import JobConfig
from octopipe.config.sources import from_keywords
from octopipe.costmodel.build import build_profile
from octopipe.costmodel.hardware import hardware_preset
from octopipe.costmodel.hf_config import load_architecture
from octopipe.costmodel.settings import Settings
from octopipe.runtime.launch.launcher import launch
from octopipe.runtime.step.records import HeldTensors
from octopipe.training import runtime_config

MODEL = "tiny-llama"
SEQ_LEN, MBS = 64, 2


def test_a_saved_storage_counts_once_and_goes_with_the_graph():
    held = HeldTensors()
    w = torch.nn.Parameter(torch.randn(32, 32))
    held.exclude([w])
    x = torch.randn(8, 32, requires_grad=True)
    with held.saving():
        y = (x @ w).sin()  # saves x (and w: a parameter), and x @ w for sin
        z = y * x  # saves y and x again
    counted = x.nbytes + y.nbytes + (8 * 32 * 4)  # x, y, x @ w
    assert held.live == held.peak == counted
    z.sum().backward()
    del y, z
    gc.collect()
    assert held.live == 0 and held.peak == counted


def test_kept_tensors_count_until_their_holders_go_and_views_share_a_storage():
    held = HeldTensors()
    a = torch.zeros(100)
    holders = held.keep([a, a[10:], None])
    assert held.live == a.nbytes
    del holders
    assert held.live == 0
    held.reset()
    assert held.peak == 0


def _job(schedule: str, devices: int):
    """tiny-llama on `devices` ranks in FP32 with AdamW, planned from a profile priced as it runs
    (4-byte activations, weights and gradients, 8 bytes of optimizer state a parameter)."""
    from octopipe.runtime.job.run_config import Job

    settings = Settings(
        seq_len=SEQ_LEN,
        micro_batch_size=MBS,
        activation_bytes=4,
        weight_bytes=4,
        grad_bytes=4,
        optimizer_bytes=8,
    )
    profile = build_profile(load_architecture(MODEL), hardware_preset("h100"), settings)
    plan = baseline(profile, schedule, "uniform", 4, devices)
    job = from_keywords(JobConfig(), steps=2, seq_len=SEQ_LEN, micro_batch_size=MBS)
    return Job(plan, runtime_config(job, plan, MODEL)), plan


SCHEDULES = ["1f1b", "gpipe", "i1f1b", "zbh1", "zbv"]


@pytest.fixture(scope="module")
def results():
    jobs = {s: _job(s, 2) for s in SCHEDULES}
    ran = launch([j for j, _ in jobs.values()], 2, "gloo", timeout_s=120)
    return {s: (r, jobs[s][1]) for s, r in zip(jobs, ran)}


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_each_ranks_high_water_mark_is_the_plans_peak_for_its_device(schedule, results):
    result, plan = results[schedule]
    summary = result.summary()
    predicted = plan.predicted["peak_memory_bytes"]
    assert summary["predicted_peak_bytes"] == predicted
    for held, peak in zip(summary["high_water_bytes"], predicted, strict=True):
        assert held == pytest.approx(peak, rel=0.02)
