"""What makes `plan --gpus` fast must not change its answer: the same plan on every run, the
finalists tuned on forked workers as in one process, layers that cost the same estimated once,
and layer estimates shared between PP degrees only where they cannot differ."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from octopipe.costmodel.arch import layer_specs
from octopipe.costmodel.build import _estimate, estimate_layers
from octopipe.costmodel.hardware import hardware_preset
from octopipe.costmodel.hf_config import load_architecture
from octopipe.costmodel.layercost import layer_work
from octopipe.layouts import Job, plan_cluster
from octopipe.layouts.cluster import Cluster, parse_gpus
from octopipe.layouts.costs import LayoutCosts
from octopipe.layouts.layout import JobShape
from octopipe.layouts.stack import Stack, layer_settings


def tiny_job() -> Job:
    return Job("tiny-llama", Cluster(parse_gpus("8"), 4), global_batch=16, seq_len=256)


def answer(report) -> tuple:
    """Everything the report answers: every row's summary and the chosen plan itself."""
    return (
        [r.summary() for r in report.rows],
        report.best.plan.to_dict(),
        report.best_standard.summary() if report.best_standard else None,
        report.screened,
        report.evaluations,
    )


def test_the_same_job_gives_the_same_plan_twice():
    first, second = plan_cluster(tiny_job(), workers=1), plan_cluster(tiny_job(), workers=1)
    assert first.tuned >= 2  # several finalists were tuned: the run exercised the tuner
    assert answer(first) == answer(second)


# In a fresh process: the search forks only while no other thread runs, and tests before this
# one may leave threads in pytest's process.
FORKED_AGAINST_SERIAL = """
import multiprocessing, resource, sys
sys.path.insert(0, sys.argv[1])
from test_cluster_speed import answer, tiny_job
from octopipe.layouts import plan_cluster
from octopipe.layouts.fanout import can_fork
serial = plan_cluster(tiny_job(), workers=1)
assert can_fork(), "a fresh process runs no other thread"
before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
forked = plan_cluster(tiny_job(), workers=2)
assert resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime > before, "no worker ran"
assert forked.workers == 2 and len(forked.tune_cpu) >= 2, "not tuned on two workers"
assert answer(forked) == answer(serial), "the forked search answers otherwise"
assert multiprocessing.active_children() == [], "a worker is left running"
print("same answer")
"""


def _in_a_fresh_process(script: str) -> None:
    """Run `script` where no other thread runs (the search forks only then): it prints
    "same answer" when its checks hold."""
    done = subprocess.run(
        [sys.executable, "-c", script, str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "same answer"


def test_finalists_tuned_on_two_workers_give_the_serial_answer():
    _in_a_fresh_process(FORKED_AGAINST_SERIAL)


@pytest.mark.parametrize("model", ["tiny-vlm", "tiny-deepseek", "tiny-gemma", "tiny-hybrid"])
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_layers_estimated_once_per_kind_equal_each_estimated_alone(model, recompute):
    arch, hw = load_architecture(model), hardware_preset("h100")
    s = layer_settings(
        tp=1, cp=1, microbatch_size=2, recompute=recompute, stack=Stack(), seq_len=256
    )
    specs = layer_specs(arch)
    alone = [
        _estimate(arch, specs, i, layer_work(arch, sp, s), hw, s) for i, sp in enumerate(specs)
    ]
    assert estimate_layers(arch, hw, s) == alone


def test_moe_layers_shared_between_pp_degrees_equal_a_fresh_estimate():
    # 16 GPUs on nodes of 4, DP ranks PP apart (OctoPipe's numbering): an EP group of 2 stays
    # in a node at PP 1 and 2 (those share layers) and crosses nodes at PP 4.
    job = Job("tiny-moe", Cluster(parse_gpus("16"), 4), global_batch=16, seq_len=256)
    shared = LayoutCosts(job)
    crossing = []
    for pp in (1, 2, 4):
        layout = JobShape(1, pp, 16 // pp, 1, pp, ep=2)
        fresh = LayoutCosts(job)
        crossing.append(shared.ep_across_nodes(layout))
        assert crossing[-1] == fresh.ep_across_nodes(layout)
        assert shared.layers(layout) == fresh.layers(layout)
    assert crossing == [False, False, True]


# In a fresh process, as above: the winner's polish started early on a guess gives what the
# polish run here gives, where it is asked for; a guess not asked for is ended. The guess starts
# only on a worker that would idle: the second finalist waits (on a file) until the guess has
# begun, so the first has freed its worker; without the wait, two finalists that end together
# leave no worker idle and no guess is made (the search then polishes here: a race, not a bug).
GUESSED_POLISH = """
import multiprocessing, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from test_cluster_speed import tiny_job
from octopipe.layouts import LayoutSearch
from octopipe.layouts.fanout import Finalists, TuneJob, tune_one
from octopipe.layouts.layout import JobShape
from octopipe.layouts.planner import POLISH_ACTIONS
begun = Path(tempfile.mkdtemp()) / "guess-begun"
class Ordered(LayoutSearch):
    def tune(self, start, *args, **kw):
        if kw.get("actions") == POLISH_ACTIONS:
            begun.touch()
        elif start is rows[1]:
            waited = time.monotonic()
            while not begun.exists():
                assert time.monotonic() - waited < 120, "the guess never began"
                time.sleep(0.01)
        return super().tune(start, *args, **kw)
search = Ordered(tiny_job())
rows = [search.screen(JobShape(1, 2, 4, 1, 4)), search.screen(JobShape(1, 4, 2, 1, 8))]
jobs = [TuneJob(r, 60, 600.0, 0, 4) for r in rows]
polish = TuneJob(rows[0], 60, 600.0, 0, 4, POLISH_ACTIONS)
asked = TuneJob(rows[0], 60, 300.0, 0, 4, POLISH_ACTIONS)  # another time budget, the same work
def key(tuned):
    return tuned[0].summary(), tuned[0].plan.to_dict(), tuned[1], tuned[2]
def same(a, b):
    return key(a) == key(b)
pool = Finalists(search, jobs, 2)
try:
    tuned = pool.tune(lambda done: polish)
    guessed = pool.polished(asked)
finally:
    pool.close()
assert guessed is not None, "no guess was made"
assert all(same(t, tune_one(search, j)) for t, j in zip(tuned, jobs)), "finalists differ"
assert same(guessed, tune_one(search, asked)), "the guess differs"
assert len(pool.cpu) == len(jobs) + 1, "the guess's CPU seconds not counted"
pool = Finalists(search, jobs, 2)
try:
    pool.tune(lambda done: polish)
    assert pool.polished(TuneJob(rows[1], 60, 600.0, 0, 4, POLISH_ACTIONS)) is None
finally:
    pool.close()
assert multiprocessing.active_children() == [], "a worker is left running"
print("same answer")
"""


def test_a_guessed_polish_gives_the_polish_run_here():
    _in_a_fresh_process(GUESSED_POLISH)
