"""`octopipe estimate`: one given layout predicted. The FLOP counts against the published
formulas, the breakdown adding up, each physical setting moving the prediction the way it
must, the same step as the layout search's, bad layouts in one line, and the fidelity
benchmark's rows (slow)."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from octopipe.cli import main
from octopipe.layouts import Cluster, Job, JobShape, LayoutSearch, parse_gpus
from octopipe.layouts.estimate import Given, estimate
from octopipe.layouts.stack import Stack

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
import bench_fidelity  # noqa: E402

GPT_1T = {
    "model_type": "gpt2",
    "n_embd": 2560,
    "n_layer": 8,
    "n_head": 20,
    "n_inner": 10240,
    "vocab_size": 51200,
    "n_positions": 2048,
}
MEGATRON_2021 = Stack(
    attention="unfused",
    dropout=0.1,
    grad_dtype="fp16",
    sequence_parallel=False,
    p2p="blocking",
    reduce_at_end=True,
)


@pytest.fixture
def gpt(tmp_path) -> str:
    path = tmp_path / "gpt.json"
    path.write_text(json.dumps(GPT_1T))
    return str(path)


def job(config: str, gpus: int = 16, batch: int = 64, stack: Stack = MEGATRON_2021) -> Job:
    return Job(config, Cluster(parse_gpus(str(gpus), "a100"), 8), batch, 2048, stack)


LAYOUT = JobShape(tp=2, pp=4, dp=2, microbatch_size=2, num_microbatches=1, recompute="full")


def test_flops_follow_megatrons_formulas(gpt):
    # Hardware FLOPs with full recomputation: Narayanan et al.'s Eq. 3; model FLOPs:
    # Korthikanti et al.'s 72 B s l h^2 (1 + s/(6h) + V/(12 l h)).
    result = estimate(job(gpt), Given(LAYOUT, "i1f1b", 2))
    B, s, l, h, V = 64, 2048, 8, 2560, 51200
    eq3 = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    model = 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))
    assert result.hardware_flops == pytest.approx(eq3, rel=1e-9)
    assert result.model_flops == pytest.approx(model, rel=1e-9)
    # The convention does not depend on the kernel or the parallelism: the same model FLOPs.
    flash = estimate(job(gpt, stack=Stack()), Given(replace(LAYOUT, tp=4, pp=2), "1f1b"))
    assert flash.model_flops == pytest.approx(model, rel=1e-9)


def test_the_breakdown_adds_up_to_the_step(gpt):
    result = estimate(job(gpt), Given(LAYOUT, "i1f1b", 2))
    parts = result.breakdown
    assert parts.total == pytest.approx(result.step_time, rel=1e-9)
    assert all(v >= -1e-9 for v in vars(parts).values())
    assert parts.recompute > 0 and parts.tp_comm > 0 and parts.bubble > 0
    assert parts.dp_exposed > 0 and parts.optimizer > 0 and parts.cp_comm == 0
    assert 0 < result.mfu < result.hfu < 1
    assert result.tokens_per_second == pytest.approx(64 * 2048 / result.step_time)


def test_the_layout_search_predicts_the_same_step(gpt):
    j = job(gpt)
    result = estimate(j, Given(LAYOUT, "i1f1b", 2))
    lay = result.given.layout
    (row,) = LayoutSearch(j).baselines(lay, [("i1f1b", "uniform", None)])
    assert row.plan.stages == result.plan.stages
    assert row.step_time == pytest.approx(result.step_time, rel=1e-9)
    assert max(row.sim.peak_memory_bytes) == result.peak_memory_bytes


def step(config: str, layout: JobShape = LAYOUT, schedule: str = "1f1b", **stack) -> object:
    return estimate(job(config, stack=replace(MEGATRON_2021, **stack)), Given(layout, schedule))


def test_each_setting_moves_the_prediction_its_way(gpt):
    base = step(gpt)
    # The score matrix in memory costs time and memory that flash attention does not (kept
    # memory: without recomputation, which keeps only the blocks' inputs either way).
    flash = step(gpt, attention="flash")
    assert flash.step_time < base.step_time
    kept = replace(LAYOUT, recompute="none")
    assert step(gpt, kept, attention="flash").peak_memory_bytes < step(gpt, kept).peak_memory_bytes
    # Recomputation: none holds the most, full the least, selective between; full redoes most.
    kinds = {k: step(gpt, replace(LAYOUT, recompute=k)) for k in ("none", "selective", "full")}
    memory = [kinds[k].peak_memory_bytes for k in ("full", "selective", "none")]
    assert memory == sorted(memory) and memory[0] < memory[-1]
    assert kinds["none"].breakdown.recompute == 0 < kinds["selective"].breakdown.recompute
    assert kinds["selective"].breakdown.recompute < kinds["full"].breakdown.recompute
    # TP collectives behind the GEMMs are hidden; sequence parallelism shrinks activations.
    assert step(gpt, tp_comm_overlap=True).breakdown.tp_comm < base.breakdown.tp_comm
    assert step(gpt, sequence_parallel=True).peak_memory_bytes < base.peak_memory_bytes
    # Buckets filled during the backward hide reductions that wait for the end otherwise.
    buckets = step(gpt, reduce_at_end=False, grad_bucket_bytes=2**20)
    assert buckets.breakdown.dp_exposed < base.breakdown.dp_exposed
    # FP32 gradients: more memory, twice the bytes to reduce.
    fp32 = step(gpt, grad_dtype="fp32")
    assert fp32.peak_memory_bytes > base.peak_memory_bytes
    assert fp32.breakdown.dp_exposed > base.breakdown.dp_exposed
    # Blocking transfers hold the sender: slower than overlapped ones.
    assert step(gpt, p2p="overlapped").step_time < base.step_time


def test_zero1_shards_the_optimizer_and_gathers_the_weights(gpt):
    plain = step(gpt)
    sharded = step(gpt, replace(LAYOUT, zero=1))
    assert sharded.peak_memory_bytes < plain.peak_memory_bytes
    assert sharded.breakdown.optimizer < plain.breakdown.optimizer  # a DP-th of the update


def test_context_parallelism_splits_the_sequence_and_exchanges_kv(gpt):
    # The same replicas with twice the GPUs: each holds half of every sequence.
    one = estimate(job(gpt, 16, stack=Stack()), Given(JobShape(2, 1, 8, 1, 1)))
    cp = estimate(job(gpt, 32, stack=Stack()), Given(JobShape(2, 1, 8, 1, 1, cp=2)))
    assert cp.model_flops == pytest.approx(one.model_flops)
    assert cp.step_time < 0.75 * one.step_time
    assert cp.peak_memory_bytes < one.peak_memory_bytes


def test_ring_attention_hides_its_exchange_over_nvlink_but_not_over_the_network():
    from octopipe.costmodel import load_architecture
    from octopipe.costmodel.build import estimate_layers
    from octopipe.costmodel.hardware import PRESETS
    from octopipe.costmodel.settings import Settings

    arch = load_architecture("llama3-8b")

    def exposed(across_nodes: bool, seq_len: int) -> float:
        s = Settings(seq_len=seq_len, context_parallel=8, cp_across_nodes=across_nodes)
        return estimate_layers(arch, PRESETS["h100"], s)[1].parts.cp_comm

    assert exposed(False, 65536) == 0.0  # behind the attention blocks
    assert exposed(True, 8192) > 0.0  # short sequences over the NICs: too little to hide it
    assert exposed(True, 8192) > exposed(True, 65536) / 8  # longer: more attention per byte


def test_expert_parallelism_divides_the_experts_memory_and_pays_all_to_alls():
    job = Job("mixtral-8x7b", Cluster(parse_gpus("64"), 8), 64, 4096, Stack())
    dense = estimate(job, Given(JobShape(1, 8, 8, 1, 1, zero=1), "1f1b"))
    spread = estimate(job, Given(JobShape(1, 8, 8, 1, 1, zero=1, ep=8), "1f1b"))
    assert spread.peak_memory_bytes < dense.peak_memory_bytes
    assert dense.breakdown.ep_comm == 0 < spread.breakdown.ep_comm
    assert spread.model_flops == pytest.approx(dense.model_flops)


def test_titan_partition_counts_the_embedding_and_head_as_blocks():
    """Megatron-Core's account_for_embedding/loss_in_pipeline_split: the end stages hold one
    block fewer, so the first device holds fewer layers' activations."""
    job = Job("llama3-8b", Cluster(parse_gpus("6", "h100"), 6), 12, 4096, Stack())
    lay = JobShape(1, 6, 1, 1, 1)  # 32 blocks: uniform 6, 6, 5, ...; titan 5, 6, 6, 6, 5, 4
    uniform = estimate(job, Given(lay, "1f1b"))
    titan = estimate(job, Given(lay, "1f1b", partition="titan"))
    blocks = [[s.end - s.start for s in r.plan.stages] for r in (uniform, titan)]
    assert blocks[0][0] > blocks[1][0] and sum(blocks[0]) == sum(blocks[1])
    assert titan.sim.peak_memory_bytes[0] < uniform.sim.peak_memory_bytes[0]


