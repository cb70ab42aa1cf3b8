"""What `plan --gpus` sets its answer beside (the best standard schedule, the published recipe,
Megatron-LM's rule), its progress line, and its output in a pipe."""

from __future__ import annotations

import json

import pytest

from octopipe.cli import main
from octopipe.commands._plan_progress import progress_line
from octopipe.layouts import Job, LayoutSearch, megatron_layout, plan_cluster
from octopipe.layouts.cluster import Cluster, parse_gpus
from octopipe.layouts.planner import STANDARD_SCHEDULES
from octopipe.layouts.progress import SearchProgress
from octopipe.layouts.recipes import nearest_recipe, recipe_layout
from octopipe.layouts.reference import recipe_row, tp_by_size
from octopipe.layouts.spec import parse_layout
from octopipe.plan import JobShape

TINY = ["plan", "--model", "tiny-llama", "--gpus", "8", "--gpus-per-node", "4"]
TINY += ["--global-batch", "16", "--seq-len", "256", "--no-png"]
STANDARD_LABELS = {f"{s}/{m}" for s, m, _ in STANDARD_SCHEDULES}


def tiny_job() -> Job:
    return Job("tiny-llama", Cluster(parse_gpus("8"), 4), global_batch=16, seq_len=256)


def test_the_answer_is_never_slower_than_the_best_standard_schedule():
    report = plan_cluster(tiny_job())
    std = report.best_standard
    assert std is not None and std.label in STANDARD_LABELS
    assert report.best.score <= std.score
    # Megatron-LM's schedule is a standard one, and its layout is screened first.
    assert report.reference is not None and std.score <= report.reference.score


def test_the_same_job_gives_the_same_references_twice():
    first, second = plan_cluster(tiny_job()), plan_cluster(tiny_job())
    for a, b in [(first.best, second.best), (first.best_standard, second.best_standard)]:
        assert a.summary() == b.summary()
        assert a.plan.to_dict() == b.plan.to_dict()


def test_json_names_best_standard_recipe_reference_and_given(tmp_path, capsys):
    argv = [*TINY, "--quiet", "--json", "--from-layout", "tp2,pp2,b1", "-o", str(tmp_path)]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("chosen", "best_standard", "reference", "given"):
        assert {"tp", "pp", "dp", "step_time", "fits", "plan"} <= set(summary[key]), key
        assert summary["chosen"]["step_time"] <= summary[key]["step_time"]
    assert summary["recipe"] is None  # the tiny model has no published recipe


def test_a_model_with_a_published_recipe_gets_it_scaled_to_the_job():
    job = Job("llama3-70b", Cluster(parse_gpus("64"), 8), global_batch=128, seq_len=8192)
    recipe = nearest_recipe(job)
    assert recipe is not None and recipe.source == "NeMo llama3_70b" and recipe.gpus == 32
    layout = recipe_layout(job, recipe)  # TP 4 x CP 2 x PP 4 kept, DP the GPUs left
    assert (layout.tp, layout.cp, layout.pp, layout.dp) == (4, 2, 4, 2)
    assert layout.num_microbatches == 64 and layout.shards_optimizer
    row = recipe_row(LayoutSearch(job), job)
    assert row is not None and row.label == "recipe: i1f1b5/uniform"
    assert row.plan.num_stages == 4 * 5  # five virtual stages a device, as the recipe runs
    # The nearest GPU count first, then the nearest sequence length.
    long = Job("llama3-405b", Cluster(parse_gpus("16384"), 8), 128, seq_len=131072)
    assert nearest_recipe(long).cp == 16
    assert nearest_recipe(tiny_job()) is None


def test_megatrons_rule_chooses_tp_by_the_models_size():
    # Megatron-LM's scaling table: 1.7B at TP 1, 3.6B at 2, 7.5B at 4, 18B at 8.
    assert [tp_by_size(p) for p in (1.7e9, 3.6e9, 7.5e9, 18e9, 400e9)] == [1, 2, 4, 8, 8]
    cluster = Cluster(parse_gpus("64"), 8)
    first = megatron_layout(cluster, 512, 80, lambda tp: True, dense_params=3.6e9)[0]
    assert first.tp == 2
    # Within the heads: the largest TP that splits them, at most the size's.
    assert megatron_layout(cluster, 512, 80, lambda tp: tp <= 1, dense_params=18e9)[0].tp == 1


def test_progress_reports_the_search_as_it_goes():
    seen: list[SearchProgress] = []
    report = plan_cluster(tiny_job(), progress=seen.append)
    phases = [p.phase for p in seen]
    assert phases[0] == "references" and "screening" in phases and phases[-1] == "tuning"
    screened = [p.screened for p in seen]
    assert screened == sorted(screened) and screened[-1] == report.screened
    assert all(p.tuned <= p.to_tune for p in seen if p.phase == "tuning")
    line = progress_line(seen[-1])
    assert f"screened {report.screened} layouts" in line and "tuning" in line


