"""`plan --gpus --runner R`: every answer is one R runs, written as it was priced. For a few
small jobs, each runner's answer passes R's own export (torchtitan's layout and config, Megatron-
LM's arguments, `octopipe run`'s resolution) without refusal and with the same degrees and memory
technique; the references R cannot run are shown, not chosen; bad input is one line."""

from __future__ import annotations

import json

import pytest

from octopipe.cli import main
from octopipe.config import JobConfig
from octopipe.config.sources import from_keywords
from octopipe.costmodel.hf_config import load_architecture
from octopipe.engines import ENGINES, get_engine
from octopipe.engines.megatron import megatron_arguments, megatron_notes, megatron_world
from octopipe.engines.torchtitan import SHIPPED_BASES
from octopipe.engines.torchtitan.config import torchtitan_config_settings
from octopipe.engines.torchtitan.layout import titan_layout
from octopipe.errors import InputError
from octopipe.layouts import Job, plan_cluster
from octopipe.layouts.cluster import Cluster, parse_gpus
from octopipe.layouts.layout import JobShape
from octopipe.layouts.planner import LayoutSearch
from octopipe.layouts.search import LayoutReport, runner_space, written_plan
from octopipe.plan import load_plan

BASE = SHIPPED_BASES["llama3-8b"]  # only the layer names matter to the checks below
# (model, GPUs, GPUs per node, global batch, sequence length)
JOBS = [
    ("tiny-llama", 8, 4, 16, 256),
    ("tiny-llama", 16, 8, 8, 8192),  # long enough for CP
    ("tiny-moe", 8, 8, 16, 512),  # EP
]
_REPORTS: dict[tuple, LayoutReport] = {}


def report(runner: str, model: str, gpus: int, per_node: int, batch: int, seq: int):
    key = (runner, model, gpus, per_node, batch, seq)
    if key not in _REPORTS:  # shared by the tests of one job
        job = Job(model, Cluster(parse_gpus(str(gpus)), per_node), batch, seq)
        _REPORTS[key] = plan_cluster(job, runner=runner, tune_evaluations=200)
    return _REPORTS[key]


def answers(rep: LayoutReport):
    """The rows `plan --gpus` prints as its answers: the chosen, the next best, best_standard."""
    rows = [*rep.rows[:3], rep.best_standard]
    return [r for r in rows if r is not None and r.sim.fits]


@pytest.mark.parametrize("job", JOBS, ids=lambda j: f"{j[0]}-{j[1]}gpus-{j[4]}")
def test_torchtitans_answers_export_as_priced(job, tmp_path):
    rep = report("torchtitan", *job)
    assert rep.runner == "torchtitan" and answers(rep)
    for row in answers(rep):
        lay, plan = row.layout, written_plan(row)
        titan = titan_layout(plan, row.profile)  # no refusal
        assert (titan.tp, titan.cp, titan.pp, titan.ep) == (lay.tp, lay.cp, lay.pp, lay.ep)
        assert titan.dp == lay.dp and titan.world == lay.world_size
        assert lay.zero in (0, 3)
        if lay.zero == 3:  # FSDP over the shard group, replicated across the groups
            assert titan.dp_shard * lay.cp == lay.shards
        else:  # DDP: nothing sharded
            assert titan.dp_shard == 1 and lay.cp == 1
        assert titan.activation_checkpoint == lay.recompute
        assert lay.pp > 1 or lay.num_microbatches == 1  # one pass without PP, as priced
        # No note that the memory technique or recomputation is not the plan's.
        assert [n for n in titan.notes if "not the plan's" in n or "differ" in n] == []
        settings = torchtitan_config_settings(plan, row.profile, BASE, tmp_path / "s.csv", "t")
        assert settings["PARALLELISM"]["pipeline_parallel_degree"] == lay.pp


