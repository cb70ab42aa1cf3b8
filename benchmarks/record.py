"""The H100 record (benchmarks/data/h100_record.csv): each published run as the `octopipe
estimate` command line that predicts it, and the tokens per second per GPU it published.

    rows = read_record()
    argv = estimate_argv(row)            # None when the row cannot be expressed (its reason)
    published_tokens(row)                # tokens/s/GPU, given or derived by the row's formula

Used by bench_fidelity.py (the table and the fit) and by tests; pure, no subprocesses.
"""

from __future__ import annotations

import csv
from dataclasses import replace
from pathlib import Path

from octopipe.costmodel import load_architecture
from octopipe.costmodel.build import parameter_count
from octopipe.costmodel.hardware import Hardware

DATA = Path(__file__).parent / "data"
RECORD = DATA / "h100_record.csv"
CONFIGS = DATA / "configs"
GIB = 2**30

# Parts a source ran that differ from the preset's: Meta's Grand Teton H100s (torchtitan's
# benchmarks) carry 96 GB of HBM2e at 2.4 TB/s (the benchmark file says so).
# Sources that ran Megatron-Core, whose MoE token dispatchers sync the host each layer.
MEGATRON_CORE = ("nemo2407", "bridge2511", "mlperf31")

VARIANTS = {
    "hbm2e-500w": {"memory_bandwidth": 2.4e12, "memory_bytes": 96 * 1e9 * 0.97},
}


def read_record(path: Path = RECORD) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def config_path(row: dict[str, str]) -> str:
    """A config of benchmarks/data/configs, or a shipped model's name."""
    local = CONFIGS / f"{row['config']}.json"
    return str(local) if local.exists() else row["config"]


def with_variant(hw: Hardware, row: dict[str, str]) -> Hardware:
    return replace(hw, **VARIANTS[row["variant"]]) if row["variant"] else hw


def estimate_argv(row: dict[str, str]) -> list[str] | None:
    """The `octopipe estimate` arguments of the row (None when `unexpressed` says why not)."""
    if row["unexpressed"]:
        return None
    argv = ["estimate", "--model", config_path(row), "--hardware", row["hardware"]]
    argv += ["--gpus", row["gpus"], "--gpus-per-node", row["gpus_per_node"]]
    for flag in ("tp", "cp", "pp", "dp", "ep"):
        argv += [f"--{flag}", row[flag]]
    argv += ["--micro-batch-size", row["micro_batch"], "--global-batch", row["global_batch"]]
    argv += ["--seq-len", row["seq_len"], "--schedule", row["schedule"]]
    if int(row["chunks"]) > 1:
        argv += ["--chunks", row["chunks"]]
    argv += ["--recompute", row["recompute"], "--precision", row["precision"]]
    argv += ["--fp8-scaling", row["fp8_scaling"], "--zero", row["zero"]]
    if row["shard_group"]:
        argv += ["--shard-group", row["shard_group"]]
    if row["tp_comm_overlap"] == "1":
        argv += ["--tp-comm-overlap"]
    if row["grad_bucket_mb"]:
        argv += ["--grad-bucket-mb", row["grad_bucket_mb"]]
    argv += ["--rank-order", row["rank_order"]]
    argv += ["--grad-dtype", row["grad_dtype"], "--partition", row["partition"]]
    if row["source"] in MEGATRON_CORE:
        argv += ["--moe-host-sync"]
    if row.get("moe_a2a_overlap") == "1":
        argv += ["--moe-a2a-overlap"]
    return [*argv, "--json"]


def offloaded_bytes(row: dict[str, str], summary: dict) -> float:
    """Activation bytes the source's CPU offloading moves off the GPU at the peak, by
    `cpu_offload_layers` of the row's layers (Megatron-Core's `cpu_offloading_num_layers`,
    which `octopipe estimate` does not model): their share of the peak's activations, a
    layer's activations being alike. Only for rows without PP (one microbatch held)."""
    layers = int(row["cpu_offload_layers"] or 0)
    if not layers:
        return 0.0
    if int(row["pp"]) != 1:
        raise ValueError(f"{row['model']}: cpu_offload_layers is priced only without PP")
    arch = load_architecture(config_path(row))
    held = summary["peak_memory_bytes"] - summary["static_memory_bytes"]
    return held * layers / arch.num_layers


def fits_published(row: dict[str, str], summary: dict) -> bool:
    """Whether the row's predicted peak, less what its source offloads, fits the GPU."""
    return summary["peak_memory_bytes"] - offloaded_bytes(row, summary) <= summary["capacity_bytes"]


def published_tokens(row: dict[str, str]) -> float:
    """Tokens per second per GPU: as published, or from the published TFLOP/s per GPU by the
    row's FLOP formula (`6N+6lhs`: 6 x the non-embedding parameters plus causal attention
    at half, 6 l h s, per token)."""
    if row["published"]:
        return float(row["published"])
    tflops, formula = row["flops"].split(":")
    if formula != "6N+6lhs":
        raise ValueError(f"unknown FLOP formula {formula!r}")
    arch = load_architecture(config_path(row))
    embedding = arch.vocab_size * arch.hidden_size
    n = parameter_count(arch) - embedding * (1 if arch.tie_word_embeddings else 1)
    per_token = 6 * n + 6 * arch.num_layers * arch.hidden_size * int(row["seq_len"])
    return float(tflops) * 1e12 / per_token
