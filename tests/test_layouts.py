"""Choosing the parallel degrees on a cluster: GPU specs, topology, layouts, the search, and
`octopipe plan --gpus`."""

from __future__ import annotations

import json
import math
import tomllib

import pytest

from octopipe import api
from octopipe.cli import main
from octopipe.costmodel.hardware import PRESETS
from octopipe.errors import InputError
from octopipe.layouts import (
    Job,
    JobShape,
    LayoutCosts,
    LayoutSearch,
    candidate_layouts,
    megatron_layout,
    plan_cluster,
)
from octopipe.layouts.cluster import Cluster, parse_gpus
from octopipe.layouts.planner import TUNE_EVALUATIONS
from octopipe.layouts.search import runner_space
from octopipe.layouts.spec import parse_layout
from octopipe.layouts.stack import Stack
from octopipe.plan import load_plan
from octopipe.profile import load_profile
from octopipe.sim import Simulator

H100, A100 = PRESETS["h100"], PRESETS["a100"]


def test_gpu_specs_name_counts_and_presets():
    (g,) = parse_gpus("16", "a100")
    assert (g.count, g.hardware.name) == (16, "a100")
    mixed = parse_gpus("4xh100, 4xA100")
    assert [(g.count, g.hardware.name) for g in mixed] == [(4, "h100"), (4, "a100")]
    for bad in ("", "x", "0", "4xh100,,", "4 h100"):
        with pytest.raises(InputError):
            parse_gpus(bad)
    with pytest.raises(InputError, match="does not fill whole nodes"):
        Cluster(parse_gpus("8xh100,8xa100"), 16)
    with pytest.raises(InputError, match="do not fill whole nodes"):
        Cluster(parse_gpus("12"), 8)
    assert Cluster(parse_gpus("6"), 8).size == 6  # one part-filled node is fine


def test_replica_topology_numbers_gpus_tp_then_pp_then_dp():
    # 32 GPUs in nodes of 8, TP 2 x PP 4 x DP 4: a replica's 4 devices are GPUs 0, 2, 4, 6 of
    # node 0, its DP peers 8, 16, 24 GPUs away, on other nodes.
    cluster = Cluster(parse_gpus("32"), 8)
    topo = cluster.replica_topology(tp=2, pp=4, dp=4)
    assert [d.node for d in topo.devices] == [0, 0, 0, 0]
    assert topo.links.intra_node.bandwidth == H100.tp_bandwidth
    assert topo.links.inter_node.bandwidth == H100.link_bandwidth
    assert topo.data_parallel.degree == 4
    assert topo.data_parallel.bandwidth == H100.link_bandwidth  # the ring crosses nodes
    # TP 4 x PP 4: a replica spans two nodes, devices 0-1 on one, 2-3 on the next.
    wide = cluster.replica_topology(tp=4, pp=4, dp=2)
    assert [d.node for d in wide.devices] == [0, 0, 1, 1]
    # A whole DP ring inside one node runs over NVLink.
    small = Cluster(parse_gpus("8"), 8).replica_topology(tp=1, pp=2, dp=4)
    assert small.data_parallel.bandwidth == H100.tp_bandwidth
    assert Cluster(parse_gpus("8"), 8).replica_topology(1, 8, 1).data_parallel.degree == 1


def test_mixed_clusters_give_devices_their_presets_memory_and_speed():
    cluster = Cluster(parse_gpus("4xh100,4xa100"), 4)
    pipeline = cluster.replica_topology(tp=1, pp=8, dp=1, speed={"h100": 1.0, "a100": 0.4})
    assert [d.speed for d in pipeline.devices] == [1.0] * 4 + [0.4] * 4
    assert [d.node for d in pipeline.devices] == [0] * 4 + [1] * 4
    assert pipeline.devices[4].memory_bytes == A100.memory_bytes
    assert len(pipeline.replicas) == 1
    # The slower preset's links: the profile holds one link of each kind.
    assert pipeline.links.inter_node.bandwidth == A100.link_bandwidth
    assert pipeline.links.intra_node.bandwidth == A100.tp_bandwidth
    replicated = cluster.replica_topology(tp=1, pp=4, dp=2, speed={"a100": 0.4})
    # Replica 0 on the H100 node, replica 1 on the A100s: two distinct replicas.
    assert [[d.speed for d in r] for r in replicated.replicas] == [[1.0] * 4, [0.4] * 4]