@pytest.mark.parametrize("job", JOBS, ids=lambda j: f"{j[0]}-{j[1]}gpus-{j[4]}")
def test_megatrons_answers_export_as_priced(job):
    rep = report("megatron", *job)
    assert rep.runner == "megatron" and answers(rep)
    for row in answers(rep):
        lay, plan = row.layout, written_plan(row)
        args = megatron_arguments(plan, row.profile)  # no refusal
        value = {a: b for a, b in zip(args, [*args[1:], ""]) if a.startswith("--")}
        assert int(value["--tensor-model-parallel-size"]) == lay.tp
        assert int(value["--pipeline-model-parallel-size"]) == lay.pp
        assert int(value["--context-parallel-size"]) == lay.cp
        assert int(value.get("--expert-model-parallel-size", 1)) == lay.ep
        batch = lay.dp * lay.num_microbatches * lay.microbatch_size
        assert int(value["--global-batch-size"]) == batch
        assert megatron_world(plan, row.profile) == lay.world_size
        assert ("--use-distributed-optimizer" in args) == (lay.zero == 1)
        assert lay.zero in (0, 1)
        assert value.get("--recompute-granularity", "none") == lay.recompute
        assert megatron_notes(plan) == []  # its own order: what Megatron-LM runs
        assert plan.num_stages == lay.pp * int(
            value.get("--num-virtual-stages-per-pipeline-rank", plan.num_stages // lay.pp)
        )


@pytest.mark.parametrize("job", JOBS, ids=lambda j: f"{j[0]}-{j[1]}gpus-{j[4]}")
def test_octopipes_answers_pass_the_executors_checks(job):
    rep = report("octopipe", *job)
    model = job[0]
    for row in answers(rep):
        lay, plan = row.layout, written_plan(row)
        assert lay.zero in (0, 1, 3) and not lay.shard_group
        config = runtime_config_of(JobConfig(), plan, model)  # the plan's degrees and ZeRO
        ran = config.shape
        assert (ran.tp, ran.cp, ran.dp, ran.ep, ran.zero) == (
            lay.tp,
            lay.cp,
            lay.dp,
            lay.ep,
            lay.zero,
        )
        if lay.zero:  # --zero given overrides the plan's
            zero0 = from_keywords(JobConfig(), zero=0)
            assert runtime_config_of(zero0, plan, model).shape.zero == 0


def runtime_config_of(settings, plan, model):
    from octopipe.training import runtime_config

    return runtime_config(settings, plan, model)


@pytest.mark.parametrize("runner", ["torchtitan", "megatron"])
def test_every_layout_a_runner_keeps_exports_as_priced(runner):
    """Not only the answers: every layout of the search space the runner keeps (CP, EP, FSDP,
    HSDP and recomputation among them), screened as the search screens it, exports."""
    job = Job("tiny-moe", Cluster(parse_gpus("16"), 8), 16, 8192)
    engine = get_engine(runner)
    search = LayoutSearch(job, runner=engine)
    kept = runner_space(search)
    kinds = {
        (lay.cp > 1, lay.ep > 1, lay.zero, bool(lay.shard_group), lay.recompute) for lay in kept
    }
    assert len(kinds) >= 6  # a varied sample, not one kind of layout
    seen = set()
    for lay in kept:
        kind = (lay.cp > 1, lay.ep > 1, lay.zero, bool(lay.shard_group), lay.recompute, lay.pp)
        if kind in seen:
            continue
        seen.add(kind)
        for row in [search.screen(lay), *search.standard(lay)]:
            if row is None:
                continue
            plan = written_plan(row)
            if runner == "torchtitan":
                titan = titan_layout(plan, row.profile)
                assert (titan.cp, titan.ep, titan.dp, titan.pp) == (lay.cp, lay.ep, lay.dp, lay.pp)
                assert [n for n in titan.notes if "not the plan's" in n or "differ" in n] == []
            else:
                megatron_arguments(plan, row.profile)
                assert megatron_notes(plan) == []
    assert any(k[1] for k in seen) and any(k[0] for k in seen)  # EP and CP among them


def test_octopipes_zero3_is_priced_as_its_zero1_and_refused_where_the_executor_does():
    """`octopipe run`'s FSDP2 holds a stage's weights across the step: the same step and peak
    as ZeRO-1 on every layout, so the search offers ZeRO-1 in its place."""
    from dataclasses import replace

    job = Job("tiny-llama", Cluster(parse_gpus("8"), 4), 16, 256)
    search = LayoutSearch(job, runner=get_engine("octopipe"))
    for base in (JobShape(1, 1, 8, 1, 2), JobShape(1, 2, 4, 1, 4), JobShape(2, 2, 2, 2, 4)):
        one, three = (search.screen(replace(base, zero=z)) for z in (1, 3))
        assert three.step_time == pytest.approx(one.step_time, rel=1e-12)
        assert three.peak_memory_bytes == pytest.approx(one.peak_memory_bytes, rel=1e-12)
    runner = get_engine("octopipe")
    arch = load_architecture("tiny-moe")
    assert "expert parallelism" in runner.refuse(JobShape(1, 1, 4, 1, 1, zero=3, ep=2), arch)
    assert "--tp 1" in runner.refuse(JobShape(2, 1, 2, 1, 1, zero=3, cp=2), arch)
    assert "--overlap-steps" in runner.refuse(JobShape(1, 1, 4, 1, 1, zero=1), arch, True)
    assert runner.refuse(JobShape(1, 1, 4, 1, 1, zero=3, cp=2), arch) is None


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        (JobShape(2, 1, 2, 1, 1, zero=3, cp=2, ep=2), "3 is not built with expert parallelism"),
        (JobShape(2, 1, 2, 1, 1, zero=3, cp=2), "runs with --cp at --tp 1"),
    ],
)
def test_the_zero3_rule_is_the_executors_refusal(layout, message):
    """What `engines.octopipe.shape_refusal` refuses, `octopipe run` refuses too (and not the
    rest)."""
    from octopipe.plan import make_plan

    assert get_engine("octopipe").refuse(layout, load_architecture("tiny-moe"))
    plan = make_plan(1, 2, [(0, 9)], [0], {0: []}).with_shape(
        tp=layout.tp, dp=layout.dp, microbatch_size=1, zero=3, cp=layout.cp, ep=layout.ep
    )
    settings = from_keywords(JobConfig(), zero=3, seq_len=64)
    with pytest.raises(InputError, match=message):
        runtime_config_of(settings, plan, "tiny-moe")


