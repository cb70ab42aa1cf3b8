"""Print how the analytic cost model compares with measurements from `calibrate_gpu.py`.

    PYTHONPATH=src python benchmarks/calibration_report.py measured.json --hardware h200
    PYTHONPATH=src python benchmarks/calibration_report.py \\
        src/octopipe/costmodel/measurements/h200.json

Prints the achieved efficiencies of the measured kernels (what the hardware preset's factors
should be) and, per measured layer, predicted / measured ratios of f, b, w and saved bytes
(`octopipe.costmodel.accuracy` computes them).
"""

from __future__ import annotations

import argparse
import sys

from rich.console import Console
from rich.table import Table

from octopipe.costmodel.accuracy import kernel_efficiencies, layer_ratios, load_measurements
from octopipe.costmodel.hardware import hardware_preset
from octopipe.errors import OctoPipeError

COLUMNS = ("f", "b", "w", "b+w", "act")


def kernel_rows(kernels: dict, hardware_name: str) -> list[tuple[str, str]]:
    fractions = kernel_efficiencies(kernels, hardware_preset(hardware_name))
    rows = [
        ("matmul efficiency (GEMM)", f"{fractions['matmul']:.3f}"),
        ("memory efficiency (device copy)", f"{fractions['memory']:.3f}"),
    ]
    for key in kernels:
        if key.startswith("attention_"):
            pair = f"{fractions[key + '_f']:.3f} / {fractions[key + '_b']:.3f}"
            rows.append((f"attention efficiency, seq {key[10:]}: forward / backward", pair))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("measured")
    parser.add_argument("--hardware", default="h200")
    args = parser.parse_args(argv)
    try:
        data = load_measurements(args.measured)
        hw = hardware_preset(args.hardware)
    except OctoPipeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    console = Console()
    if "kernels" in data:
        title = f"{data['device']}: achieved fractions of the {hw.name} preset's peaks"
        kernels = Table(title=title)
        kernels.add_column("kernel")
        kernels.add_column("fraction", justify="right")
        for row in kernel_rows(data["kernels"], args.hardware):
            kernels.add_row(*row)
        console.print(kernels)
    layers = Table(title="predicted / measured")
    layers.add_column("layer")
    for column in COLUMNS:
        layers.add_column(column, justify="right")
    layers.add_column("measured f, b+w ms", justify="right")
    for name, measured in data["layers"].items():
        ratios = layer_ratios(name, measured, args.hardware)
        cells = [f"{ratios[c]:.2f}" if c in ratios else "-" for c in COLUMNS]
        layers.add_row(name, *cells, f"{measured['f'] * 1e3:.2f}, {measured['b'] * 1e3:.2f}")
    console.print(layers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