def test_replicas_alike_but_for_their_nodes_are_one():
    # 64 GPUs, TP 1 x PP 4 x DP 16: replica r sits on node r // 2, a replica on one node.
    topo = Cluster(parse_gpus("64"), 8).replica_topology(tp=1, pp=4, dp=16)
    assert topo.replicas == (topo.devices,)
    assert {d.node for d in topo.devices} == {0}


def test_candidate_layouts_cover_the_cluster_and_the_global_batch():
    cluster = Cluster(parse_gpus("16"), 8)
    layouts = candidate_layouts(cluster, 64, num_layers=10, tp_fits=lambda tp: tp != 4)
    assert layouts
    for lay in layouts:
        assert lay.tp * lay.pp * lay.dp == 16
        assert lay.dp * lay.num_microbatches * lay.microbatch_size == 64
        assert 8 % lay.tp == 0 and lay.tp != 4 and lay.pp <= 10
    assert {lay.pp for lay in layouts} == {1, 2, 4, 8}  # 16 stages exceed the 10 layers
    assert JobShape(1, 2, 8, 1, 8) in layouts and JobShape(1, 2, 8, 8, 1) in layouts


def test_megatrons_usual_layout_fills_a_node_with_tp():
    cluster = Cluster(parse_gpus("64"), 8)
    first = megatron_layout(cluster, 512, num_layers=80, tp_fits=lambda tp: True)[0]
    assert (first.tp, first.pp, first.dp, first.microbatch_size) == (8, 1, 8, 1)
    assert first.shards_optimizer  # the distributed optimizer
    # Heads that do not split 8 ways: the largest TP that fits.
    assert megatron_layout(cluster, 512, 80, lambda tp: tp <= 4)[0].tp == 4


def test_zero1_keeps_a_dp_th_of_the_optimizer_state():
    # 16 bytes a parameter in BF16 with BF16 gradients: 4 kept whole, 12 of Adam state sharded.
    job = Job("tiny-llama", Cluster(parse_gpus("8"), 8), 64, 64, Stack(grad_dtype="bf16"))
    costs = LayoutCosts(job)
    full, _ = costs.profile(JobShape(1, 2, 4, 1, 16))
    sharded, _ = costs.profile(JobShape(1, 2, 4, 1, 16, zero=1))
    for a, b in zip(full.layers, sharded.layers):
        assert b.param_bytes == math.ceil(a.param_bytes * (4 + 12 / 4) / 16)
    assert sharded.data_parallel.sharded and not full.data_parallel.sharded


def test_zero1_shards_the_experts_state_over_the_ranks_holding_each_expert():
    job = Job("tiny-moe", Cluster(parse_gpus("8"), 8), 64, 64, Stack(grad_dtype="bf16"))
    costs = LayoutCosts(job)
    dense, _ = costs.profile(JobShape(1, 1, 8, 1, 8, zero=1))
    experts, _ = costs.profile(JobShape(1, 1, 8, 1, 8, zero=1, ep=2))
    layer = next(i for i, l in enumerate(dense.layers) if l.kind == "moe")
    estimates = costs.layers(JobShape(1, 1, 8, 1, 8, ep=2))
    e = estimates[layer]
    assert 0 < e.expert_params < e.params
    want = (e.params - e.expert_params) * (4 + 12 / 8) + e.expert_params * (4 + 12 / 4)
    assert experts.layers[layer].param_bytes == math.ceil(want)
    assert experts.layers[layer].param_bytes < dense.layers[layer].param_bytes  # half the experts


