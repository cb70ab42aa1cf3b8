"""Overlapped steps: the plan's orders repeated with no barrier, and the steady step time.

Checked against closed forms and against the zero-bubble paper's own figures (Qi et al., ICLR
2024, Tables 5 and 9, `benchmarks/data/zb_paper_bubble_rates.csv`): ZB-H2's published bubble
rates are those of overlapped steps.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
from sim_helpers import one_f_one_b, uniform_profile

from octopipe.api import baseline, tune
from octopipe.cli import main
from octopipe.costs import CostTable, stage_costs
from octopipe.plan import check_structure, save_plan
from octopipe.profile import DataParallel, Device, LayerCost, Link, Profile, save_profile
from octopipe.schedules.list_scheduler import Rules, list_schedule
from octopipe.sim import Simulator
from octopipe.sim.graph import build_graph
from octopipe.sim.steps import repeat_graph, repeat_steps, settled_period
from octopipe.tuner.candidate import Candidate, Evaluator
from octopipe.tuner.local_search import OVERLAP_WARMUPS, Search
from octopipe.tuner.seeds import with_fill_tails

PAPER = Path(__file__).parents[1] / "benchmarks" / "data" / "zb_paper_bubble_rates.csv"


def paper_rows() -> list[dict[str, str]]:
    lines = [line for line in PAPER.read_text().splitlines() if not line.startswith("#")]
    return list(csv.DictReader(lines))


def paper_profile(row: dict[str, str]) -> Profile:
    """One layer per device with the paper's profiled T_F, T_B, T_W (ms) and T_comm."""
    p = int(row["p"])
    f, b, w, comm = (float(row[k]) / 1000 for k in ("T_F", "T_B", "T_W", "T_comm"))
    layer = dict(f=f, b=b, w=w, act_bytes=2, wact_bytes=1, param_bytes=0, out_bytes=0)
    return Profile(
        name=f"zb-{row['model']}",
        layers=tuple(LayerCost(name=f"layers.{i}", **layer) for i in range(p)),
        devices=tuple(Device() for _ in range(p)),
        link=Link(latency=comm),
    )


def test_repeating_steps_renumbers_microbatches_and_keeps_each_devices_order():
    plan = one_f_one_b(2, 3)
    twice = repeat_steps(plan, 2)
    check_structure(twice)
    assert twice.num_microbatches == 6 and twice.stages == plan.stages
    for d, acts in plan.schedule.items():
        again = twice.schedule[d]
        assert again[: len(acts)] == acts
        assert [(a.stage, a.kind, a.mb - 3) for a in again[len(acts) :]] == [
            (a.stage, a.kind, a.mb) for a in acts
        ]


def test_one_device_has_nothing_to_overlap():
    # A lone device runs its work back to back: every step takes exactly its work.
    profile = uniform_profile(1, f=1.0, b=2.0, w=0.0, devices=1)
    result = Simulator(profile).run(one_f_one_b(1, 4), overlap_steps=True)
    assert result.iteration_time == pytest.approx(12.0)
    assert result.steady.first_step_time == pytest.approx(12.0)
    assert result.steady.converged and result.busy == (pytest.approx(12.0),)


def test_1f1b_does_not_overlap_its_steps():
    # Device 0 ends a 1F1B step with the step's last backward, which waits for the whole
    # pipeline: the next step cannot start any earlier than after a barrier.
    profile = uniform_profile(4, devices=4, link=Link(latency=0.1))
    plan = one_f_one_b(4, 8)
    sim = Simulator(profile)
    alone, overlapped = sim.run(plan), sim.run(plan, overlap_steps=True)
    assert overlapped.iteration_time == pytest.approx(alone.iteration_time, rel=1e-12)


@pytest.mark.parametrize("row", paper_rows(), ids=lambda r: f"{r['model']}-p{r['p']}-m{r['m']}")
def test_zbh2_overlapped_reproduces_the_papers_bubble_rate(row):
    profile = paper_profile(row)
    plan = baseline(profile, "zbh2", "uniform", num_microbatches=int(row["m"]))
    overlapped = Simulator(profile).run(plan, overlap_steps=True)
    assert overlapped.steady.converged
    assert overlapped.bubble_ratio == pytest.approx(float(row["ZB-H2"]), abs=1e-4)
    # 1F1B and ZB-H1 are the same with and without overlap, and match the paper too.
    for schedule, column in (("1f1b", "1F1B"), ("zbh1", "ZB-H1")):
        plan = baseline(profile, schedule, "uniform", num_microbatches=int(row["m"]))
        result = Simulator(profile).run(plan, overlap_steps=True)
        assert result.bubble_ratio == pytest.approx(float(row[column]), abs=1e-4)


