"""The memory model's measured error (`costmodel/memory_band.py`): read from the high-water
table the benchmark writes, said in one line by `octopipe estimate` and carried by its JSON."""

import json

from octopipe.cli import main
from octopipe.costmodel.memory_band import HIGH_WATER, memory_band


def rows(*errors):
    return {
        "rows": [
            {"run": f"run {i}", "ranks": 2, "measured": 1, "predicted": 1, "worst_rank_error": e}
            for i, e in enumerate(errors)
        ]
    }


def test_the_band_is_the_mean_and_the_worst_of_the_runs_and_names_those_beyond(tmp_path):
    path = tmp_path / "high_water.json"
    path.write_text(json.dumps(rows(0.01, -0.03, 0.09)))
    band = memory_band(path)
    assert (band.rows, band.worst, band.worst_run) == (3, 0.09, "run 2")
    assert abs(band.mean - 0.13 / 3) < 1e-12
    assert band.beyond == ("run 2",)
    assert "within 4.3% of the plan's peak on average (worst 9.0%: run 2) over 3 runs" in (
        band.describe()
    )
    assert "beyond 5%: run 2" in band.describe()


def test_without_a_table_the_band_says_how_to_measure(tmp_path):
    band = memory_band(tmp_path / "none.json")
    assert band.rows == 0 and "bench_high_water.py --write" in band.describe()


def test_the_shipped_table_covers_every_schedule_and_estimate_prints_it(capsys):
    shipped = json.loads(HIGH_WATER.read_text())["rows"]
    runs = " ".join(r["run"] for r in shipped)
    for schedule in ("gpipe", "1f1b", "i1f1b", "zbh1", "zbh2", "zbv", "dualpipev"):
        assert schedule in runs
    code = main(["estimate", "--model", "llama3-8b", "--gpus", "8", "--tp", "2", "--json"])
    assert code == 0
    out = capsys.readouterr().out
    assert "the memory model's error: each rank's measured high-water mark" in out
    assert "activations held at the peak" in out
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["memory_error"]["runs"] == len(shipped)
