"""The error band `octopipe estimate` prints: the held-out error of published runs like the
prediction (costmodel/measurements/fidelity.json, written by bench_fidelity.py --record)."""

from __future__ import annotations

import json

from octopipe.cli import main
from octopipe.costmodel.error_band import MIN_ROWS, _rows, error_band, layout_kinds


def test_the_band_takes_rows_of_the_same_gpu_precision_and_kind():
    rows = _rows()
    assert rows and all(not r["variant"] or r["hardware"] == "h100" for r in rows)
    band = error_band("h100", "fp8", layout_kinds(4, 1, 4, 1, 1), moe=False)
    assert band.rows >= MIN_ROWS and 0 < band.mean <= band.worst
    assert "fp8" in band.like and "dense" in band.like
    like = [r for r in rows if r["hardware"] == "h100" and not r["variant"]]
    like = [r for r in like if r["precision"] == "fp8" and not r["moe"]]
    assert band.worst <= max(abs(r["ratio"] - 1) for r in like)


def test_a_gpu_without_held_out_rows_says_so():
    band = error_band("h800", "fp8", frozenset(), moe=False)
    assert band.rows == 0 and band.describe() == "no held-out published runs on h800"


def test_estimate_prints_the_band_and_puts_it_in_the_json(capsys):
    argv = ["estimate", "--model", "llama3-8b", "--hardware", "h100", "--gpus", "8"]
    argv += ["--global-batch", "8", "--seq-len", "2048", "--precision", "fp8", "--json"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "the model's error: within" in out
    band = json.loads(out.strip().splitlines()[-1])["error_band"]
    assert band["rows"] >= MIN_ROWS and band["like"].startswith("within")
