"""What `octopipe run` shows per step: a JSON line on stdout with --json, and on stderr one line
per step and per note, numbered as the JSON lines are (from 1), with a progress bar below the
lines on a terminal; and the logs of `--log-dir`, which hold each step once when a run
continues a folder."""

import json
import sys

import pytest

from octopipe.commands._run_progress import RunProgress
from octopipe.runtime.checkpoint.folder import keep_newest
from octopipe.runtime.job.logs import LOG, RunLogs
from octopipe.runtime.job.progress import RunNote, StepReport

REPORT = StepReport(step=1, loss=2.5, step_time=0.25, tokens=1000)
FULL = StepReport(
    step=2,
    loss=2.25,
    step_time=0.5,
    tokens=2000,
    lr=3e-4,
    grad_norm=0.8125,
    peak_memory_bytes=3 * 2**20,
    model_flops=4e12,
    ranks=4,
    peak_flops=1e12,
    val_loss=1.5,
)


def test_each_step_is_a_json_line_and_a_plain_line_off_a_terminal(capsys):
    with RunProgress(total_steps=4, json_lines=True) as show:
        show(REPORT)
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {
        "step": 1,
        "loss": 2.5,
        "step_time": 0.25,
        "tokens_per_second": 4000.0,
        "lr": None,
        "grad_norm": None,
        "peak_memory_bytes": None,
        "model_tflops_per_rank": None,
        "mfu": None,
    }
    assert captured.err == "step 1/4: loss 2.5, 250.0 ms, 4,000 tokens/s\n"  # the first of 4


def test_a_step_line_has_every_figure_and_the_evaluation_its_own(capsys):
    with RunProgress(total_steps=10, json_lines=True) as show:
        show(FULL)
    captured = capsys.readouterr()
    line = json.loads(captured.out)
    # 4e12 FLOPs in 0.5 s over 4 ranks: 2 TFLOP/s each, of a 1 TFLOP/s peak... 200%.
    assert line["model_tflops_per_rank"] == pytest.approx(2.0)
    assert line["mfu"] == pytest.approx(2.0)
    assert (line["step"], line["lr"], line["val_loss"]) == (2, 3e-4, 1.5)
    assert line["perplexity"] == pytest.approx(4.4816890703)
    assert captured.err.splitlines() == [
        "step 2/10: loss 2.25, lr 0.0003, grad norm 0.8125, 500.0 ms, 4,000 tokens/s, "
        "2 TFLOP/s per rank, MFU 200.0%, peak 3.0 MiB",
        "step 2: held-out loss 1.5, perplexity 4.482",
    ]


def test_on_a_terminal_the_lines_stay_above_a_bar_that_counts_steps_done(capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    with RunProgress(total_steps=4, json_lines=False) as show:
        show(RunNote("starting 2 processes (gloo on CPU)"))
        show(REPORT)
        (task,) = show._bar.tasks
        assert (task.completed, task.total) == (1, 4)
        assert task.fields["doing"] == "loss 2.5, 4,000 tokens/s"
        show._bar.refresh()
        drawn = capsys.readouterr()
    # Each line is printed once, whole; the bar is drawn again after the last of them.
    err = drawn.err
    note, step = (
        err.index("starting 2 processes (gloo on CPU)\n"),
        err.index("step 1/4: loss 2.5, 250.0 ms, 4,000 tokens/s\n"),
    )
    assert note < step < err.rindex("steps done")
    assert "1/4" in err[step + 5 :]
    assert drawn.out == ""  # no JSON lines without --json


def test_a_passing_note_is_no_line(capsys, monkeypatch):
    with RunProgress(total_steps=2, json_lines=False) as show:
        show(RunNote("checking the plan", passing=True))
    assert capsys.readouterr().err == ""  # off a terminal: nothing
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    with RunProgress(total_steps=2, json_lines=False) as show:
        show(RunNote("checking the plan", passing=True))
        assert show._bar.tasks[0].fields["doing"] == "checking the plan"


def test_notes_say_when_they_happened(capsys):
    with RunProgress(total_steps=2, json_lines=True) as show:
        show(RunNote("saved ckpt/step-2 (2 steps done)"))
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("[0.") and captured.err.endswith(
        " s] saved ckpt/step-2 (2 steps done)\n"
    )


def test_keep_newest_removes_older_checkpoints_only(tmp_path):
    for step in (1, 2, 3, 4, 9):
        (tmp_path / f"step-{step}").mkdir()
        (tmp_path / f"step-{step}" / "x").write_text("x")
    (tmp_path / "notes").mkdir()
    removed = keep_newest(tmp_path, 2, saved=4)
    assert [p.name for p in removed] == ["step-1", "step-2"]
    # step-9 is newer than the save (a damaged leftover): not this save's to remove.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes", "step-3", "step-4", "step-9"]


def _log(folder, steps, loss: float, torn: bool = False) -> None:
    with RunLogs(folder) as logs:
        for step in steps:
            logs(StepReport(step=step, loss=loss + step, step_time=0.1, tokens=10))
            logs(RunNote("not logged"))
    if torn:  # a killed run's last line, cut short
        with (folder / LOG).open("a") as log:
            log.write('{"step": 8, "lo')


def _tensorboard_losses(folder) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars("train/loss")]