def test_octopipe_run_refuses_an_hsdp_plan_under_zero3():
    from octopipe.plan import make_plan

    plan = make_plan(1, 2, [(0, 9)], [0], {0: []}).with_shape(
        tp=1, dp=4, microbatch_size=1, zero=3, shard_group=2
    )
    with pytest.raises(InputError, match="HSDP shard groups of 2 are not run"):
        runtime_config_of(from_keywords(JobConfig(), zero=3, seq_len=64), plan, "tiny-llama")


def test_torchtitan_offers_hsdp_within_a_node_only():
    runner = get_engine("torchtitan")
    fsdp = JobShape(1, 1, 16, 1, 1, zero=3)
    assert runner.variants(fsdp, 8) == [fsdp, JobShape(1, 1, 16, 1, 1, zero=3, shard_group=8)]
    assert runner.variants(JobShape(2, 1, 16, 1, 1, zero=3), 8)[1].shard_group == 4
    assert runner.variants(JobShape(1, 1, 8, 1, 1, zero=3), 8) == [JobShape(1, 1, 8, 1, 1, zero=3)]
    for refused in (JobShape(1, 1, 8, 1, 1, zero=1), JobShape(1, 1, 4, 1, 1, cp=2)):
        assert runner.refuse(refused, None) is not None


