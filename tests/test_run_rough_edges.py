"""`octopipe run`'s rough edges (issue 43): what the input means is said before the first step
(a step of many accumulated passes, a plan priced for another device), a resume says what it
could not check (a checkpoint without checksums) and what it changes (the learning-rate
schedule), the time left is paced by this process's own steps, and an expert-parallel degree
the model cannot take is refused in one line before any rank starts."""

from __future__ import annotations

import dataclasses
import json
import shutil
import signal
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from executor_helpers import SGD_FLAGS, TOY, layer_count, one_f_one_b

import octopipe as op
from octopipe.cli import main
from octopipe.errors import InputError
from octopipe.plan import save_plan
from octopipe.runtime.checkpoint import store
from octopipe.runtime.checkpoint.folder import CheckpointUnverified, choose, read_marker
from octopipe.runtime.checkpoint.schedule import reshaped, schedule_record
from octopipe.runtime.launch import launcher
from octopipe.runtime.launch.launcher import Stopped
from octopipe.runtime.model.load import load_recipe
from octopipe.runtime.step.optim import OptimizerConfig


def _plan(folder: Path, model: str, name: str = "plan.json", **plan_fields) -> str:
    plan = one_f_one_b(2, 2, num_layers=layer_count(model))
    if plan_fields:
        plan = dataclasses.replace(plan, **plan_fields)
    path = folder / name
    save_plan(plan, path)
    return str(path)


@pytest.fixture
def no_ranks(monkeypatch):
    """A launch that stops where the ranks would begin to run (as Ctrl-C would): what the run
    said before then is all there is. `started` records whether it got that far, past the
    launcher's checks (run by the launcher before it spawns, or handed to the spawner as
    `check` to run while the processes import)."""
    started = []

    def stop(body, args, *_args, check=None, **_kwargs):
        if check is not None:
            check(args)
        started.append(True)
        raise Stopped(signal.SIGINT)

    monkeypatch.setattr(launcher, "spawn_ranks", stop)
    return started


# --- 3. --ep the model cannot take: refused before any rank starts ------------------------------


def _no_moe_layers(folder: Path) -> str:
    """tiny-moe's config (the Qwen-MoE family) with every layer dense."""
    from octopipe.costmodel.hf_config import config_path

    data = json.loads(config_path("tiny-moe").read_text())
    data["mlp_only_layers"] = list(range(data["num_hidden_layers"]))
    path = folder / "dense-qwen-moe.json"
    path.write_text(json.dumps(data))
    return str(path)


EP_REFUSALS = [
    (
        "tiny-llama",
        ["--ep", "2", "--dp", "2"],
        "tiny-llama has no MoE experts to spread over 2 ranks",
    ),
    (
        "no MoE layers",
        ["--ep", "8", "--dp", "8"],
        "dense-qwen-moe has no MoE experts to spread over 8 ranks",
    ),
    ("tiny-moe", ["--ep", "3", "--dp", "3"], "layers.1.ffn has 8 experts; 3 must divide them"),
]


@pytest.mark.parametrize("model, flags, why", EP_REFUSALS, ids=[m for m, _, _ in EP_REFUSALS])
def test_an_ep_the_model_cannot_take_is_one_line_before_any_rank(
    tmp_path, capsys, no_ranks, model, flags, why
):
    spec = _no_moe_layers(tmp_path) if model == "no MoE layers" else model
    argv = ["run", "--plan", _plan(tmp_path, "tiny-moe" if model != "tiny-llama" else model)]
    assert main([*argv, "--model", spec, *flags]) == 2
    assert capsys.readouterr().err.strip() == f"octopipe run: error: --ep: {why}"
    assert not no_ranks


def test_the_python_api_refuses_it_too(tmp_path, no_ranks):
    with pytest.raises(InputError, match="tiny-llama has no MoE experts to spread over 2 ranks"):
        op.run(_plan(tmp_path, "tiny-llama"), "tiny-llama", ep=2, dp=2, steps=1)
    assert not no_ranks


def test_an_ep_the_experts_take_gets_as_far_as_the_ranks(tmp_path, capsys, no_ranks):
    argv = ["run", "--plan", _plan(tmp_path, "tiny-moe"), "--model", "tiny-moe"]
    assert main([*argv, "--ep", "2", "--dp", "2"]) == 128 + signal.SIGINT
    assert no_ranks


# --- 1. and 5. what the run means, said before its first step ----------------------------------


