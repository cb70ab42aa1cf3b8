"""How well the analytic cost model predicts measured kernels and layers.

Reads the measurement files `benchmarks/calibrate_gpu.py` writes (format in docs/COSTMODEL.md,
"Calibration against a real GPU"; the recorded runs lie in `costmodel/measurements/`) and
gives the achieved fractions of a hardware preset's peaks and, per measured layer, the
model's predicted / measured ratios. `benchmarks/calibration_report.py` prints them as tables.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from octopipe.costmodel.build import estimate_layers
from octopipe.costmodel.hardware import Hardware, hardware_preset
from octopipe.costmodel.hf_config import load_architecture
from octopipe.costmodel.settings import Settings
from octopipe.costmodel.work import FLASH_BACKWARD_FACTOR
from octopipe.errors import InputError

RECORDED = Path(__file__).parent / "measurements"
LAYER_KEYS = ("f", "i", "b", "w")  # seconds; "act_bytes" (saved bytes) where measured


def recorded_measurements(name: str) -> Path:
    """The recorded measurement file `name` (e.g. "h200") shipped with the package."""
    return RECORDED / f"{name}.json"


def load_measurements(path: str | Path) -> dict[str, Any]:
    """A measurement file, checked: `device` and `layers` are required, `kernels` and
    `breakdown` optional; each layer `model/layer@seq` holds the seconds f, i, b, w."""
    where = str(path)
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise InputError(where, f"cannot read: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise InputError(where, f"malformed JSON: {exc.msg}", f"line {exc.lineno}") from None
    if not isinstance(data, dict):
        raise InputError(where, "expected a JSON object")
    for key, kind in (("device", str), ("layers", dict)):
        if not isinstance(data.get(key), kind):
            raise InputError(where, f"missing or not a {kind.__name__}", key)
    for key in ("kernels", "breakdown"):
        if key in data and not isinstance(data[key], dict):
            raise InputError(where, "not an object", key)
    for name, values in data["layers"].items():
        _split_name(where, name)
        if not isinstance(values, dict):
            raise InputError(where, "not an object", f"layers.{name}")
        for key in LAYER_KEYS:
            value = values.get(key)
            if not isinstance(value, int | float) or not math.isfinite(value):
                raise InputError(where, "missing or not a finite number", f"layers.{name}.{key}")
    return data


def _split_name(where: str, name: str) -> tuple[str, str, int]:
    model, _, rest = name.partition("/")
    layer, _, seq = rest.partition("@")
    if not (model and layer and seq.isdigit()):
        raise InputError(where, "a layer entry is named model/layer@seq_len", f"layers.{name}")
    return model, layer, int(seq)


def kernel_efficiencies(kernels: dict[str, Any], hw: Hardware) -> dict[str, float]:
    """Achieved fractions of `hw`'s peaks: `matmul` (the GEMM), `memory` (the device copy) and
    `attention_{seq}_f` / `attention_{seq}_b` (causal SDPA forward and backward)."""
    out = {
        "matmul": kernels["gemm_flops"] / hw.peak_flops,
        "memory": kernels["copy_bytes_per_s"] / hw.memory_bandwidth,
    }
    for key, value in kernels.items():
        if key.startswith("attention_"):
            out[f"{key}_f"] = value["f_flops"] / value["f"] / hw.peak_flops
            backward_flops = FLASH_BACKWARD_FACTOR * value["f_flops"]
            out[f"{key}_b"] = backward_flops / value["b"] / hw.peak_flops
    return out


def layer_ratios(name: str, measured: dict[str, float], hardware_name: str) -> dict[str, float]:
    """Predicted / measured for one `model/layer@seq` entry: f, b (against the measured I),
    w, b+w (against the measured full backward B) and act (saved bytes) where measured."""
    model, layer, seq = _split_name(name, name)
    hw = hardware_preset(hardware_name)
    estimates = estimate_layers(load_architecture(model), hw, Settings(seq_len=seq))
    estimate = next((e for e in estimates if e.spec.name == layer), None)
    if estimate is None:
        raise InputError(name, f"{model} has no layer {layer!r}")
    ratios = {
        "f": estimate.f / measured["f"],
        "b": estimate.b / measured["i"] if measured.get("i") else float("nan"),
        "w": estimate.w / measured["w"],
        "b+w": (estimate.b + estimate.w) / measured["b"],
    }
    if "act_bytes" in measured:
        ratios["act"] = estimate.act_bytes / measured["act_bytes"]
    return ratios