def test_a_replica_on_slower_gpus_sets_the_step_time():
    job = Job("tiny-llama", Cluster(parse_gpus("4xh100,4xa100"), 4), 16, seq_len=128)
    search = LayoutSearch(job)
    lay = JobShape(tp=1, pp=4, dp=2, microbatch_size=1, num_microbatches=8)
    (row,) = search.baselines(lay, [("1f1b", "uniform", None)])
    profile, replicas = search.profile(lay)
    assert len(replicas) == 2
    times = [Simulator(profile.with_devices(r)).run(row.plan).iteration_time for r in replicas]
    assert times[1] > times[0]  # the A100 replica is slower
    assert row.sim.iteration_time == pytest.approx(times[1])
    assert row.step_time > row.sim.iteration_time  # and the optimizer step after it
    # The row's profile is the slow replica's: it reproduces the row's figures.
    assert Simulator(row.profile).run(row.plan).iteration_time == pytest.approx(times[1])


def test_no_layout_left_out_by_its_bound_beats_the_answer():
    # Every layout of the space screened (no bound, no cap) and the search's tuner (its own
    # evaluations, from each layout's screening row) run on each of the twelve best: the
    # search, which screens best bound first, stops where no bound can beat its answer and
    # tunes the best few, is at least as fast as all of them.
    job = Job("tiny-llama", Cluster(parse_gpus("8"), 4), global_batch=16, seq_len=256)
    report = plan_cluster(job)
    assert report.pruned > 0 and report.screened < report.candidates  # the bound did work
    assert not report.cut_by_time
    search = LayoutSearch(job)
    space = runner_space(search)  # what octopipe run runs
    assert len(space) == report.candidates
    screened = [r for r in (search.screen(lay) for lay in space) if r is not None and r.sim.fits]
    best = sorted(screened, key=lambda r: r.score)[:12]
    tuned = [search.tune(r, TUNE_EVALUATIONS, math.inf, 0, 4)[0] for r in best]
    steps = [t.step_time for t in tuned if t.sim.fits]
    assert report.best.sim.fits
    assert report.best.step_time <= min(r.step_time for r in screened) + 1e-12
    assert report.best.step_time <= min(steps) * (1 + 1e-9)


def test_the_search_counts_every_layout_once_and_bounds_what_a_cap_missed():
    """unfit + screened + skipped + pruned = the space, with and without a cap on the
    screening; a capped screening says by how much at most a layout it left out could beat
    the answer, and none it left out beats that (each screened here)."""
    job = Job("tiny-llama", Cluster(parse_gpus("8"), 4), global_batch=16, seq_len=256)
    reports = {cap: plan_cluster(job, max_screened=cap) for cap in (300, 3)}
    for cap, report in reports.items():
        parts = report.unfit + report.screened_in_space + report.skipped + report.pruned
        assert parts == report.candidates, cap
    capped, whole = reports[3], reports[300]
    assert capped.screened < whole.screened
    (note,) = [n for n in capped.notes if "left out" in n]
    share = float(note.split("more than ")[1].split("%")[0]) / 100 + 0.001  # printed rounded
    assert whole.best.step_time >= capped.best.step_time * (1 - share)


def test_the_answer_is_never_slower_than_the_reference_or_the_given_layout():
    job = Job("tiny-llama", Cluster(parse_gpus("16"), 8), global_batch=64, seq_len=256)
    report = plan_cluster(job, from_layout=parse_layout("tp2,pp2,b2,v2,selective"))
    assert report.reference is not None and report.given is not None
    assert report.given.layout == JobShape(2, 2, 4, 2, 8, recompute="selective")
    assert report.given.label == "given" and report.reference.label == "Megatron-LM"
    for ref in (report.reference, report.given):
        assert report.best.score <= ref.score
    # The given layout was tuned: its row among the rows is no slower than as given.
    mine = [r for r in report.rows if r.layout == report.given.layout]
    assert len(mine) == 1 and mine[0].score <= report.given.score


