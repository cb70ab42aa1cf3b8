"""The MoE rows of the training record, with the MoE host stall fitted without them.

    .venv/bin/python benchmarks/bench_fidelity.py --record     # prints this table after

The dense constants (`record_fit.py`) are kernels' efficiencies; an MoE layer also pays what
no dense row measures: the host-side stall of Megatron-Core's token dispatcher (a
device-to-host copy of the per-expert token counts, after which the router, permutation and
dispatch kernels run at the host's launch rate: `Hardware.moe_layer_host_seconds`), fitted
here on MoE rows only over a grid (least mean squared log error), each row on its dense
constants fitted without its source. The all-to-all's achieved share of its link
(`Hardware.all_to_all_efficiency`) is DeepEP's measured one, not fitted. Every MoE row of the
record comes from one source (Megatron-Bridge 25.11), so a row cannot be held out by source:
each GPU's MoE rows are predicted with the stall fitted on the other GPUs' MoE rows (leave one
GPU out). The stall is the host's, not the GPU's, so one value serves every GPU. The rows are
of one release: held-out figures for another release would be worse.
"""

from __future__ import annotations

import math
import sys

from record import estimate_argv, published_tokens

MOE_GRID = {"moe_layer_host_seconds": [round(0.5e-3 * i, 4) for i in range(13)]}


def moe_logs(rows, dense_keys, predict) -> dict[tuple, list[float]]:
    """Each MoE row's log ratio at every point of MOE_GRID, on its dense constants."""
    logs: dict[tuple, list[float]] = {}
    points = MOE_GRID["moe_layer_host_seconds"]
    for n, host in enumerate(points):
        logs[(host,)] = []
        for r, dense in zip(rows, dense_keys):
            summary = predict(r, {**dense, "moe_layer_host_seconds": host})
            ratio = summary["tokens_per_gpu"] / published_tokens(r) if summary else math.e**5
            logs[(host,)].append(math.log(ratio))
        print(f"\rMoE grid {n + 1}/{len(points)}", end="", file=sys.stderr)
    print(file=sys.stderr)
    return logs


def best(logs: dict[tuple, list[float]], use: list[bool]) -> tuple:
    def loss(key: tuple) -> float:
        errors = [v * v for v, u in zip(logs[key], use) if u]
        return sum(errors) / max(1, len(errors))

    return min(logs, key=loss)


def held_out_moe(rows, dense_keys, predict) -> list[tuple[dict, float, tuple]]:
    """(row, held-out ratio, the MoE constants it was predicted with) for every expressible
    MoE row: each GPU's rows with the stall fitted on the other GPUs' rows."""
    keep = [i for i, r in enumerate(rows) if estimate_argv(r) and not r["variant"]]
    rows = [rows[i] for i in keep]
    dense_keys = [dense_keys[i] for i in keep]
    logs = moe_logs(rows, dense_keys, predict)
    every = best(logs, [True] * len(rows))
    print(f"\nMoE host stall fitted on every MoE row: {every[0] * 1e3:.1f} ms")
    out = []
    for gpu in dict.fromkeys(r["hardware"] for r in rows):
        key = best(logs, [r["hardware"] != gpu for r in rows])
        for j, r in enumerate(rows):
            if r["hardware"] == gpu:
                out.append((r, math.exp(logs[key][j]), key))
    return out
