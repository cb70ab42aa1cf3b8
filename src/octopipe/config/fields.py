"""What a setting is beyond its Python type: its doc, its `run` flag, its `octopipe.run` keyword
and its bounds; and the one check of a value against them, whichever way the value came in.

A section of the job config is a frozen dataclass whose fields are made by `setting(...)`; the
flags, the job file's keys, the API's keywords and the docs table are all read off these.
Stdlib only: the CLI builds its parser from them without importing torch or pydantic.
"""

from __future__ import annotations

import math
import typing
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any

from octopipe.errors import InputError

_KIND = {int: "integer", float: "number", bool: "true or false", str: "text"}


@dataclass(frozen=True)
class Spec:
    doc: str
    flag: str | None = None  # `octopipe run`'s flag; None: job file and API only
    keyword: str | None = None  # `octopipe.run`'s keyword; None: the flag's name, `-` as `_`
    low: float | None = None
    high: float | None = None
    open_low: bool = False  # the bound itself excluded
    open_high: bool = False
    choices: tuple[Any, ...] | None = None
    required: bool = False  # no default: a job must give it (by flag, file or argument)
    flag_const: Any = None  # the value of the flag given without one (`--resume`), if it may be
    aliases: tuple[tuple[Any, Any], ...] = ()  # (value taken, value held): `true` -> "yes"


def setting(default: Any, doc: str, **spec: Any) -> Any:
    """A field of a config section: `default` (None where unset means "not given"), its
    one-paragraph `doc`, and the `Spec` keywords (flag, keyword, low, high, choices, ...)."""
    return field(default=default, metadata={"octopipe": Spec(doc, **spec)})


@dataclass(frozen=True)
class Setting:
    """One field of the job config, as the flags, the file and the docs see it."""

    section: str
    name: str
    kind: type  # int, float, bool or str (the field's type without None)
    optional: bool  # None is a value (not given)
    default: Any
    spec: Spec

    @property
    def key(self) -> str:
        """The job file's dotted key, `section.name`."""
        return f"{self.section}.{self.name}"

    @property
    def keyword(self) -> str:
        if self.spec.keyword:
            return self.spec.keyword
        return (self.spec.flag or f"--{self.name}").lstrip("-").replace("-", "_")

    @property
    def label(self) -> str:
        """How an error names the setting: its flag where it has one, else its key."""
        return self.spec.flag or self.key

    def bounds_text(self) -> str:
        s = self.spec
        if s.choices is not None:
            return "one of " + ", ".join(str(c) for c in s.choices)
        if s.low is None and s.high is None:
            return ""
        low = "(" if s.open_low else "["
        high = ")" if s.open_high else "]"
        fmt = "{:,}" if self.kind is int else "{:g}"
        lo = "-inf" if s.low is None else fmt.format(s.low)
        hi = "inf" if s.high is None else fmt.format(s.high)
        return f"{low}{lo}, {hi}{high}"

    def check(self, value: Any, where: str | None = None) -> Any:
        """`value` as this setting holds it, or an InputError naming `where` (default: the
        setting's flag or key). Integers and numbers from a file or code are checked as
        strictly as the flag's parser checks its text."""
        where = where or self.label
        if value is None:
            if self.optional:
                return None
            raise InputError(where, "must be given" if self.spec.required else "must not be null")
        value = next(
            (
                held
                for taken, held in self.spec.aliases
                if type(taken) is type(value) and taken == value
            ),
            value,
        )
        value = self._typed(value, where)
        s = self.spec
        if s.choices is not None and value not in s.choices:
            raise InputError(where, f"expected {self.bounds_text()}, got {value!r}")
        if self.kind in (int, float):
            too_low = s.low is not None and (value <= s.low if s.open_low else value < s.low)
            too_high = s.high is not None and (value >= s.high if s.open_high else value > s.high)
            if too_low or too_high:
                what = "an integer" if self.kind is int else "a number"
                raise InputError(where, f"expected {what} in {self.bounds_text()}, got {value}")
        return value

    def _typed(self, value: Any, where: str) -> Any:
        kind = self.kind
        # bool is an int to Python; a job file's `steps = true` is still a mistake
        if isinstance(value, bool) != (kind is bool):
            raise InputError(where, f"expected {_KIND[kind]}, got {value!r}")
        if kind is float and isinstance(value, int):
            value = float(value)
        if not isinstance(value, kind):
            raise InputError(where, f"expected {_KIND[kind]}, got {value!r}")
        if kind is float and not math.isfinite(value):
            raise InputError(where, f"expected a finite number, got {value}")
        if kind is str and not value.strip():  # "" would read as the folder "."
            raise InputError(where, "is empty")
        if kind is str:
            from octopipe.limits import MAX_TEXT_SETTING_CHARS as most

            if len(value) > most:  # a name or path this long is a paste gone wrong
                raise InputError(where, f"is {len(value):,} characters; at most {most:,}")
        return value


def settings_of(section_name: str, section: type) -> list[Setting]:
    """The settings of one section class, in their order of declaration."""
    hints = typing.get_type_hints(section)
    out = []
    for f in fields(section):
        spec = f.metadata.get("octopipe")
        if spec is None:
            raise TypeError(f"{section.__name__}.{f.name} is not a setting(...)")
        kind, optional = _kind_of(hints[f.name])
        out.append(Setting(section_name, f.name, kind, optional, _default(f), spec))
    return out


def _kind_of(hint: Any) -> tuple[type, bool]:
    args = typing.get_args(hint)
    if args and type(None) in args:
        (kind,) = (a for a in args if a is not type(None))
        return kind, True
    return hint, False


def _default(f: Field) -> Any:
    return None if f.default is MISSING else f.default
