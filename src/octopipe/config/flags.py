"""Argument types for the commands' numeric flags: a value out of range is refused by argparse,
in one line, before a command starts (docs/FORMATS.md, "Limits").

    p.add_argument("--microbatches", type=count(1, MAX_MICROBATCHES))
    p.add_argument("--lr", type=number(0, 1e6))
    p.add_argument("--momentum", type=number(0, 1, below=True))     # [0, 1)

Numbers are ASCII: Python's int() and float() also read other scripts' digits ("٣" is 3),
which no one types on purpose. Floats are finite: "nan" and "inf" are refused everywhere.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from octopipe.config.fields import Setting

_INTEGER = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


def count(minimum: int, maximum: int) -> Callable[[str], int]:
    """An integer from `minimum` to `maximum` (both included)."""

    def parse(text: str) -> int:
        if not _INTEGER.fullmatch(text.strip()):
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}")
        value = int(text)
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(
                f"expected an integer from {minimum:,} to {maximum:,}, got {text}"
            )
        return value

    parse.__name__ = "integer"  # argparse names the type in its messages
    parse.bounds = (minimum, maximum)  # type: ignore[attr-defined]  # for tests and docs
    return parse


def number(
    minimum: float, maximum: float, *, above: bool = False, below: bool = False
) -> Callable[[str], float]:
    """A finite number from `minimum` to `maximum`; `above`/`below`: the bound itself excluded."""
    low, high = "(" if above else "[", ")" if below else "]"
    interval = f"{low}{minimum:g}, {maximum:g}{high}"

    def parse(text: str) -> float:
        if text.strip().lower().lstrip("+-") in ("inf", "infinity", "nan"):
            raise argparse.ArgumentTypeError(f"expected a finite number in {interval}, got {text}")
        if not _FLOAT.fullmatch(text.strip()):
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}")
        value = float(text)
        too_low = value <= minimum if above else value < minimum
        too_high = value >= maximum if below else value > maximum
        if not math.isfinite(value) or too_low or too_high:
            raise argparse.ArgumentTypeError(f"expected a number in {interval}, got {text}")
        return value

    parse.__name__ = "number"
    parse.bounds = (minimum, maximum, above, below)  # type: ignore[attr-defined]
    return parse


def add_setting_flag(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    s: Setting,
    dest: str | None = None,
    required: bool = False,
    **extra: Any,
) -> None:
    """One setting as an argparse option: its doc as the help, its bounds as the type's.
    `dest`: where the value goes (default: the setting's keyword); `extra`: argparse's own
    keywords (an action of the caller's)."""
    assert s.spec.flag is not None, f"{s.key} has no flag"
    options: dict[str, Any] = {"dest": dest or s.keyword, "help": s.spec.doc, **extra}
    if s.kind is bool:
        options.setdefault("action", "store_true")
        parser.add_argument(s.spec.flag, **options)
        return
    options.setdefault("default", s.default)
    if required:
        options.update(required=True, default=None)
    if s.spec.choices is None:
        options["metavar"] = s.spec.flag.lstrip("-").upper().replace("-", "_")
    else:
        options["choices"] = s.spec.choices
    if s.spec.flag_const is not None:  # `--resume` alone, or `--resume=require`
        options.update(nargs="?", const=s.spec.flag_const)
    if s.kind is int:
        low = 0 if s.spec.low is None else int(s.spec.low)
        high = max(s.spec.choices or (int(s.spec.high),))  # type: ignore[arg-type]
        options["type"] = count(low, high)
    elif s.kind is float:
        options["type"] = number(
            s.spec.low, s.spec.high, above=s.spec.open_low, below=s.spec.open_high
        )
    parser.add_argument(s.spec.flag, **options)