def test_overlap_shortens_zbh2_steps_at_the_same_peak_memory():
    # A device finishes step k before step k+1's first action, so its activations are back to
    # the step's starting level: the repeated run peaks where one step does.
    row = next(r for r in paper_rows() if r["model"] == "6.2B")
    profile = paper_profile(row)
    plan = baseline(profile, "zbh2", "uniform", num_microbatches=int(row["m"]))
    sim = Simulator(profile)
    alone, overlapped = sim.run(plan), sim.run(plan, overlap_steps=True)
    assert overlapped.iteration_time < alone.iteration_time
    assert overlapped.peak_memory_bytes == alone.peak_memory_bytes


def test_a_period_is_found_only_where_the_increments_repeat():
    assert settled_period([3.0, 2.0, 2.0, 2.0], 2.0) == 1
    assert settled_period([5.0, 1.0, 3.0, 1.0, 3.0, 1.0, 3.0], 2.0) == 2
    assert settled_period([4.0, 3.0, 2.5, 2.2], 2.0) == 0
    # Two equal increments are not yet a period: a period of 3 may end in them.
    assert settled_period([1.0, 1.0, 4.0, 1.0, 1.0], 2.0) == 0


def data_parallel(profile: Profile, grad_bytes: float, bandwidth: float) -> Profile:
    """`profile` with two replicas: every layer all-reduces `grad_bytes` of gradients."""
    layers = tuple(l.model_copy(update={"grad_bytes": grad_bytes}) for l in profile.layers)
    dp = DataParallel(degree=2, bandwidth=bandwidth)
    return profile.model_copy(update={"layers": layers, "data_parallel": dp})


def test_with_one_device_a_step_is_its_work_then_its_all_reduce():
    # Nothing overlaps the all-reduce: F + B of 3 microbatches (9 s), then 10 s of all-reduce
    # (2 (D-1)/D * 10 bytes at 1 byte/s), and only then the next step.
    profile = data_parallel(uniform_profile(1, devices=1), grad_bytes=10, bandwidth=1.0)
    plan = one_f_one_b(1, 3)
    overlapped = Simulator(profile).run(plan, overlap_steps=True)
    assert overlapped.iteration_time == pytest.approx(19.0)
    assert overlapped.steady.first_step_time == pytest.approx(19.0)
    assert Simulator(profile).run(plan).iteration_time == pytest.approx(19.0)


@pytest.mark.parametrize("schedule", ["1f1b", "zbh2", "zbv", "i1f1b"])
def test_all_reduces_hold_back_each_devices_next_step(schedule):
    no_dp = uniform_profile(4, devices=2)
    plan = baseline(no_dp, schedule, "uniform", num_microbatches=4)
    free = Simulator(no_dp).run(plan, overlap_steps=True)
    times = []
    for bandwidth in (1e12, 20.0, 5.0, 1.0):
        profile = data_parallel(no_dp, grad_bytes=10, bandwidth=bandwidth)
        sync = Simulator(profile).run(plan)
        overlapped = Simulator(profile).run(plan, overlap_steps=True)
        assert overlapped.steady.converged
        # Step 0 alone is the synchronous step, its all-reduces included.
        assert overlapped.steady.first_step_time == pytest.approx(sync.iteration_time)
        assert free.iteration_time - 1e-9 <= overlapped.iteration_time
        assert overlapped.iteration_time <= sync.iteration_time + 1e-9
        assert overlapped.peak_memory_bytes == free.peak_memory_bytes
        assert overlapped.busy == free.busy
        times.append(overlapped.iteration_time)
    assert times[0] == pytest.approx(free.iteration_time)  # all-reduces that take no time
    assert times == sorted(times) and times[-1] > times[0]


def test_the_tuner_ranks_data_parallel_plans_by_the_overlapped_step():
    profile = data_parallel(uniform_profile(8, devices=2), grad_bytes=10, bandwidth=5.0)
    result = tune(profile, 4, 2, time_budget=20, overlap_steps=True)
    best = result.best.sim
    assert best.fits and best.steady is not None and best.steady.converged
    again = Simulator(profile).run(result.best.plan, overlap_steps=True)
    assert again.iteration_time == pytest.approx(best.iteration_time)
    for e in result.baselines:
        assert e.sim.steady is not None and best.iteration_time <= e.sim.iteration_time + 1e-9


