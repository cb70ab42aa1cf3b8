"""What `kill -9` of `octopipe run`'s launcher leaves behind, and for how long.

    .venv/bin/python benchmarks/bench_launcher_kill.py [--runs 3]

Each run starts `octopipe run` of tiny-llama on 2 ranks (a 1F1B plan, many steps), kills the
launcher with SIGKILL at a moment (`starting`: as soon as a process below it exists, importing
torch (on Linux the starter the ranks are forked from); `training`: after the first step line),
and polls /proc every 10 ms for the processes below it then (the starter and its ranks, but
multiprocessing's resource tracker), until none is left alive (a zombie
waiting for its reaper counts as gone). The table gives the seconds until the last rank was
gone and whether anything warned of leaked semaphores (multiprocessing's resource tracker
prints that when the launcher dies holding any).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def _children(pid: int) -> list[int]:
    """Every process below `pid` (on Linux its ranks are forked from a starter it spawned: all
    of them count), but multiprocessing's resource tracker."""
    parent_of = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if b"resource_tracker" not in cmdline:
                parent_of[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [pid]
    while frontier:
        below = [child for child, parent in parent_of.items() if parent in frontier]
        found += below
        frontier = below
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def one_run(folder: Path, moment: str) -> tuple[float, bool, int]:
    """Seconds from the kill until no rank is alive, whether a leak was reported, ranks seen."""
    argv = [sys.executable, "-m", "octopipe", "run", "--plan", str(folder / "plan.json")]
    argv += ["--model", "tiny-llama", "--steps", "100000", "--seq-len", "16", "--json"]
    env = {**os.environ, "PYTHONPATH": str(HERE / "src")}
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    if moment == "training":
        proc.stdout.readline()  # the first step's JSON line
    else:  # as soon as a process below the launcher exists: it is importing torch
        while not _children(proc.pid) and proc.poll() is None:
            time.sleep(0.01)
    ranks = _children(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)
    killed = time.perf_counter()
    while any(_alive(p) for p in ranks) and time.perf_counter() - killed < 30:
        time.sleep(0.01)
    gone = time.perf_counter() - killed
    proc.wait()
    time.sleep(1.0)  # the resource tracker's warning, if any, comes as it notices
    err = proc.stderr.read() if proc.stderr else ""
    leaked = "leaked semaphore" in err
    for p in ranks:  # a failed run must not leave its ranks behind
        if _alive(p):
            os.kill(p, signal.SIGKILL)
    return gone, leaked, len(ranks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    sys.path.insert(0, str(HERE / "src"))
    from octopipe import baseline, profile_from_config, save_plan

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        plan = baseline(profile_from_config("tiny-llama", devices=2), "1f1b", "uniform", 2)
        save_plan(plan, folder / "plan.json")
        print(
            "| kill -9 while | ranks | last rank gone after (s): median, max | leaked semaphores |"
        )
        print("|---|---|---|---|")
        for moment in ("starting", "training"):
            results = [one_run(folder, moment) for _ in range(args.runs)]
            times = [t for t, _, _ in results]
            leaks = sum(leak for _, leak, _ in results)
            ranks = {n for _, _, n in results}
            print(
                f"| {moment} | {'/'.join(map(str, sorted(ranks)))} | "
                f"{statistics.median(times):.2f}, {max(times):.2f} | {leaks} of {args.runs} runs |"
            )
            sys.stdout.flush()


if __name__ == "__main__":
    main()
