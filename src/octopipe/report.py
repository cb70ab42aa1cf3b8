"""Human-readable reports shared by commands: simulation summaries (units: `octopipe.units`)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from octopipe.sim import SimResult
from octopipe.units import fmt_bytes, fmt_time


def compress_path(actions, limit: int = 14) -> str:
    text = [str(a) for a in actions]
    if len(text) > limit:
        text = text[: limit // 2] + [f"... ({len(text) - limit} more) ..."] + text[-limit // 2 :]
    return " -> ".join(text)


def _time_line(r: SimResult) -> str:
    """ "iteration 3.2 s", or for overlapped steps the step time and how it settled."""
    st = r.steady
    if st is None:
        return f"iteration {fmt_time(r.iteration_time)}"
    settled = (
        f"settled after {st.steps_simulated} steps"
        if st.converged
        else f"[red]not settled in {st.steps_simulated} steps[/red]"
    )
    return (
        f"step {fmt_time(r.iteration_time)} with steps overlapped ({settled}; one step alone "
        f"{fmt_time(st.first_step_time)})"
    )


def print_simulation(result: SimResult, console: Console | None = None, title: str = "") -> None:
    console = console or Console()
    r = result
    console.print(
        f"[bold]{title or 'simulated plan'}[/bold]: {_time_line(r)}, "
        f"bubble {r.bubble_ratio:.1%}, efficiency {r.efficiency:.1%} "
        f"(physical limit {fmt_time(r.lower_bound)}), "
        + ("[green]fits memory[/green]" if r.fits else "[red]exceeds memory[/red]")
    )
    table = Table("device", "busy", "idle", "static mem", "peak mem", "capacity", "fits")
    for d in range(r.num_devices):
        table.add_row(
            str(d),
            fmt_time(r.busy[d]),
            fmt_time(r.idle[d]),
            fmt_bytes(r.static_memory_bytes[d]),
            fmt_bytes(r.peak_memory_bytes[d]),
            fmt_bytes(r.capacity_bytes[d]),
            "yes"
            if r.fits_per_device[d]
            else f"[red]no (+{fmt_bytes(r.memory_excess_bytes[d])})[/red]",
        )
    console.print(table)
    if r.critical_path:
        console.print(
            f"critical path ({len(r.critical_path)} actions): {compress_path(r.critical_path)}"
        )
    if r.reductions:
        compute_end = max(e.end for e in r.events) if r.events else 0.0
        exposed = max(0.0, r.iteration_time - compute_end)
        total = sum(x.end - x.start for x in r.reductions)
        console.print(
            f"gradient all-reduce: {len(r.reductions)} stage(s), {fmt_time(total)} in all; "
            f"{fmt_time(exposed)} of it after the last compute action"
        )