def test_plan_gpus_writes_the_best_layout_with_its_profile(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["plan", "--model", "tiny-llama", "--gpus", "8", "--gpus-per-node", "4"]
    argv += ["--global-batch", "16", "--seq-len", "128", "--time-budget", "20", "--no-png"]
    assert main([*argv, "-o", str(out), "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "Megatron-LM" in text and "tok/s" in text
    profile = load_profile(out / "profile.json")
    plan = load_plan(out / "plan.json", profile.num_layers)
    shape = plan.shape
    assert shape.world_size == 8 and shape.pp == plan.num_devices
    assert shape.dp * plan.num_microbatches * shape.microbatch_size == 16
    assert profile.tensor_parallel == shape.tp
    assert profile.microbatch_size == shape.microbatch_size
    assert profile.data_parallel.degree == shape.dp
    predicted = Simulator(profile).run(plan).iteration_time
    assert json.loads((out / "plan.json").read_text())["predicted"]["iteration_time"] == (
        pytest.approx(predicted)
    )
    toml = tomllib.loads((out / "torchtitan.toml").read_text())["parallelism"]
    assert toml["tensor_parallel_degree"] == shape.tp
    assert toml["data_parallel_replicate_degree"] == shape.dp
    assert toml["pipeline_parallel_microbatch_size"] == shape.microbatch_size


def test_plan_gpus_with_overlapped_steps_ranks_by_the_steady_step(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["plan", "--model", "tiny-llama", "--gpus", "8", "--gpus-per-node", "4"]
    argv += ["--global-batch", "16", "--seq-len", "128", "--time-budget", "20", "--no-png"]
    assert main([*argv, "--overlap-steps", "-o", str(out), "--quiet"]) == 0
    assert "Megatron-LM" in capsys.readouterr().out
    profile = load_profile(out / "profile.json")
    plan = load_plan(out / "plan.json", profile.num_layers)
    predicted = json.loads((out / "plan.json").read_text())["predicted"]
    steady = Simulator(profile).run(plan, overlap_steps=True)
    assert predicted["step_time"] == pytest.approx(steady.iteration_time)
    synchronous = Simulator(profile).run(plan)
    assert steady.steady.first_step_time == pytest.approx(synchronous.iteration_time)
    assert steady.iteration_time <= synchronous.iteration_time + 1e-12


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--devices", "4"], "--devices: the cluster layout decides"),
        (["--tp", "2"], "--tp: the cluster layout decides"),
        (["--global-batch", "0"], "argument --global-batch: expected an integer from 1 to"),
        (["--gpus-per-node", "0"], "argument --gpus-per-node: expected an integer from 1 to"),
    ],
)
def test_plan_gpus_refuses_bad_input_in_one_line(tmp_path, capsys, extra, message):
    argv = ["plan", "--model", "tiny-llama", "--gpus", "8", *extra, "-o", str(tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_cluster_no_layout_fits_is_refused_in_one_line(tmp_path, capsys):
    # One sample per step leaves DP 1; TP at most a node of 4 leaves PP >= 16 > the 7 layers,
    # and sequences of 1024 tokens leave no context parallelism (ranks keep 1024 at least).
    argv = ["plan", "--model", "tiny-llama", "--gpus", "64", "--gpus-per-node", "4"]
    assert main([*argv, "--global-batch", "1", "--seq-len", "1024", "-o", str(tmp_path)]) == 2
    assert "no TP x CP x PP x DP layout of 64 GPUs" in capsys.readouterr().err


def test_the_tuner_refuses_plans_too_large_to_tune_in_bounded_time():
    profile = api.profile_from_config("tiny-llama", devices=16, seq_len=64)
    with pytest.raises(InputError, match="at most 262,144"):
        api.tune(profile, 300_000)


def _burn(stop) -> None:
    """Keep a core busy until `stop` is set (a loaded machine)."""
    while not stop.is_set():
        sum(i * i for i in range(10_000))


def test_the_same_job_gives_the_same_plan_on_a_loaded_machine(tmp_path):
    # The search counts its work in layouts and evaluations, not seconds: a second run with
    # both cores busy elsewhere writes the same plan, byte for byte.
    import multiprocessing as mp

    argv = ["plan", "--model", "tiny-llama", "--gpus", "8", "--gpus-per-node", "4"]
    argv += ["--global-batch", "16", "--seq-len", "256", "--no-png", "--quiet"]
    assert main([*argv, "-o", str(tmp_path / "quiet")]) == 0
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    burners = [ctx.Process(target=_burn, args=(stop,), daemon=True) for _ in range(2)]
    for p in burners:
        p.start()
    try:
        assert main([*argv, "-o", str(tmp_path / "loaded")]) == 0
    finally:
        stop.set()
        for p in burners:
            p.join(timeout=30)
    for name in ("plan.json", "profile.json", "schedule.csv"):
        assert (tmp_path / "quiet" / name).read_bytes() == (tmp_path / "loaded" / name).read_bytes()


def test_plan_gpus_json_names_the_chosen_and_the_reference_layouts(tmp_path, capsys):
    argv = ["plan", "--model", "tiny-llama", "--gpus", "8", "--gpus-per-node", "4"]
    argv += ["--global-batch", "16", "--seq-len", "256", "--no-png", "--quiet", "--json"]
    argv += ["--from-layout", "tp2,pp2,b1", "-o", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    summary = json.loads(out.strip().splitlines()[-1])
    keys = {"tp", "cp", "pp", "dp", "ep", "microbatch_size", "microbatches", "recompute", "zero"}
    keys |= {"step_time", "peak_memory_bytes", "fits"}
    for who in ("chosen", "reference", "given"):
        assert keys <= set(summary[who]), who
    assert summary["chosen"]["step_time"] <= summary["reference"]["step_time"]
    assert summary["chosen"]["step_time"] <= summary["given"]["step_time"]
    assert summary["given"]["tp"] == 2 and summary["given"]["pp"] == 2
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["parallelism"]["tp"] == summary["chosen"]["tp"]
    assert "torchrun" in out and "octopipe run" in out  # how to launch it
    assert summary["search"]["evaluations"] > 0 and not summary["search"]["cut_by_time"]


def test_run_refuses_a_plan_with_degrees_it_does_not_run(tmp_path, capsys):
    """Context parallelism runs (tests/test_context_parallel.py); what it does not combine
    with yet is one line."""
    from octopipe.plan import save_plan

    plan = api.baseline(api.profile_from_config("tiny-llama", devices=2), "1f1b", "uniform", 4)
    save_plan(plan.with_shape(tp=2, dp=2, microbatch_size=1, cp=2), tmp_path / "cp.json")
    argv = ["run", "--plan", str(tmp_path / "cp.json"), "--model", "tiny-llama"]
    assert main([*argv, "--seq-len", "64", "--zero", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "3 with --cp 2 and --tp 2 is not built yet" in err


def test_plan_gpus_with_torchtitan_keeps_to_placements_torchtitan_builds(tmp_path, capsys):
    from octopipe.placement import torchtitan_style

    argv = ["plan", "--model", "tiny-llama", "--gpus", "8", "--gpus-per-node", "4"]
    argv += ["--global-batch", "16", "--seq-len", "256", "--no-png", "--quiet", "--torchtitan"]
    assert main([*argv, "-o", str(tmp_path)]) == 0
    plan = load_plan(tmp_path / "plan.json")
    assert torchtitan_style(plan.placement, plan.num_devices) is not None
    assert "torchtitan" in capsys.readouterr().out  # how to run it there, or why not
