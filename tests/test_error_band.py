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


def test_a_gpu_without_held_out_rows_takes_its_kinds_rows_on_every_gpu_and_says_so():
    band = error_band("h800", "fp8", frozenset(), moe=False)
    assert band.rows >= MIN_ROWS and "dense on any GPU (0 on h800)" in band.describe()


def test_an_moe_prediction_carries_the_moe_error_and_names_its_worst_run():
    """MoE's held-out errors are several times dense's: an MoE band is made of MoE rows only,
    however few share its precision (the H100 record has 2 FP8 MoE rows, 22 dense ones)."""
    rows = [r for r in _rows() if not r["variant"]]
    moe = error_band("h100", "fp8", layout_kinds(1, 1, 4, 8, 1), moe=True)
    dense = error_band("h100", "fp8", layout_kinds(1, 1, 4, 1, 1), moe=False)
    assert moe.like.startswith("MoE on h100") and dense.like.startswith("dense on h100")
    h100_moe = [abs(r["ratio"] - 1) for r in rows if r["moe"] and r["hardware"] == "h100"]
    assert moe.rows >= MIN_ROWS and moe.worst == max(h100_moe)
    assert moe.mean > 3 * dense.mean  # the dense band would promise a third of the error
    worst = max((r for r in rows if r["moe"] and r["hardware"] == "h100"),
                key=lambda r: abs(r["ratio"] - 1))  # fmt: skip
    assert f"{worst['run']} ({worst['source']}), predicted {worst['ratio']:.2f}x" in moe.describe()
    assert f"on {moe.rows} held-out published runs" in moe.describe()


def test_estimate_prints_the_band_and_puts_it_in_the_json(capsys):
    argv = ["estimate", "--model", "llama3-8b", "--hardware", "h100", "--gpus", "8"]
    argv += ["--global-batch", "8", "--seq-len", "2048", "--precision", "fp8", "--json"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "the model's error: within" in out
    band = json.loads(out.strip().splitlines()[-1])["error_band"]
    assert band["rows"] >= MIN_ROWS and band["like"].startswith("within")
