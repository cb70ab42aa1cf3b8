"""The GPU measuring script on the CPU at tiny sizes: it runs, writes what the cost model's
measurement reader accepts, and its grouped experts compute the models' MoE."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import octopipe
from benchmarks import calibrate_gpu, calibration_report
from octopipe.costmodel.accuracy import layer_ratios, load_measurements, recorded_measurements
from octopipe.errors import InputError
from octopipe.models.feedforward import MoE

ROOT = Path(__file__).parents[1]


def test_the_script_runs_on_cpu_and_writes_what_the_reader_reads(tmp_path):
    out = tmp_path / "measured.json"
    env = {**os.environ, "PYTHONPATH": str(Path(octopipe.__file__).parents[1])}
    cmd = [sys.executable, str(ROOT / "benchmarks" / "calibrate_gpu.py"), "--device", "cpu"]
    cmd += ["--small", "--warmup", "0", "--repeats", "1", "-o", str(out)]
    subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=120)
    data = load_measurements(out)
    assert data["device"] == "cpu"
    assert set(data["kernels"]) == {"gemm_flops", "copy_bytes_per_s", "attention_128"}
    assert list(data["layers"]) == list(calibrate_gpu.SMALL_LAYERS)
    assert data["layers"]["tiny-moe/layers.1@64"]["grouped_gemm"] is False
    for name, values in data["layers"].items():
        ratios = layer_ratios(name, values, "h200")
        if "tok_embeddings" in name:
            assert values["i"] == 0 and "act_bytes" not in values
        else:
            assert values["act_bytes"] > 0 and ratios["act"] > 0
    assert calibration_report.main([str(out)]) == 0


def test_the_breakdown_on_cpu(tmp_path):
    out = tmp_path / "breakdown.json"
    args = ["--device", "cpu", "--small", "--breakdown", "--skip-kernels", "--repeats", "1"]
    assert calibrate_gpu.main([*args, "-o", str(out)]) == 0
    data = load_measurements(out)
    assert data["layers"] == {} and "kernels" not in data
    assert {"mla", "moe", "grouped_gate_up_f", "dense_gate_up_f"} <= set(data["breakdown"])
    assert data["command"].endswith("--breakdown --skip-kernels --repeats 1 -o " + str(out))


@pytest.mark.parametrize("shared, shared_gate", [(0, False), (24, False), (24, True)])
def test_grouped_experts_compute_the_models_moe(shared, shared_gate):
    torch.manual_seed(0)
    moe = MoE(16, 32, 4, 2, shared, shared_gate, "silu")
    grouped = calibrate_gpu.GroupedExperts(moe, grouped=False)
    x = torch.randn(2, 8, 16)
    torch.testing.assert_close(grouped(x), moe(x))


def test_the_reader_names_the_fault(tmp_path):
    good = json.loads(recorded_measurements("h200").read_text())
    assert load_measurements(recorded_measurements("h200-moe-breakdown"))["layers"] == {}
    path = tmp_path / "m.json"
    bad = {**good, "layers": {"llama3-8b/layers.0@4096": {"f": 1.0, "i": 1.0, "b": 1.0}}}
    path.write_text(json.dumps(bad))
    with pytest.raises(InputError, match=r"layers\.llama3-8b/layers\.0@4096\.w: missing"):
        load_measurements(path)
    path.write_text(json.dumps({**good, "layers": {"llama3-8b/layers.0": good["layers"]}}))
    with pytest.raises(InputError, match="named model/layer@seq_len"):
        load_measurements(path)
    path.write_text(json.dumps({"layers": {}}))
    with pytest.raises(InputError, match="device: missing"):
        load_measurements(path)
