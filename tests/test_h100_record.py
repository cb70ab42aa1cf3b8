"""The training record (benchmarks/data/h100_record.csv) as the fidelity benchmark reads it:
every expressible row runs as `octopipe estimate`, its settings reach the command line, and
every row the shipped error band holds beyond 10% gives its reason."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from octopipe.cli import main
from octopipe.costmodel.error_band import _rows as band_rows

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
from record import RECORD, estimate_argv, published_tokens, read_record  # noqa: E402

ROWS = read_record()


def test_every_row_cites_its_source_and_has_a_published_figure():
    header = RECORD.read_text().split("\nsource,model,")[0]
    for row in ROWS:
        assert f"# [{row['source']}]" in header, row["source"]
        if estimate_argv(row) is not None:
            assert published_tokens(row) > 0, row["model"]


@pytest.mark.parametrize("hardware", ["h100", "b200", "gb200"])
def test_every_expressed_row_is_predicted(hardware, capsys):
    rows = [r for r in ROWS if r["hardware"] == hardware and estimate_argv(r)]
    assert rows
    for row in rows:
        assert main(estimate_argv(row)) == 0, row["model"]
        summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert summary["step_time"] > 0


def test_recipe_settings_reach_the_command_line():
    overlapped = [r for r in ROWS if r.get("moe_a2a_overlap") == "1"]
    assert overlapped and all("--moe-a2a-overlap" in estimate_argv(r) for r in overlapped)
    plain = [r for r in ROWS if estimate_argv(r) and r.get("moe_a2a_overlap") != "1"]
    assert plain and not any("--moe-a2a-overlap" in estimate_argv(r) for r in plain)


def test_every_row_the_band_holds_beyond_ten_percent_gives_its_reason():
    notes: dict[tuple, list[str]] = {}  # a run's name may recur at other GPU counts
    for r in ROWS:
        notes.setdefault((r["source"], r["model"], r["hardware"]), []).append(r["speed_note"])
    beyond = [b for b in band_rows() if abs(b["ratio"] - 1) > 0.10]
    assert beyond
    for b in beyond:
        assert any(notes[(b["source"], b["run"], b["hardware"])]), (b["run"], b["hardware"])