def test_a_step_of_many_passes_and_another_device_are_said_before_the_ranks_start(
    tmp_path, capsys, no_ranks
):
    profile = {"name": "tiny-h100", "device": "h100"}
    plan = _plan(tmp_path, "tiny-llama", profile=profile)
    argv = ["run", "--plan", plan, "--model", "tiny-llama", "--global-batch", "1048576"]
    assert main(argv) == 128 + signal.SIGINT  # stopped where the ranks would start
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith(
        f"octopipe run: note: {plan} was priced for h100 (profile tiny-h100); this ran on cpu"
    )
    assert lines[1] == (
        "octopipe run: note: a step is 262,144 passes of the plan (--global-batch 1,048,576 "
        "sequences, 4 a pass: 1 replica x 2 microbatches x 2); each step's line comes once its "
        "passes are done"
    )
    assert lines[2].endswith("starting 2 processes (gloo on CPU)")


def test_the_first_step_of_many_passes_is_expected_from_the_plans_prediction(
    tmp_path, capsys, no_ranks
):
    plan = dataclasses.replace(
        one_f_one_b(2, 2, num_layers=layer_count("tiny-llama")),
        profile={"name": "tiny-cpu", "device": "cpu"},
    ).with_predicted({"iteration_time": 1e-3})
    save_plan(plan, tmp_path / "plan.json")
    argv = ["run", "--plan", str(tmp_path / "plan.json"), "--model", "tiny-llama", "--dp", "2"]
    main([*argv, "--global-batch", "480000"])
    (note,) = [x for x in capsys.readouterr().err.splitlines() if "passes" in x]
    assert note == (
        "octopipe run: note: a step is 60,000 passes of the plan (--global-batch 480,000 "
        "sequences, 8 a pass: 2 replicas x 2 microbatches x 2); each step's line comes once its "
        "passes are done; the first expected about 1 min 00 s after the start-up (the plan's "
        "predicted 1.00 ms a pass on cpu)"
    )


