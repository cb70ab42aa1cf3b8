"""Which layers each device of a plan holds, in words: what `plan` and `simulate` print after
their tables. Light: nothing here imports torch or a plotting library."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from octopipe.plan import Plan


def print_wide(console: Console, table: Table) -> None:
    """Print `table` whole: in a pipe or a file as wide as it needs (nothing cut), on a
    terminal narrower than that with its columns folded, never with a number or a label cut
    to an ellipsis (every column of the tables here folds)."""
    if not console.is_terminal:
        from rich.measure import Measurement

        unbounded = console.options.update_width(100_000)
        width = Measurement.get(console, unbounded, table).maximum
        console = Console(width=max(width, console.width), file=console.file)
    console.print(table)


def device_layers(plan: Plan, layer_names: tuple[str, ...] | list[str] | None = None) -> list[str]:
    """One line per device: its stages' layers in model order, each as an inclusive range of
    layer indices with the first and last layers' names where the profile has them."""
    held: dict[int, list[str]] = {d: [] for d in range(plan.num_devices)}
    for stage in plan.stages:
        first, last = stage.start, stage.end - 1
        span = f"{first}" if first == last else f"{first}-{last}"
        if layer_names:
            names = (
                layer_names[first]
                if first == last
                else f"{layer_names[first]}..{layer_names[last]}"
            )
            span += f" ({names})"
        held[stage.device].append(span)
    width = len(str(plan.num_devices - 1))
    return [
        f"device {d:>{width}}: layers {', '.join(spans) if spans else 'none'}"
        for d, spans in held.items()
    ]
