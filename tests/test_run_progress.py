"""What `octopipe run` shows per step: a JSON line on stdout with --json, and on stderr a plain
line (not a terminal) or a progress bar (a terminal)."""

import json
import sys

from octopipe.commands._run_progress import RunProgress
from octopipe.runtime.progress import StepReport

REPORT = StepReport(step=1, loss=2.5, step_time=0.25, tokens=1000)


def test_each_step_is_a_json_line_and_a_plain_line_off_a_terminal(capsys):
    with RunProgress(total_steps=4, json_lines=True) as show:
        show(REPORT)
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {
        "step": 1,
        "loss": 2.5,
        "step_time": 0.25,
        "tokens_per_second": 4000.0,
    }
    assert captured.err == "step 2/4: loss 2.5, 250.0 ms, 4,000 tokens/s\n"


def test_on_a_terminal_a_bar_follows_the_steps(capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    with RunProgress(total_steps=4, json_lines=False) as show:
        show(REPORT)
        (task,) = show._bar.tasks
        assert (task.completed, task.total, task.fields["loss"]) == (2, 4, "2.5")
    assert capsys.readouterr().out == ""  # no JSON lines without --json
