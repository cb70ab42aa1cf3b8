"""What checkpoint checksums cost: a real save through `checkpoint.store.save` (one rank, gloo)
with its checksums against the same save without them (its checksum step skipped, as before
checksums existed), in alternating order, each from a clean page cache (`os.sync` first),
and the check a resume makes
(`folder.check_complete`: the safe index read, the lengths, every file's SHA-256) against
loading the weights (`store.load_weights`), side by side, on one checkpoint.

    .venv/bin/python benchmarks/bench_checkpoint_checksums.py --mib 1024 --runs 3

The checkpoint holds `--mib` MiB of float32 parameters (16 MiB tensors) with an SGD momentum
buffer each, so twice that on disk. The files were just written, so they are in the page
cache: these are the figures without a disk in the way (a cold resume reads the files from
disk once for the check and once to load; the check adds one read of the checkpoint).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from octopipe.runtime.checkpoint import store
from octopipe.runtime.checkpoint.checksums import digests, hashed_files
from octopipe.runtime.checkpoint.folder import MARKER, check_complete, read_marker

TENSOR_MIB = 16


class Stage(nn.Module):
    """What `store.save` takes for a rank's stage: a module whose `part` holds parameters."""

    def __init__(self, mib: int) -> None:
        super().__init__()
        n = TENSOR_MIB * 2**20 // 4
        self.part = nn.ParameterList(nn.Parameter(torch.randn(n)) for _ in range(mib // TENSOR_MIB))


def timed(fn, *args, **kwargs) -> float:
    """Seconds `fn` takes, from a clean page cache: what earlier writes left dirty is flushed
    first (untimed), so no measurement pays for the one before it."""
    os.sync()
    start = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024, help="parameters, MiB")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    stage = Stage(args.mib)
    opt = torch.optim.SGD(stage.parameters(), lr=0.1, momentum=0.9)
    for p in stage.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    about = {"model": "bench", "layers": ["x"], "seed": 0, "optimizer": "sgd"}
    rows: dict[str, list[float]] = {k: [] for k in ("plain", "save", "check", "load", "hash")}
    with_checksums = store._checksums
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        root = Path(tmp)
        init = f"file://{root / uuid.uuid4().hex}"
        dist.init_process_group("gloo", init_method=init, rank=0, world_size=1)
        try:
            for run in range(args.runs):
                plain = root / "plain"
                for variant in ("plain", "save") if run % 2 == 0 else ("save", "plain"):
                    without = variant == "plain"  # the save as before checksums
                    store._checksums = (lambda partial: {}) if without else with_checksums
                    where = plain if without else root / "ckpt"
                    rows[variant].append(timed(store.save, where, run, {0: stage}, opt, about))
                store._checksums = with_checksums
                folder = store.step_dir(root / "ckpt", run)
                rows["check"].append(timed(check_complete, folder, read_marker(folder)))
                rows["load"].append(timed(store.load_weights, folder, stage.part))
                names = hashed_files(folder, MARKER)
                rows["hash"].append(timed(digests, folder, names))
                on_disk = sum((folder / n).stat().st_size for n in names)
                shutil.rmtree(store.step_dir(plain, run))
                shutil.rmtree(folder)
        finally:
            dist.destroy_process_group()
    params = sum(p.numel() * 4 for p in stage.parameters())
    print(f"checkpoint: {on_disk / 2**20:,.0f} MiB in {len(names)} files; {args.runs} runs")
    print(f"Python {sys.version.split()[0]}, torch {torch.__version__}")
    print()
    print("| what | bytes | fastest s | median s | GB/s (fastest) |")
    print("|---|---:|---:|---:|---:|")
    labels = {
        "plain": ("store.save without checksums (as before)", on_disk),
        "save": ("store.save with checksums", on_disk),
        "hash": ("SHA-256 of every file (what checksums add)", on_disk),
        "check": ("check_complete: index, lengths, every SHA-256", on_disk),
        "load": ("load_weights: the parameters, checked reader", params),
    }
    for key, (label, size) in labels.items():
        times = rows[key]
        print(
            f"| {label} | {size / 2**20:,.0f} MiB | {min(times):.3f} | "
            f"{statistics.median(times):.3f} | {size / min(times) / 1e9:.2f} |"
        )
    print()
    print(f"save with checksums / without: {min(rows['save']) / min(rows['plain']):.2f}x")
    print(
        f"the check before a resume / loading the parameters: "
        f"{min(rows['check']) / min(rows['load']):.2f}x"
    )


if __name__ == "__main__":
    main()