def test_a_reference_the_runner_cannot_run_is_shown_not_chosen(tmp_path, capsys):
    argv = ["plan", "--model", "tiny-llama", "--gpus", "8", "--gpus-per-node", "4"]
    argv += ["--global-batch", "16", "--seq-len", "256", "--no-png", "--quiet", "--json"]
    argv += ["--runner", "torchtitan", "--tune-evaluations", "50", "-o", str(tmp_path)]
    argv += ["--torchtitan-config", "llama3:llama3_debugmodel"]  # tiny-llama's shape has none
    assert main(argv) == 0
    out = capsys.readouterr().out
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["runner"] == "torchtitan" and summary["chosen"]["zero"] in (0, 3)
    assert summary["reference"]["runnable"] is False  # Megatron-LM's ZeRO-1
    assert "no ZeRO-1" in summary["reference"]["not_runnable"]
    assert "not run by torchtitan" in out and "layouts for torchtitan" in out
    written = load_plan(tmp_path / "plan.json").shape
    assert written.zero == summary["chosen"]["zero"]
    if "shard_group" in summary["chosen"]:
        assert written.shard_group == summary["chosen"]["shard_group"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--runner", "deepspeed"], "argument --runner: invalid choice: 'deepspeed'"),
        (["--runner", "megatron", "--torchtitan"], "--torchtitan: is for torchtitan, but"),
        (
            ["--runner", "torchtitan", "--megatron"],
            "--megatron: is for Megatron-LM, but --runner torchtitan",
        ),
        (
            ["--runner", "torchtitan", "--overlap-steps"]
            + ["--torchtitan-config", "llama3:llama3_debugmodel"],
            "torchtitan runs synchronous steps",
        ),
        (["--runner", "megatron", "--moe-a2a-overlap"], "--moe-a2a-overlap: prices a published"),
    ],
)
def test_bad_runner_input_is_one_line(extra, message, tmp_path, capsys):
    argv = ["plan", "--model", "tiny-llama", "--gpus", "8", "--global-batch", "16"]
    argv += ["--seq-len", "256", "--quiet", "-o", str(tmp_path), *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err


def test_runner_without_gpus_is_refused(tmp_path, capsys):
    argv = ["plan", "--model", "tiny-llama", "--runner", "megatron", "-o", str(tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--runner: chooses the engine of a cluster layout" in err


def test_the_shard_group_is_written_read_back_and_checked(tmp_path):
    import octopipe as op
    from octopipe.plan import save_plan

    plan = op.baseline(op.profile_from_config("tiny-llama", devices=1), "1f1b", "uniform", 2)
    hsdp = plan.with_shape(tp=1, dp=8, microbatch_size=1, zero=3, cp=2, shard_group=4)
    save_plan(hsdp, tmp_path / "plan.json")
    assert load_plan(tmp_path / "plan.json").shape.shard_group == 4
    for zero, group, message in [
        (1, 4, "parallelism.shard_group: shards weights: needs zero 3"),
        (3, 3, "parallelism.shard_group: 3 is not a multiple of CP 2 dividing DP x CP = 16"),
        (3, 0, "parallelism.shard_group: expected a positive integer, got 0"),
    ]:
        data = json.loads((tmp_path / "plan.json").read_text())
        data["parallelism"].update(zero=zero, shard_group=group)
        (tmp_path / "bad.json").write_text(json.dumps(data))
        with pytest.raises(InputError, match=message) as caught:
            load_plan(tmp_path / "bad.json")
        assert "\n" not in str(caught.value)


def test_a_given_layout_is_kept_to_the_runner(tmp_path, capsys):
    argv = ["plan", "--model", "tiny-llama", "--gpus", "8", "--gpus-per-node", "4"]
    argv += ["--global-batch", "16", "--seq-len", "256", "--no-png", "--quiet", "--json"]
    argv += ["--runner", "torchtitan", "--tune-evaluations", "50"]
    argv += ["--torchtitan-config", "llama3:llama3_debugmodel"]  # tiny-llama's shape has none
    assert main([*argv, "--from-layout", "tp1,pp2,z3", "-o", str(tmp_path / "a")]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["given"]["zero"] == 3 and summary["given"]["pp"] == 2
    assert main([*argv, "--from-layout", "tp1,pp2,z1", "-o", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "--from-layout: torchtitan cannot run it: torchtitan has no ZeRO-1" in err


def test_with_overlapped_steps_octopipes_answer_is_one_its_executor_runs(tmp_path, capsys):
    """`octopipe run` shards no optimizer state with overlapped steps: the answer has none,
    and its printed command overlaps the steps it was ranked by."""
    argv = ["plan", "--model", "tiny-llama", "--gpus", "8", "--gpus-per-node", "4"]
    argv += ["--global-batch", "16", "--seq-len", "256", "--no-png", "--quiet", "--json"]
    argv += ["--overlap-steps", "--tune-evaluations", "50", "-o", str(tmp_path)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    summary = json.loads(printed.strip().splitlines()[-1])
    assert summary["chosen"]["zero"] == 0
    assert summary["reference"]["runnable"] is False  # Megatron-LM's ZeRO-1
    command = next(line for line in printed.splitlines() if "-m octopipe run" in line)
    assert "--overlap-steps" in command and "--zero" not in command


def test_each_runner_prices_the_stack_as_it_runs_it():
    job = Job("tiny-llama", Cluster(parse_gpus("8"), 4), 16, 256)
    stacks = {r: LayoutSearch(job, runner=get_engine(r)).job.stack for r in ENGINES}
    assert stacks["octopipe"].zero3_held and not stacks["torchtitan"].zero3_held
    assert stacks["megatron"].reduce_at_end and not stacks["octopipe"].reduce_at_end
    layout = JobShape(1, 2, 4, 1, 4, zero=1)  # reductions wait for the step's end under Megatron
    octo, mlm = (
        LayoutSearch(job, runner=get_engine(r)).baseline(layout, "1f1b", "uniform", None)
        for r in ("octopipe", "megatron")
    )
    assert mlm.step_time >= octo.step_time
