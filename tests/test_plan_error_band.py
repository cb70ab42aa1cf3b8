"""`plan --gpus` carries the held-out error band of published runs like each row, and says in
one line when the answer's gain over best_standard or the recipe is within it."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from octopipe import api
from octopipe.cli import main
from octopipe.commands._plan_band import row_band, within_error_line
from octopipe.costmodel.error_band import error_band, layout_kinds

ARGV = ["plan", "--model", "tiny-llama", "--gpus", "8", "--gpus-per-node", "4"]
ARGV += ["--global-batch", "16", "--seq-len", "256", "--no-png", "--quiet"]


@pytest.fixture(scope="module")
def report():
    return api.plan_layout("tiny-llama", 8, global_batch=16, gpus_per_node=4, seq_len=256)


def test_every_json_row_carries_the_band_estimate_uses(tmp_path, capsys):
    assert main([*ARGV, "--json", "-o", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    summary = json.loads(out.strip().splitlines()[-1])
    rows = [summary[k] for k in ("chosen", "best_standard", "reference") if summary[k]]
    assert len(rows) >= 2
    for row in rows:
        kinds = layout_kinds(row["tp"], row["cp"], row["pp"], row["ep"], row["zero"])
        band = error_band("h100", "bf16", kinds, moe=False)
        assert band.rows >= 3
        assert row["error_band"]["rows"] == band.rows
        assert row["error_band"]["mean_abs_error"] == pytest.approx(band.mean)
        assert row["error_band"]["like"] == band.describe()
    assert "error" in out  # the table's column


def test_a_gain_within_the_band_says_try_both(report):
    best = report.best
    band = row_band(best, report.job)
    assert band.rows and band.mean > 0
    # best_standard predicted slower than the answer by half the band, then by twice it.
    near = replace(best, label="near", tail=best.tail + best.step_time * band.mean / 2)
    far = replace(best, label="far", tail=best.tail + best.step_time * band.mean * 2)
    line = within_error_line(replace(report, best_standard=near, recipe=None))
    assert line is not None and line.startswith("within the model's error: try both")
    assert f"best_standard by {band.mean / 2:.1%}" in line
    assert within_error_line(replace(report, best_standard=far, recipe=None)) is None


def test_the_answer_set_beside_itself_says_nothing(report):
    assert within_error_line(replace(report, best_standard=report.best, recipe=None)) is None
