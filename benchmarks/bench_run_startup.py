"""The start-up of `octopipe run` on 2, 4 and 8 CPU ranks, beside a bare torch.distributed start
of as many ranks.

    .venv/bin/python benchmarks/bench_run_startup.py [--runs 3] [--ranks 2 4 8] [--against REV]

Measured run by run, interleaved (every rank count, bare then `octopipe run`, then the same
again), so that all see the same machine load; each is a fresh command, timed from its start
to its exit:

- `bare`: a Python process that spawns N ranks as multiprocessing spawns them, each importing
  torch, joining a gloo process group over a file store, passing a barrier and leaving (with
  `os._exit`, as octopipe's ranks leave): the least any N-rank job on this machine pays;
- `run`: `octopipe run` of tiny-llama for 1 step of 16 tokens on N ranks (a 1F1B plan on
  min(N, 4) devices, the rest data-parallel replicas), and the wall seconds at which its notes
  arrived ("starting N processes", "N processes joined", the step's line); with
  `--against REV`, the same for that commit (a temporary worktree), beside it.

The ratio is `run` / `bare`: of the fastest runs and of the medians (other jobs on the machine
only ever add time), and the median of each round's own ratio (`rounds`: a bare start and the
runs beside it saw the same load).
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


# --- bare: N spawned ranks join a gloo group ---------------------------------------------------


def _bare_rank(rank: int, world: int, store: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


def _bare_main(world: int) -> None:
    """This file run as `--bare-child N`: spawn the N ranks and wait for them."""
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        store = str(Path(tmp) / "store")
        procs = [ctx.Process(target=_bare_rank, args=(r, world, store)) for r in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        if any(p.exitcode for p in procs):
            raise SystemExit(f"a bare rank failed: {[p.exitcode for p in procs]}")


def bare(world: int) -> dict[str, float]:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, __file__, "--bare-child", str(world)], check=True)
    return {"exited": time.perf_counter() - t0}


# --- octopipe run ----------------------------------------------------------------------------


def _plan(tmp: Path, world: int) -> tuple[Path, int]:
    """A 1F1B plan of tiny-llama on min(world, 4) devices, and the replicas that make `world`."""
    devices = min(world, 4)
    plan = tmp / f"plan{devices}.json"
    if not plan.exists():
        sys.path.insert(0, str(HERE / "src"))
        from octopipe import baseline, profile_from_config, save_plan

        profile = profile_from_config("tiny-llama", devices=devices)
        save_plan(baseline(profile, "1f1b", "uniform", devices), plan)
    return plan, world // devices


def octopipe_run(tmp: Path, world: int, src: Path = HERE / "src") -> dict[str, float]:
    """One `octopipe run` of the code in `src` on `world` ranks: wall seconds (from the
    command's start) at which its notes arrived and it exited."""
    plan, dp = _plan(tmp, world)
    argv = [sys.executable, "-m", "octopipe", "run", "--plan", str(plan), "--model", "tiny-llama"]
    argv += ["--steps", "1", "--seq-len", "16", "--dp", str(dp)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": str(src)},
    )
    out: dict[str, float] = {}
    lines = []
    for line in proc.stdout:
        lines.append(line)
        m = _NOTE.match(line.rstrip())
        if m:
            key = re.sub(r"[0-9]+ ", "N ", m.group(2)).split(";")[0].split(" (")[0]
            out.setdefault(key, time.perf_counter() - t0)
        elif line.startswith("step 1/1"):
            out.setdefault("the step's line", time.perf_counter() - t0)
    if proc.wait() != 0:
        raise SystemExit(f"octopipe run failed in {src}:\n{''.join(lines)}")
    out["exited"] = time.perf_counter() - t0
    return out


# --- the tables ------------------------------------------------------------------------------


def _fastest_median(values: list[float]) -> str:
    return f"{min(values):.2f} | {statistics.median(values):.2f}"


def _ratios(run: list[float], bare: list[float]) -> str:
    """`run` / `bare`: of the fastest runs, of the medians, and the median of each round's own
    ratio (a round's two measurements saw the same load)."""
    rounds = statistics.median(r / b for r, b in zip(run, bare))
    fastest, median = min(run) / min(bare), statistics.median(run) / statistics.median(bare)
    return f"{fastest:.2f}x | {median:.2f}x | {rounds:.2f}x"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--against", metavar="REV", help="also run this commit's octopipe run")
    parser.add_argument("--bare-child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare_child:
        _bare_main(args.bare_child)
        return
    trees = {"now": HERE / "src"}
    # rows[what][world][key] -> seconds of every run
    rows: dict[str, dict[int, dict[str, list[float]]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        if args.against:
            tree = Path(tmp) / "against"
            subprocess.run(
                ["git", "-C", str(HERE), "worktree", "add", "--detach", str(tree), args.against],
                check=True,
                capture_output=True,
            )
            trees[args.against] = tree / "src"
        try:
            for run in range(args.runs):
                for world in args.ranks:
                    measures = [("bare", lambda w=world: bare(w))]
                    measures += [
                        (what, lambda w=world, s=src: octopipe_run(Path(tmp), w, s))
                        for what, src in trees.items()
                    ]
                    for what, measure in measures:
                        for key, value in measure().items():
                            rows.setdefault(what, {}).setdefault(world, {}).setdefault(
                                key, []
                            ).append(value)
                print(f"run {run + 1} of {args.runs} done", file=sys.stderr)
        finally:
            if args.against:
                subprocess.run(
                    ["git", "-C", str(HERE), "worktree", "remove", "--force", str(tree)],
                    capture_output=True,
                )
    bare_s = rows["bare"]
    head = "| ranks | bare: fastest s | bare: median s |"
    rule = "|---:|---:|---:|"
    for what in trees:
        head += f" {what}: fastest s | median s | / bare: fastest | median | rounds |"
        rule += "---:|---:|---:|---:|---:|"
    print(f"Start to exit, {args.runs} runs each:\n\n{head}\n{rule}")
    for world in args.ranks:
        line = f"| {world} | {_fastest_median(bare_s[world]['exited'])} |"
        for what in trees:
            run_s = rows[what][world]["exited"]
            line += f" {_fastest_median(run_s)} | {_ratios(run_s, bare_s[world]['exited'])} |"
        print(line)
    print("\nWhen `octopipe run`'s lines arrived (wall s from its start; fastest | median):\n")
    for what in trees:
        for world in args.ranks:
            for key, values in rows[what][world].items():
                print(f"| {what} | {world} ranks | {key} | {_fastest_median(values)} |")


if __name__ == "__main__":
    main()