def test_cli_prints_the_prediction_and_json_on_the_last_line(gpt, capsys):
    argv = ["estimate", "--model", gpt, "--hardware", "a100", "--gpus", "16", "--tp", "2"]
    argv += ["--pp", "4", "--micro-batch-size", "2", "--global-batch", "64", "--seq-len", "2048"]
    argv += ["--schedule", "i1f1b", "--chunks", "2", "--recompute", "full", "--json"]
    assert main(argv) == 0
    out = capsys.readouterr().out.strip().splitlines()
    summary = json.loads(out[-1])
    assert summary["layout"] == {
        "tp": 2,
        "cp": 1,
        "pp": 4,
        "dp": 2,
        "ep": 1,
        "microbatch_size": 2,
        "microbatches": 16,
        "schedule": "i1f1b",
        "chunks": 2,
        "recompute": "full",
        "zero": 0,
    }
    assert summary["step_time"] > 0 and summary["fits"] in (True, False)
    assert sum(summary["breakdown"].values()) == pytest.approx(summary["step_time"])
    text = "\n".join(out[:-1])
    assert "MFU" in text and "pipeline bubble" in text and "optimizer step" in text


@pytest.mark.parametrize(
    "extra, flag",
    [
        (["--tp", "2", "--pp", "2", "--dp", "2"], "--gpus"),  # 8 of 16 GPUs
        (
            ["--tp", "2", "--pp", "4", "--micro-batch-size", "4", "--global-batch", "12"],
            "--global-batch",
        ),
        (["--gpus", "24", "--tp", "3", "--dp", "8"], "--tp"),  # not a divisor of a node
        (["--tp", "16"], "--tp"),  # beyond a node of 8
        (["--pp", "3"], "--dp"),  # 16 GPUs do not split by 3
        (["--tp", "8", "--dp", "2", "--cp", "1"], "20 attention heads"),
        (["--cp", "3", "--dp", "5", "--tp", "1"], "--gpus"),
        (["--pp", "4", "--schedule", "i1f1b", "--chunks", "2", "--global-batch", "36"], "i1f1b"),
        (["--pp", "4", "--schedule", "zbv", "--chunks", "3"], "zbv"),
        (["--global-batch", "0"], "--global-batch"),
        (["--grad-bucket-mb", "0"], "--grad-bucket-mb"),
        (["--dropout", "1.5"], "--dropout"),
        (["--dp", "16", "--ep", "3"], "--ep"),
        (["--dp", "16", "--ep", "2"], "no MoE experts"),
    ],
)
def test_bad_layouts_are_one_line_and_exit_2(gpt, capsys, extra, flag):
    argv = ["estimate", "--model", gpt, "--hardware", "a100", "--gpus", "16"]
    argv += ["--global-batch", "64", "--seq-len", "2048"]
    assert main([*argv, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("octopipe estimate: error:") and flag in err


@pytest.mark.slow
@pytest.mark.parametrize("index", [0, 5, 9])  # GPT 1.7B, 76B (interleaved), 1T
def test_published_table_rows_are_predicted_within_ten_percent(tmp_path, index):
    row = bench_fidelity.read_rows()[index]
    assert row["source"] == "narayanan2021"
    predicted = bench_fidelity.predict(row, tmp_path)["pred_tflops"]
    assert predicted == pytest.approx(float(row["pub_tflops"]), rel=0.10)