def test_a_run_that_continues_a_log_folder_replaces_what_followed_its_checkpoint(tmp_path):
    """Stopped after step 7 with its last checkpoint at step-4, a run resumes at step 5: the
    log and TensorBoard hold steps 1-4 of the first run and 5-6 of the second, each once."""
    pytest.importorskip("tensorboard")
    _log(tmp_path, range(1, 8), loss=10.0, torn=True)
    _log(tmp_path, range(5, 7), loss=100.0)
    lines = [json.loads(x) for x in (tmp_path / LOG).read_text().splitlines()]
    want = [(k, 10.0 + k) for k in range(1, 5)] + [(k, 100.0 + k) for k in (5, 6)]
    assert [(x["step"], x["loss"]) for x in lines] == want
    assert _tensorboard_losses(tmp_path) == want
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 2  # TensorBoard purges on read
    _log(tmp_path, range(1, 3), loss=1000.0)  # a new run from step 1 replaces the whole log
    want = [(k, 1000.0 + k) for k in (1, 2)]
    assert [(json.loads(x)["step"], json.loads(x)["loss"]) for x in (tmp_path / LOG).open()] == want
    assert _tensorboard_losses(tmp_path) == want


def test_the_step_line_says_the_time_left_at_the_pace_since_the_first_step(capsys, monkeypatch):
    """No ETA on the first step (its time holds the start-up's warm-up) nor the last; between,
    the steps left at the wall-clock pace of those since the first."""
    from dataclasses import replace

    import octopipe.commands._run_progress as shown

    clock = iter([0.0, 100.0, 110.0, 130.0, 10_000.0])  # start, then steps 1, 2, 4, 10
    monkeypatch.setattr(shown.time, "perf_counter", lambda: next(clock))
    with RunProgress(total_steps=10, json_lines=False) as show:
        for step in (1, 2, 4, 10):
            show(replace(REPORT, step=step))
    lines = capsys.readouterr().err.splitlines()
    assert [line.partition(": ")[0] for line in lines] == [f"step {k}/10" for k in (1, 2, 4, 10)]
    assert "ETA" not in lines[0] and "ETA" not in lines[3]
    assert lines[1].endswith(", ETA 1 min 20 s")  # 10 s a step, 8 steps left
    assert lines[2].endswith(", ETA 1 min 00 s")  # 30 s for 3 steps, 6 left


def test_times_left_read_as_people_say_them():
    from octopipe.units import fmt_eta

    assert [fmt_eta(s) for s in (0.4, 45, 185, 7_800)] == [
        "0 s",
        "45 s",
        "3 min 05 s",
        "2 h 10 min",
    ]
