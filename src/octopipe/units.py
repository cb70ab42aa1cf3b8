"""Bytes and seconds for people: formatters, unit pickers for axes, and the size parser.

    fmt_bytes(3 * 2**30)      -> "3.0 GiB"       fmt_time(0.0123) -> "12.30 ms"
    byte_unit(3 * 2**30)      -> ("GiB", 2**30)  time_unit(0.0123) -> ("ms", 1e3)
    fmt_count(213_568)        -> "213.6K"        fmt_count(8.03e9) -> "8.03B"
    fmt_column([182.4, 0.05]) -> ["182.4", "0.1"] (a table column, in the unit of its largest)
    parse_size("40GiB", "--memory-limit") -> 42949672960.0

Every command, report and picture formats through here, so a number reads the same everywhere:
small models and CPUs included, a figure is shown in the unit that keeps its digits
(213.6K params, 120.2 us, 3.3 MiB), never as 0.00B, 0.0001 s or 0.0 GiB.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from octopipe.errors import InputError
from octopipe.limits import MAX_BYTES

KIB, MIB, GIB, TIB = 2**10, 2**20, 2**30, 2**40

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1e3,
    "mb": 1e6,
    "gb": 1e9,
    "tb": 1e12,
    "kib": KIB,
    "mib": MIB,
    "gib": GIB,
    "tib": TIB,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def fmt_bytes(n: float | None) -> str:
    """'512 B', '1.5 KiB' ... '2.0 TiB'; '-' for no figure or an unlimited one."""
    if n is None or n == float("inf"):
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def fmt_time(seconds: float) -> str:
    """'1.250 s', '12.30 ms', '80.0 us'."""
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} us"


def fmt_eta(seconds: float) -> str:
    """A time left, to the second: '45 s', '3 min 05 s', '2 h 10 min'."""
    whole = max(0, round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes:02d} min"
    if minutes:
        return f"{minutes} min {secs:02d} s"
    return f"{secs} s"


def fmt_count(n: float) -> str:
    """A count of things (parameters, tokens) in K, M, B or T with 3 or 4 digits: '512',
    '213.6K', '8.03B'."""
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= size:
            x = n / size
            return f"{x:.1f}{unit}" if x >= 100 else f"{x:.4g}{unit}"
    return f"{n:.0f}"


def fmt_column(figures: Sequence[float]) -> list[str]:
    """A table column's figures, already in the column's unit (`time_unit` or `byte_unit` of
    its largest), with the decimals that give the largest 4 digits (3 at most): [182.4, 0.05]
    -> ['182.4', '0.1']; [3.259, 0.0009] -> ['3.259', '0.001']."""
    largest = max((abs(x) for x in figures), default=0.0)
    decimals = 3 if largest < 1 else max(0, 3 - int(math.log10(largest)))
    return [f"{x:,.{decimals}f}" for x in figures]


def time_unit(span: float) -> tuple[str, float]:
    """(unit name, factor from seconds) that keeps tick labels short for a span in seconds."""
    if span >= 1.0:
        return "s", 1.0
    if span >= 1e-3:
        return "ms", 1e3
    return "µs", 1e6


def byte_unit(nbytes: float) -> tuple[str, float]:
    """(unit name, bytes per unit) for an axis whose largest value is `nbytes`."""
    for name, size in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if nbytes >= size:
            return name, float(size)
    return "B", 1.0


def parse_size(text: str, where: str) -> float:
    """'40GiB' -> 42949672960.0, '80e9' -> 8e10; plain numbers are bytes. A fault is an
    InputError naming `where` (the option or field)."""
    m = _SIZE.match(text)
    unit = m.group(2).lower() if m else None
    if not m or unit not in _SIZE_UNITS:
        raise InputError(where, f"expected a size such as 40GiB or 80e9, got {text!r}")
    value = float(m.group(1)) * _SIZE_UNITS[unit]
    if not 0 < value <= MAX_BYTES:
        raise InputError(where, f"must be from 1 byte to {MAX_BYTES:.3g} bytes, got {text!r}")
    return value
