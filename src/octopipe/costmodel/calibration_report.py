"""Compare the analytic cost model with measurements from `calibrate_gpu` on the same machine.

    python -m octopipe.costmodel.calibration_report measured.json --hardware h200

Prints the achieved efficiencies of the measured kernels (what the hardware preset's factors
should be) and, per measured layer, predicted / measured ratios of f, b, w and saved bytes.
"""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.table import Table

from octopipe.costmodel.arch import load_architecture
from octopipe.costmodel.build import estimate_layers
from octopipe.costmodel.hardware import hardware_preset
from octopipe.costmodel.settings import Settings
from octopipe.costmodel.work import ATTENTION_BACKWARD_FACTOR


def kernel_rows(kernels: dict, peak_flops: float, bandwidth: float) -> list[tuple[str, str]]:
    rows = [
        ("matmul efficiency (8192^3 GEMM)", f"{kernels['gemm_flops'] / peak_flops:.3f}"),
        ("memory efficiency (device copy)", f"{kernels['copy_bytes_per_s'] / bandwidth:.3f}"),
    ]
    for key, value in kernels.items():
        if key.startswith("attention_"):
            fwd = value["f_flops"] / value["f"] / peak_flops
            bwd = ATTENTION_BACKWARD_FACTOR * value["f_flops"] / value["b"] / peak_flops
            rows.append(
                (
                    f"attention efficiency, seq {key[10:]}: forward / backward",
                    f"{fwd:.3f} / {bwd:.3f}",
                )
            )
    return rows


def layer_ratios(name: str, measured: dict, hardware_name: str) -> dict[str, float]:
    """Predicted / measured for one `model/layer@seq` entry."""
    model, rest = name.split("/", 1)
    layer, seq = rest.split("@")
    hw = hardware_preset(hardware_name)
    estimate = next(
        e
        for e in estimate_layers(load_architecture(model), hw, Settings(seq_len=int(seq)))
        if e.spec.name == layer
    )
    ratios = {
        "f": estimate.f / measured["f"],
        "b": estimate.b / measured["i"] if measured.get("i") else float("nan"),
        "w": estimate.w / measured["w"],
        "b+w": (estimate.b + estimate.w) / measured["b"],
    }
    if "act_bytes" in measured:
        ratios["act"] = estimate.act_bytes / measured["act_bytes"]
    return ratios


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("measured")
    parser.add_argument("--hardware", default="h200")
    args = parser.parse_args(argv)
    with open(args.measured) as fh:
        data = json.load(fh)
    hw = hardware_preset(args.hardware)
    console = Console()
    kernels = Table(title=f"{data['device']}: achieved fractions of the {hw.name} preset's peaks")
    kernels.add_column("kernel")
    kernels.add_column("fraction", justify="right")
    for row in kernel_rows(data["kernels"], hw.peak_flops, hw.memory_bandwidth):
        kernels.add_row(*row)
    console.print(kernels)
    layers = Table(title="predicted / measured")
    columns = ("f", "b", "w", "b+w", "act")
    layers.add_column("layer")
    for column in columns:
        layers.add_column(column, justify="right")
    layers.add_column("measured f, b+w ms", justify="right")
    for name, measured in data["layers"].items():
        ratios = layer_ratios(name, measured, args.hardware)
        cells = [f"{ratios[c]:.2f}" if c in ratios else "-" for c in columns]
        layers.add_row(name, *cells, f"{measured['f'] * 1e3:.2f}, {measured['b'] * 1e3:.2f}")
    console.print(layers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