def test_a_run_refused_after_the_notes_were_made_prints_its_one_line(tmp_path, capsys, no_ranks):
    plan = _plan(tmp_path, "tiny-llama", profile={"name": "tiny-h100", "device": "h100"})
    argv = ["run", "--plan", plan, "--model", "tiny-llama", "--global-batch", "64"]
    argv += ["--checkpoint-dir", str(tmp_path / "none"), "--resume=require"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("octopipe run: error: --resume: require: no checkpoint in")
    assert "\n" not in err
    assert not no_ranks


# --- 2. a checkpoint without checksums ----------------------------------------------------------


@contextmanager
def _one_rank(folder: Path):
    dist.init_process_group(
        "gloo", init_method=f"file://{folder}/store-{uuid.uuid4().hex}", rank=0, world_size=1
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


def _toy_checkpoint(root: Path, step: int = 2, schedule: OptimizerConfig | None = None) -> Path:
    """A checkpoint of the toy model as a run writes it (checksums, and `schedule` if given)."""
    recipe = load_recipe(TOY)
    modules = {0: recipe.whole(torch.device("cpu"), seed=0)}
    about = {"model": TOY, "model_id": TOY, "layers": list(recipe.layers), "seed": 0}
    about["optimizer"] = "sgd"
    if schedule is not None:
        about["schedule"] = schedule_record(schedule)
    with _one_rank(root.parent):
        return store.save(root, step, modules, None, about, nbytes=1)


def _without_checksums_and_a_byte_flipped(folder: Path) -> None:
    marker = json.loads((folder / "octopipe.json").read_text())
    del marker["checksums"]
    (folder / "octopipe.json").write_text(json.dumps(marker))
    shard = next(folder.glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))


def test_a_checkpoint_without_checksums_is_chosen_with_a_warning_naming_it(tmp_path):
    folder = _toy_checkpoint(tmp_path / "ckpt")
    _without_checksums_and_a_byte_flipped(folder)
    with pytest.warns(CheckpointUnverified) as caught:
        found = choose(tmp_path / "ckpt")
    assert found.path == folder
    (warning,) = caught
    assert str(warning.message).startswith(
        f"{folder}: its octopipe.json carries no checksums, so its bytes were not verified"
    )


def test_a_checkpoint_with_checksums_is_chosen_without_a_word(tmp_path, recwarn):
    _toy_checkpoint(tmp_path / "ckpt")
    assert choose(tmp_path / "ckpt").step == 2
    assert not [w for w in recwarn if issubclass(w.category, CheckpointUnverified)]


def _resume_unverified(tmp_path, steps: int) -> tuple:
    """A toy checkpoint without checksums and with a byte flipped, and the `run` resuming it."""
    folder = _toy_checkpoint(tmp_path / "ckpt")
    _without_checksums_and_a_byte_flipped(folder)
    save_plan(one_f_one_b(2, 2, num_layers=layer_count(TOY)), tmp_path / "plan.json")
    argv = ["run", "--plan", str(tmp_path / "plan.json"), "--model", TOY, "--steps", str(steps)]
    return folder, [*argv, *SGD_FLAGS, "--checkpoint-dir", str(tmp_path / "ckpt"), "--resume"]


def test_a_run_refused_after_choosing_it_keeps_its_one_error_line(tmp_path, capsys, no_ranks):
    folder, argv = _resume_unverified(tmp_path, steps=2)
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == (
        f"octopipe run: error: --steps: {folder} is at step 2; --steps 2 is done"
    )
    assert not no_ranks


@pytest.mark.slow  # two real processes
@pytest.mark.timeout(180)
def test_run_resume_says_the_checkpoint_was_not_verified_before_the_ranks_start(tmp_path, capsys):
    folder, argv = _resume_unverified(tmp_path, steps=3)
    assert main(argv) == 0
    lines = capsys.readouterr().err.splitlines()
    warned = [i for i, x in enumerate(lines) if x.startswith("octopipe run: warning: ")]
    assert len(warned) == 1
    assert lines[warned[0]].startswith(
        f"octopipe run: warning: {folder}: its octopipe.json carries no checksums"
    )
    started = next(i for i, x in enumerate(lines) if "starting 2 processes" in x)
    assert warned[0] < started


# --- 4. a resume that reshapes the learning-rate schedule; the time left -----------------------


def test_a_save_records_the_schedule_and_a_marker_reads_it_back(tmp_path):
    schedule = OptimizerConfig("adamw", 3e-4, 0.0, 0.0, 5, "cosine", 3e-5, 50)
    folder = _toy_checkpoint(tmp_path / "ckpt", schedule=schedule)
    recorded = read_marker(folder).schedule
    assert recorded.model_dump() == {
        "lr": 3e-4,
        "warmup_steps": 5,
        "decay": "cosine",
        "min_lr": 3e-5,
        "total_steps": 50,
    }


COSINE_50 = OptimizerConfig("adamw", 3e-4, 0.0, 0.0, 5, "cosine", 3e-5, 50)


def test_another_steps_on_resume_is_one_line_saying_how_the_schedule_changes():
    run = dataclasses.replace(COSINE_50, warmup_steps=20, total_steps=200)  # --steps 200
    line = reshaped(schedule_record(COSINE_50), run, 40, "ckpt/step-40")
    assert line == (
        "ckpt/step-40 was trained on another learning-rate schedule (warm-up steps 5 -> 20, "
        "--steps 50 -> 200); resumed, the run follows its own: step 41 at lr 0.000292 (the "
        "checkpoint's schedule: 6.16e-05); the widest gap: step 51 at lr 0.000282 (the "
        "checkpoint's schedule: 3e-05)"
    )


UNCHANGED = {
    "the same schedule": (COSINE_50, COSINE_50),
    "constant, longer, the same warm-up": (
        dataclasses.replace(COSINE_50, decay="constant"),
        dataclasses.replace(COSINE_50, decay="constant", total_steps=10**9),
    ),
}


@pytest.mark.parametrize("saved, run", UNCHANGED.values(), ids=UNCHANGED)
def test_a_resume_whose_learning_rates_to_come_are_unchanged_says_nothing(saved, run):
    assert reshaped(schedule_record(saved), run, 40, "c") is None


def test_a_shorter_cosine_is_a_reshaped_one_too():
    run = dataclasses.replace(COSINE_50, total_steps=45)  # --steps 45, the warm-up given
    line = reshaped(schedule_record(COSINE_50), run, 40, "c")
    assert line is not None and "(--steps 50 -> 45)" in line


def test_a_checkpoint_that_records_no_schedule_is_not_compared():
    assert reshaped(None, COSINE_50, 40, "c") is None


@pytest.mark.slow  # real processes, three runs
@pytest.mark.timeout(300)
def test_resuming_with_another_steps_warns_once_and_with_the_same_says_nothing(tmp_path, capsys):
    save_plan(one_f_one_b(2, 2, num_layers=layer_count(TOY)), tmp_path / "plan.json")
    ckpt = tmp_path / "ckpt"
    argv = ["run", "--plan", str(tmp_path / "plan.json"), "--model", TOY, "--lr", "0.003"]
    argv += ["--checkpoint-dir", str(ckpt)]
    assert main([*argv, "--steps", "4", "--checkpoint-every", "2"]) == 0
    assert read_marker(ckpt / "step-2").schedule.total_steps == 4
    shutil.rmtree(ckpt / "step-4")  # resume from step 2
    capsys.readouterr()
    assert main([*argv, "--steps", "4", "--resume"]) == 0
    assert "warning" not in capsys.readouterr().err
    assert main([*argv, "--steps", "40", "--resume"]) == 0
    lines = capsys.readouterr().err.splitlines()
    (warning,) = [x for x in lines if "warning" in x]
    assert warning.startswith(
        f"octopipe run: warning: {ckpt / 'step-2'} was trained on another learning-rate "
        "schedule (warm-up steps 0 -> 4, --steps 4 -> 40); resumed, the run follows its own: "
        "step 3 at lr 0.0018 (the checkpoint's schedule: 0.00165)"
    )
    resumed = next(i for i, x in enumerate(lines) if "resumed from" in x)
    first_step = next(i for i, x in enumerate(lines) if x.startswith("step 3/40"))
    assert resumed < lines.index(warning) < first_step


def _reports(steps, step_time=0.5):
    from octopipe.runtime.job.progress import StepReport

    return [StepReport(step=k, loss=2.0, step_time=step_time, tokens=100) for k in steps]


def test_the_time_left_after_a_resume_is_paced_by_this_processes_steps(capsys, monkeypatch):
    import octopipe.commands._run_progress as shown
    from octopipe.commands._run_progress import RunProgress

    # Steps 53 and 54 of 200 (52 were the checkpoint's), reported at the same instant (as a
    # burst of reports arrives): their measured 0.5 s a step paces the rest, not "0 s".
    clock = iter([0.0, 100.0, 100.0])
    monkeypatch.setattr(shown.time, "perf_counter", lambda: next(clock))
    with RunProgress(total_steps=200, json_lines=False) as show:
        for report in _reports((53, 54)):
            show(report)
    lines = capsys.readouterr().err.splitlines()
    assert "ETA" not in lines[0]
    assert lines[1].endswith(", ETA 1 min 13 s")  # 146 steps left at 0.5 s


def test_steps_queued_behind_the_logs_opening_do_not_read_as_instant_ones(capsys, monkeypatch):
    """What gave "ETA 0 s" with 145 steps to go after a resume with --log-dir: the logs open
    at the first step reported (rewriting log.jsonl, starting TensorBoard: seconds), the next
    reports queue meanwhile and arrive together, and a pace measured from after the opening
    read them as instant steps."""
    import octopipe.commands._run_progress as shown
    from octopipe.commands._run_progress import RunProgress

    clock = [0.0]
    monkeypatch.setattr(shown.time, "perf_counter", lambda: clock[0])

    def slow_logs(report):
        if report.step == 3:
            clock[0] += 5.0  # opening the logs

    with RunProgress(total_steps=150, json_lines=False, also=slow_logs) as show:
        for report in _reports((3, 4, 5), step_time=0.05):
            show(report)  # 4 and 5 arrive at once, as they had queued
    lines = capsys.readouterr().err.splitlines()
    assert lines[1].endswith(", ETA 12 min 10 s")  # 5 s since step 3 arrived, 146 to go
    assert lines[2].endswith(", ETA 6 min 02 s")  # 2.5 s a step, 145 to go; never "0 s"


def test_the_bar_says_estimating_until_this_process_has_a_pace(monkeypatch):
    import octopipe.commands._run_progress as shown
    from octopipe.commands._run_progress import RunProgress

    monkeypatch.setattr(shown.sys.stderr, "isatty", lambda: True, raising=False)
    clock = iter([0.0, 100.0, 110.0])
    monkeypatch.setattr(shown.time, "perf_counter", lambda: next(clock))
    seen = []
    with RunProgress(total_steps=200, json_lines=False) as show:
        for report in _reports((53, 54)):
            show(report)
            seen.append(show._bar.tasks[0].fields["left"])
    assert seen == ["ETA estimating", "ETA 24 min 20 s"]  # 10 s a step, 146 left


def test_a_warning_from_the_ranks_is_a_line_of_its_own(capsys):
    from octopipe.commands._run_progress import RunProgress
    from octopipe.runtime.job.progress import warn

    with RunProgress(total_steps=4, json_lines=False, notes=("what a step is",)) as show:
        warn(show, "the schedule changed")
        warn(show, None)  # nothing to say
    assert capsys.readouterr().err.splitlines() == [
        "octopipe run: note: what a step is",
        "octopipe run: warning: the schedule changed",
    ]