def test_progress_and_tables_stay_clean_in_a_pipe(tmp_path, capsys):
    # Not a terminal: no progress line on stderr, and the table is printed as wide as it
    # needs (nothing cut to an ellipsis), with each device's layers after it.
    assert main([*TINY, "-o", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert "…" not in captured.out
    assert "best_standard: " in captured.out and "Megatron-LM" in captured.out
    assert "which layers each device holds" in captured.out
    assert "device 0: layers 0-" in captured.out


def test_simulate_prints_which_layers_each_device_holds(tmp_path, capsys):
    assert main([*TINY, "--quiet", "-o", str(tmp_path)]) == 0
    capsys.readouterr()
    argv = ["simulate", "--profile", str(tmp_path / "profile.json")]
    assert main([*argv, "--plan", str(tmp_path / "plan.json")]) == 0
    out = capsys.readouterr().out
    assert "which layers each device holds" in out and "device 0: layers 0-" in out


def test_the_progress_line_leaves_the_search_free_to_fork():
    """On a terminal the line is redrawn at each report, by no thread of its own: the search
    forks its workers only while no other thread runs."""
    import threading

    from octopipe.commands._plan_progress import SearchLine

    threads = threading.active_count()  # other tests may have left some: count, not expect 1
    with SearchLine(True) as report:
        report(SearchProgress("screening", "a layout", 3, 7, 0, 5, 1.5, 2.0, 4.0))
        assert threading.active_count() == threads


def test_workers_change_nothing_of_the_answer(tmp_path, capsys):
    for workers in ("1", "2"):
        assert main([*TINY, "--json", "--workers", workers, "-o", str(tmp_path / workers)]) == 0
        summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert summary["search"]["workers"] == int(workers)  # the flag reached the search
    one, two = ((tmp_path / w / "plan.json").read_bytes() for w in ("1", "2"))
    assert one == two


@pytest.mark.parametrize(
    "argv, message",
    [
        (["plan", "--workers", "2"], "--workers: runs a cluster layout search: give --gpus N too"),
        ([*TINY, "--workers", "0"], "--workers"),
    ],
)
def test_workers_refused_where_they_mean_nothing(argv, message, tmp_path, capsys):
    assert main([*argv, "-o", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("order", ["octopipe", "megatron"])
def test_a_given_layout_is_priced_in_the_rank_order_it_names(order):
    """`--from-layout ...,megatron`: a team's layout numbered as its framework numbers it."""
    spec = parse_layout(f"tp1,pp2,dp4,b1,{order}")
    assert spec.rank_order == order
    given = plan_cluster(tiny_job(), from_layout=spec).given
    assert given is not None and given.layout.rank_order == order
    assert parse_layout("tp1,pp2").rank_order is None  # the job's own order then


def _row(step: float, peak_gib: float, label: str, fits: bool = True):
    from types import SimpleNamespace

    layout = JobShape(1, 2, 4, 1, 4)
    sim = SimpleNamespace(fits=fits)
    return SimpleNamespace(
        step_time=step, peak_memory_bytes=peak_gib * 2**30, label=label, layout=layout, sim=sim
    )


@pytest.mark.parametrize(
    ("standard_step", "standard_peak", "chosen"),
    [
        (1.01, 60.0, "1f1b/uniform"),  # 1% slower, 15 GiB leaner: inside the dense band (3.8%)
        (1.20, 60.0, "tuned"),  # 20% slower: outside it
        (1.01, 76.0, "tuned"),  # no leaner
    ],
)
def test_a_leaner_standard_schedule_within_the_error_is_the_answer(
    standard_step, standard_peak, chosen
):
    from octopipe.layouts.margin import leaner_within_error

    fastest, standard = _row(1.0, 75.0, "tuned"), _row(standard_step, standard_peak, "1f1b/uniform")
    rows, why = leaner_within_error([fastest], standard, tiny_job(), moe=False)
    assert rows[0].label == chosen
    assert (why is not None) == (chosen != "tuned")
    if why:
        assert "1.0% faster, within the model's error" in why and "15.0 GiB more" in why


def test_the_answer_is_never_slower_than_best_standard():
    """Where another layout's best standard schedule is faster than the fastest plan's own and
    as lean, it is the answer: the margin's choice never loses to best_standard."""
    from octopipe.layouts.margin import leaner_within_error

    fastest, own = _row(1.0, 75.0, "tuned"), _row(1.02, 60.0, "zbh1/uniform")
    other = _row(1.01, 70.0, "zbv/uniform")
    rows, _ = leaner_within_error([fastest], own, tiny_job(), False, best_standard=other)
    assert rows[0] is other


def test_another_layout_is_never_chosen_for_memory_alone():
    """Where the fastest plan's own standard schedule is outside the error, a faster standard
    plan of another layout is no reason to leave the fastest, however lean (MoE's 35% band
    would otherwise pick layouts a fifth slower)."""
    from octopipe.layouts.margin import leaner_within_error

    fastest, own = _row(1.0, 75.0, "tuned"), _row(1.20, 60.0, "zbh1/uniform")
    other = _row(1.02, 50.0, "zbv/uniform")
    rows, why = leaner_within_error([fastest], own, tiny_job(), False, best_standard=other)
    assert rows[0] is fastest and why is None
