"""Strict JSON in, standard JSON out: how every OctoPipe file of JSON is read and written.

Reading refuses what Python's `json` lets through or chokes on: `NaN` and `Infinity`, numbers
beyond a float's range (`1e400` would read as infinity), integers beyond Python's 4,300
digits, a key given twice in one object (the last would silently win), text that is not
UTF-8, and files larger than `limits.MAX_INPUT_FILE_BYTES`. (How large a number may be is
each format's business: every field is bounded, `limits.py`.) Each fault is one `InputError`
naming the file and, where it can, the line.

Writing emits standard JSON only (`allow_nan=False`: a non-finite figure is an error, not an
`Infinity` no other reader takes) into a temporary file beside the target, renamed into place
once complete, so no reader ever sees half a file; only a regular file is written over
(`outfiles`).

Only syntax lives here; what a file's keys mean is its format's module (profile, plan, trace).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from octopipe import outfiles
from octopipe.errors import InputError, OctoPipeError
from octopipe.limits import MAX_INPUT_FILE_BYTES


class NonFiniteResult(OctoPipeError):
    """A figure to be written is infinite or NaN, which standard JSON cannot hold."""


def read_json(path: str | Path) -> Any:
    """The JSON value in `path`, read strictly (module docstring)."""
    path = Path(path)
    where = str(path)
    try:
        size = path.stat().st_size
        if size > MAX_INPUT_FILE_BYTES:
            raise InputError(where, f"is {size:,} bytes; at most {MAX_INPUT_FILE_BYTES:,} are read")
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(where, f"cannot read: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(where, f"not UTF-8 text (byte {exc.start}): not a JSON file") from None
    return parse_json(text, where)


def parse_json(text: str, where: str) -> Any:
    """`text` as a JSON value, read strictly; faults name `where`."""
    try:
        return json.loads(
            text,
            parse_float=_finite_float,  # float() reads 1e400 as inf
            parse_constant=_no_constant,
            object_pairs_hook=_unique_keys,
        )
    except json.JSONDecodeError as exc:
        raise InputError(where, f"malformed JSON: {exc.msg}", f"line {exc.lineno}") from None
    except _Refused as exc:
        raise InputError(where, str(exc)) from None
    except ValueError as exc:  # an integer beyond Python's 4,300 digits for int()
        raise InputError(where, f"a number is beyond any size OctoPipe reads ({exc})") from None
    except RecursionError:
        raise InputError(where, "nested too deeply") from None


def dumps(data: Any, indent: int | None = None) -> str:
    """Standard JSON text of `data`; NonFiniteResult if any number in it is inf or NaN."""
    try:
        return json.dumps(data, indent=indent, allow_nan=False)
    except ValueError:
        raise NonFiniteResult(
            f"a result is not finite ({_first_non_finite(data)}): standard JSON cannot hold it"
        ) from None


def write_json(path: str | Path, data: Any, indent: int | None = 1, sync: bool = False) -> None:
    """`data` as standard JSON in `path`, written whole or not at all."""
    write_text(path, dumps(data, indent) + "\n", sync)


def write_text(path: str | Path, text: str, sync: bool = False) -> None:
    """`text` (UTF-8) in `path`, whole or not at all, and only over a regular file
    (`octopipe.outfiles`)."""
    outfiles.write_text(path, text, sync)


class _Refused(ValueError):
    """A value JSON's grammar allows but OctoPipe does not read."""


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"the number {text} is beyond a float's range")
    return value


def _no_constant(name: str) -> Any:
    raise _Refused(f"{name} is not a JSON number")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) < len(pairs):
        seen: set[str] = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise _Refused(f"key {twice!r} is given twice in one object")
    return out


def _first_non_finite(data: Any, place: str = "") -> str | None:
    """Where the first inf or NaN in `data` sits: `iteration_time is inf`, `losses[3] is nan`."""
    if isinstance(data, float) and not math.isfinite(data):
        return f"{place or 'the value'} is {data}"
    if isinstance(data, dict):
        parts = ((f"{place}.{k}" if place else str(k), v) for k, v in data.items())
    elif isinstance(data, list | tuple):
        parts = ((f"{place}[{i}]", v) for i, v in enumerate(data))
    else:
        return None
    return next((found for sub, v in parts if (found := _first_non_finite(v, sub))), None)