def test_simulate_overlap_steps_json(tmp_path, capsys):
    row = next(r for r in paper_rows() if r["model"] == "6.2B")
    profile = paper_profile(row)
    plan = baseline(profile, "zbh2", "uniform", num_microbatches=int(row["m"]))
    save_profile(profile, tmp_path / "p.json")
    save_plan(plan, tmp_path / "plan.json")
    argv = [
        "simulate",
        "--profile",
        str(tmp_path / "p.json"),
        "--plan",
        str(tmp_path / "plan.json"),
    ]
    assert main([*argv, "--overlap-steps", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["step_time"] == out["iteration_time"] < out["first_step_time"]
    assert out["step_time_converged"] is True
    assert out["bubble_ratio"] == pytest.approx(float(row["ZB-H2"]), abs=1e-4)
    assert main(argv) == 0  # without the flag: one synchronous step, no step_time
    assert "step" not in capsys.readouterr().out.split(":")[1].split(",")[0]
    assert main([*argv, "--overlap-steps", "--png", str(tmp_path / "t.png")]) == 2


def test_kept_w_run_at_the_end_of_the_step():
    # Device 1 waits 1 s for each forward. Without a tail it spends that wait on a deferred W;
    # keeping 3 W for the end, it never has more than 3 pending before its last I.
    profile = uniform_profile(2, devices=2, link=Link(latency=0.5))
    costs = CostTable(profile)
    stages = stage_costs(costs, [(0, 1), (1, 2)], [0, 1], profile.device_list())
    filled = list_schedule(stages, 2, 4, Rules(inflight=(2, 1))).orders[1]
    assert [str(a) for a in filled] == ("1F0 1I0 1F1 1I1 1W0 1F2 1I2 1F3 1I3 1W1 1W2 1W3".split())
    kept = list_schedule(stages, 2, 4, Rules(inflight=(2, 1), tail_w=(0, 3))).orders[1]
    assert [str(a) for a in kept] == "1F0 1I0 1F1 1I1 1F2 1I2 1F3 1I3 1W0 1W1 1W2 1W3".split()


@pytest.mark.parametrize("model", ["6.2B", "1.5B"])
def test_the_tuner_reaches_zb2p_with_steps_overlapped(model):
    # The paper's ZB-2p: memory for 2p microbatches of activations; ours within half a point.
    row = next(r for r in paper_rows() if r["model"] == model and r["m"] in ("24", "32"))
    profile = paper_profile(row)
    p, act = int(row["p"]), profile.layers[0].act_bytes
    profile = profile.with_devices([Device(memory_bytes=2 * p * act) for _ in range(p)])
    result = tune(profile, int(row["m"]), max_chunks=1, time_budget=300.0, overlap_steps=True)
    assert result.converged  # deterministic: not cut short by the clock
    best = result.best.sim
    assert best.fits and best.steady is not None
    assert best.bubble_ratio <= float(row["ZB-2p"]) + 0.005
    zbh2 = next(e for e in result.baselines if e.label == "zbh2/uniform")
    assert best.iteration_time < zbh2.sim.iteration_time


def test_refining_the_warm_up_finds_what_the_coarse_scan_misses():
    # With steps overlapped the step time is sharp in the warm-up depth: on the 1.5B, m = 32
    # row the best of the seeds' scan (steps of 0.5) is beaten between its points.
    row = next(r for r in paper_rows() if r["model"] == "1.5B" and r["m"] == "32")
    p, m = int(row["p"]), int(row["m"])
    profile = paper_profile(row)
    profile = profile.with_devices([Device(memory_bytes=2 * p * 2) for _ in range(p)])
    simulator = Simulator(profile)
    evaluator = Evaluator(profile, profile.device_list(), m, simulator.costs, simulator)
    one_per_device = Candidate(tuple((i, i + 1) for i in range(p)), tuple(range(p)))
    start = with_fill_tails(evaluator, one_per_device)
    search = Search(evaluator, math.inf, 0, None, lambda placement: True)
    scanned = [search.evaluate(start.but(warmup=w)) for w in OVERLAP_WARMUPS]
    coarse = min(scanned, key=lambda o: o.score)
    refined = search._refine_warmup(coarse)
    assert refined.fits and refined.makespan < coarse.makespan * 0.995
    assert refined.candidate.warmup not in OVERLAP_WARMUPS
    assert refined.candidate.but(warmup=coarse.candidate.warmup) == coarse.candidate


def test_plan_overlap_steps_writes_the_step_time(tmp_path, capsys):
    argv = ["plan", "--model", "tiny-llama", "--devices", "2", "--microbatches", "4"]
    argv += ["--overlap-steps", "--time-budget", "5", "--no-png", "-o", str(tmp_path)]
    assert main(argv) == 0
    assert "steps overlapped" in capsys.readouterr().out
    predicted = json.loads((tmp_path / "plan.json").read_text())["predicted"]
    assert predicted["step_time"] == predicted["iteration_time"]


def test_the_repeated_graph_is_the_repeated_plan_lowered():
    profile = uniform_profile(3, devices=2, link=Link(latency=0.1))
    plan = baseline(profile, "zbh1", "uniform", num_microbatches=4)
    costs = CostTable(profile)
    devices = profile.device_list()
    fast = repeat_graph(build_graph(costs, plan, devices), 3)
    lowered = build_graph(costs, repeat_steps(plan, 3), devices)
    assert fast.rows == lowered.rows
    assert fast.mem_delta == lowered.mem_delta and fast.num_ids == lowered.num_ids
