"""Where the first seconds of a 2-rank `octopipe run` go, beside a bare torch.distributed start.

    .venv/bin/python benchmarks/bench_run_startup.py [--runs 2] [--against REV]

Three measurements, interleaved run by run so that all see the same machine load:

- `bare`: 2 processes spawned as multiprocessing spawns them, each importing torch and joining
  a gloo process group over a file store: the least any 2-rank job on this machine pays;
- `imports`: in a fresh process, `import torch`, then what a rank of `octopipe run` imports on
  top (the launcher and the session), then torch.distributed.checkpoint alone, which the
  runtime's checkpoint modules import whether or not the run checkpoints;
- `run`: `octopipe run` of tiny-llama on 2 ranks for 1 step, its notes' own clock ("[x s]
  starting 2 processes", "2 processes joined", ...), the wall seconds at which its lines
  arrived, and from its last line to its exit; with `--against REV`, the same for that commit
  (a temporary worktree), run by run beside this one.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
_NOTE = re.compile(r"^\[([0-9.]+) s\] (.*)$")


def _bare_rank(rank: int, store: str, t0: float, out) -> None:
    import torch.distributed as dist

    imported = time.time() - t0
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    dist.barrier()
    out.put((rank, imported, time.time() - t0))
    dist.destroy_process_group()


def bare(tmp: Path) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    store = str(tmp / f"store-{time.time_ns()}")
    t0 = time.time()
    procs = [ctx.Process(target=_bare_rank, args=(r, store, t0, out)) for r in range(2)]
    for p in procs:
        p.start()
    got = [out.get() for _ in procs]
    for p in procs:
        p.join()
    return {
        "ranks imported torch": max(g[1] for g in got),
        "group joined": max(g[2] for g in got),
        "processes exited": time.time() - t0,
    }


_IMPORTS = """
import time
t = time.perf_counter(); import torch; a = time.perf_counter()
import octopipe.runtime.launch.launcher, octopipe.runtime.job.session; b = time.perf_counter()
print(a - t, b - a)
"""
_DCP = """
import time, torch, torch.distributed.tensor
t = time.perf_counter(); import torch.distributed.checkpoint; print(time.perf_counter() - t)
"""


def imports() -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(HERE / "src")}
    run = [sys.executable, "-c"]
    torch_s, runtime_s = map(float, subprocess.check_output([*run, _IMPORTS], env=env).split())
    dcp_s = float(subprocess.check_output([*run, _DCP], env=env))
    return {
        "import torch": torch_s,
        "+ a rank's octopipe modules": runtime_s,
        "  of which torch.distributed.checkpoint (after torch.distributed.tensor)": dcp_s,
    }


def octopipe_run(tmp: Path, src: Path = HERE / "src") -> dict[str, float]:
    """One `octopipe run` of the code in `src`: its notes' clock, and wall seconds (from the
    command's start) at which its lines arrived and it exited."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    plan = tmp / "plan.json"
    if not plan.exists():
        sys.path.insert(0, str(HERE / "src"))
        from octopipe import baseline, profile_from_config, save_plan

        save_plan(
            baseline(profile_from_config("tiny-llama", devices=2), "1f1b", "uniform", 2), plan
        )
    argv = [sys.executable, "-m", "octopipe", "run", "--plan", str(plan), "--model", "tiny-llama"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [*argv, "--steps", "1", "--seq-len", "16"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    out: dict[str, float] = {}
    last = 0.0
    for line in proc.stdout:
        last = time.perf_counter() - t0
        m = _NOTE.match(line.rstrip())
        if m:
            key = re.sub(r"[0-9]+ ", "N ", m.group(2)).split(":")[0][:60]
            out.setdefault(f"note on its clock: {key}", float(m.group(1)))
            out.setdefault(f"wall: {key}", last)
    if proc.wait() != 0:
        raise SystemExit(f"octopipe run failed in {src}")
    wall = time.perf_counter() - t0
    out["wall: the last line printed"] = last
    out["wall: the command exited"] = wall
    out["from the last line to the exit"] = wall - last
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--against", metavar="REV", help="also run this commit's octopipe run")
    args = parser.parse_args()
    rows: dict[str, dict[str, list[float]]] = {"bare": {}, "imports": {}, "run": {}}
    with tempfile.TemporaryDirectory() as tmp:
        measures = [
            ("bare", lambda: bare(Path(tmp))),
            ("imports", imports),
            ("run", lambda: octopipe_run(Path(tmp))),
        ]
        if args.against:
            tree = str(Path(tmp) / "against")
            subprocess.run(
                ["git", "-C", str(HERE), "worktree", "add", "--detach", tree, args.against],
                check=True,
                capture_output=True,
            )
            rows[f"run at {args.against}"] = {}
            measures.append(
                (f"run at {args.against}", lambda: octopipe_run(Path(tmp), Path(tree) / "src"))
            )
        try:
            for _ in range(args.runs):
                for what, measure in measures:
                    for key, value in measure().items():
                        rows[what].setdefault(key, []).append(value)
        finally:
            if args.against:
                subprocess.run(
                    ["git", "-C", str(HERE), "worktree", "remove", "--force", tree],
                    capture_output=True,
                )
    print(f"| what | seconds: fastest, median of {args.runs} |")
    print("|---|---|")
    for what, figures in rows.items():
        for key, value in figures.items():
            print(f"| {what}: {key} | {min(value):.2f}, {statistics.median(value):.2f} |")


if __name__ == "__main__":
    main()
