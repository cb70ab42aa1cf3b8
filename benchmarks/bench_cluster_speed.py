"""How long `octopipe plan --gpus` takes on the published jobs, and what it answers, beside an
older commit.

    .venv/bin/python benchmarks/bench_cluster_speed.py                      # now, every job
    .venv/bin/python benchmarks/bench_cluster_speed.py --against 69a16be    # beside a commit
    .venv/bin/python benchmarks/bench_cluster_speed.py --only 128K --repeat 2
    .venv/bin/python benchmarks/bench_cluster_speed.py --against 69a16be --save before.json
    .venv/bin/python benchmarks/bench_cluster_speed.py --before before.json  # reuse its side

The jobs are bench_layouts.py's: every run of benchmarks/data/published_runs.csv (Narayanan
et al. 2021's Table 1, MT-NLG), Llama-3-405B at Llama 3's three Table 4 layouts and
DeepSeek-V3 on 256 and 1,024 H100s. Each search runs in a fresh process (nothing cached from
the one before), as `plan_cluster(job)` with its defaults, the command's search; with
--against, that commit is checked out in a temporary worktree and each job is searched there
too. The table gives each side's wall seconds, chosen layout and predicted step, whether the
two plans are the same file, and with --repeat 2 whether two runs of now agree. *CPU s* is the
search's and its forked workers' CPU seconds together; *quiet s* what a quiet 2-core machine's
wall time would be: this process's CPU seconds, plus what it would wait for the layout a worker
screens ahead (that job's CPU seconds less this process's since it started), plus the longest
worker's share of the tunings run on workers (the finalists side by side on `workers`
processes, and the winner's polish where a worker took it early), each given in turn to the
first free worker. `--save`
writes every result as JSON; `--before FILE` takes the older side from such a file instead of
running it again (its seconds are then those of the recorded run).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEEPSEEK_GPUS = (256, 1024)


def cases(folder: Path):
    sys.path.insert(0, str(HERE))
    from bench_layouts import published_cases, target_cases

    return [*published_cases(folder), *target_cases(DEEPSEEK_GPUS)]


def child(label: str) -> None:
    """Search one job in this process and print its result as one JSON line."""
    from octopipe.layouts import plan_cluster

    with tempfile.TemporaryDirectory() as tmp:
        case = next(c for c in cases(Path(tmp)) if c.label == label)
        started, cpu, forked = time.perf_counter(), time.process_time(), _children_cpu()
        report = plan_cluster(case.job)
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
        forked = _children_cpu() - forked
    best = report.best
    plan = json.dumps(best.plan.to_dict(), sort_keys=True)
    out = {
        "label": label,
        "seconds": seconds,
        "cpu_seconds": cpu,  # this process only
        "worker_cpu_seconds": forked,  # its forked workers' (the finalists tuned side by side)
        "tune_cpu": list(getattr(report, "tune_cpu", ())),
        "workers": getattr(report, "workers", 1),
        "quiet_seconds": cpu
        + getattr(report, "screen_waited", 0.0)
        + _makespan(list(getattr(report, "tune_cpu", ())), report),
        "chosen": best.summary(),
        "describe": best.layout.describe(),
        "plan_sha": hashlib.sha256(plan.encode()).hexdigest()[:12],
        "screened": report.screened,
        "tuned": report.tuned,
        "evaluations": report.evaluations,
        "cut_by_time": report.cut_by_time,
    }
    for key in ("reference", "best_standard", "recipe"):
        row = getattr(report, key, None)
        out[key] = row.summary() if row is not None else None
    print(json.dumps(out))


def _children_cpu() -> float:
    import resource

    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def _makespan(tune_cpu: list[float], report) -> float:
    """What the finalists' tunings add to a quiet machine's wall time: each job's CPU seconds
    given in turn to the first free worker (the pool's order), the last to finish; nothing
    where they ran in this process (its CPU seconds hold them)."""
    workers = getattr(report, "workers", 1)
    if workers <= 1 or len(tune_cpu) <= 1:
        return 0.0
    free = [0.0] * min(workers, len(tune_cpu))
    for cpu in tune_cpu:
        free[free.index(min(free))] += cpu
    return max(free)


def _cpu_quiet(result: dict) -> list[str]:
    """A result's CPU seconds (this process and its workers) and quiet estimate, as cells."""
    cpu = result["cpu_seconds"] + result.get("worker_cpu_seconds", 0.0)
    quiet = result.get("quiet_seconds", result["cpu_seconds"])
    return [f"{cpu:.1f}", f"{quiet:.1f}"]


def run_side(src: Path, label: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src)}
    done = subprocess.run(
        [sys.executable, __file__, "--child", label],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if done.returncode:
        raise SystemExit(f"{label} at {src}: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def short(result: dict) -> str:
    c = result["chosen"]
    degrees = f"{c['tp']}/{c['pp']}/{c['dp']}"
    extra = "".join(
        [
            f" CP{c['cp']}" if c["cp"] > 1 else "",
            f" EP{c['ep']}" if c["ep"] > 1 else "",
            " Z1" if c["zero"] else "",
            f" {c['recompute'][0]}" if c["recompute"] != "none" else "",
        ]
    )
    fits = "" if c["fits"] else " (does not fit)"
    # the rank order where it is Megatron-Core's (PP outermost); OctoPipe's otherwise
    order = ", m" if "ranks megatron" in result.get("describe", "") else ""
    return (
        f"{degrees}{extra}{order}, {c['microbatch_size']}x{c['microbatches']} {c['plan']}: "
        f"{c['step_time']:.3f} s{fits}"
    )


def beside(result: dict, key: str) -> str:
    """A reference row's step and the chosen plan's gain over it."""
    row = result.get(key)
    if not row:
        return "-"
    gain = row["step_time"] / result["chosen"]["step_time"]
    fits = "" if row["fits"] else ", does not fit"
    return f"{row['step_time']:.3f} s ({row['plan']}{fits}): {gain:.2f}x"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--against", metavar="REV", help="also search with this commit")
    ap.add_argument("--before", metavar="FILE", help="the older side from a --save file")
    ap.add_argument("--save", metavar="FILE", help="write every result here as JSON")
    ap.add_argument("--only", action="append", help="only the jobs whose name holds this text")
    ap.add_argument("--repeat", type=int, default=1, help="search each job this many times now")
    ap.add_argument(
        "--render", metavar="FILE", help="print the table of a --save file, run nothing"
    )
    ap.add_argument(
        "--record-only", action="store_true", help="with --against and --save: only the older side"
    )
    args = ap.parse_args()
    if args.child:
        child(args.child)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        labels = [c.label for c in cases(Path(tmp))]
    labels = [x for x in labels if not args.only or any(o.lower() in x.lower() for o in args.only)]
    before: dict[str, dict] = {}
    rev = args.against
    rendered: dict[str, list[dict]] = {}
    if args.render:
        recorded = json.loads(Path(args.render).read_text())
        rev, before, rendered = recorded["rev"], recorded["before"], recorded["now"]
        labels = [x for x in labels if x in rendered]
    if args.before:
        recorded = json.loads(Path(args.before).read_text())
        rev, before = recorded["rev"], recorded["before"]
    saved: dict = {"rev": rev, "before": dict(before), "now": {}}
    head = ["job"]
    if rev:
        head += [f"{rev}: s", f"{rev}: CPU s", f"{rev}: quiet s", f"{rev}: chosen"]
    head += ["now: s", "now: CPU s", "now: quiet s", "now: chosen"]
    head += ["best_standard", "recipe", "Megatron-LM"]
    if rev:
        head += [f"now / {rev}: step", "same plan"]
    if args.repeat > 1 or any(len(r) > 1 for r in rendered.values()):
        head += ["same twice"]
    print("| " + " | ".join(head) + " |")
    print("|---|" + "---|" * (len(head) - 1))
    with tempfile.TemporaryDirectory() as tree:
        if args.against and not (args.before or args.render):
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "add", "--detach", tree, args.against],
                check=True,
                capture_output=True,
            )
        try:
            for label in labels:
                cells = [label]
                if rev:
                    if label not in before:
                        before[label] = run_side(Path(tree) / "src", label)
                        saved["before"][label] = before[label]
                    old = before[label]
                    cells += [f"{old['seconds']:.1f}", *_cpu_quiet(old), short(old)]
                if args.record_only:
                    Path(args.save).write_text(json.dumps(saved, indent=1))
                    print(f"| {label} | {old['seconds']:.1f} | {short(old)} |", flush=True)
                    continue
                runs = rendered.get(label) or [
                    run_side(ROOT / "src", label) for _ in range(args.repeat)
                ]
                now = runs[0]
                saved["now"][label] = runs
                cells += [f"{now['seconds']:.1f}", *_cpu_quiet(now), short(now)]
                cells += [beside(now, key) for key in ("best_standard", "recipe", "reference")]
                if rev:
                    ratio = now["chosen"]["step_time"] / old["chosen"]["step_time"]
                    cells += [f"{ratio:.4f}", "yes" if now["plan_sha"] == old["plan_sha"] else "no"]
                if len(runs) > 1:
                    cells += ["yes" if len({r["plan_sha"] for r in runs}) == 1 else "NO"]
                print("| " + " | ".join(cells) + " |", flush=True)
                if args.save:
                    Path(args.save).write_text(json.dumps(saved, indent=1))
        finally:
            if args.against and not (args.before or args.render):
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "remove", "--force", tree],
                    capture_output=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
