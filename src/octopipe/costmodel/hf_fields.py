"""Typed access to a config.json's fields: each fault one InputError naming the file and the
dotted field (`hf_config.py` reads the families' fields through it)."""

from __future__ import annotations

from typing import Any

from octopipe.errors import InputError

_MISSING = object()
MAX_CONFIG_INT = 2**31  # any shape of a config: widths, vocabularies, experts (limits.py: layers)


class Fields:
    """Typed access to one JSON object's fields; faults name the file and the dotted field."""

    def __init__(self, data: Any, where: str, prefix: str = ""):
        if not isinstance(data, dict):
            raise InputError(where, "expected a JSON object", prefix.rstrip(".") or None)
        self.data, self.where, self.prefix = data, where, prefix

    def fault(self, key: str, message: str) -> InputError:
        return InputError(self.where, message, self.prefix + key)

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def _get(self, key: str, default: Any) -> Any:
        value = self.data.get(key)
        if value is None:
            if default is _MISSING:
                raise self.fault(key, "missing field")
            return default
        return value

    def int(
        self, key: str, default: Any = _MISSING, minimum: int = 1, maximum: int = MAX_CONFIG_INT
    ) -> Any:
        value = self._get(key, default)
        if value is default and default is not _MISSING:
            return value
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.fault(key, f"expected an integer >= {minimum} (got {value!r})")
        if value > maximum:
            raise self.fault(key, f"{value:,} is more than the {maximum:,} allowed")
        return value

    def float(self, key: str, default: Any = _MISSING) -> Any:
        value = self._get(key, default)
        if value is default and default is not _MISSING:
            return value
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise self.fault(key, f"expected a positive number (got {value!r})")
        return float(value)

    def bool(self, key: str, default: bool) -> bool:
        value = self._get(key, default)
        if not isinstance(value, bool):
            raise self.fault(key, f"expected true or false (got {value!r})")
        return value

    def str(self, key: str, default: Any = _MISSING) -> Any:
        value = self._get(key, default)
        if not isinstance(value, str):
            raise self.fault(key, f"expected a string (got {value!r})")
        return value

    def int_list(self, key: str) -> tuple[int, ...]:
        value = self._get(key, [])
        if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
        ):
            raise self.fault(key, f"expected a list of non-negative integers (got {value!r})")
        return tuple(value)

    def sub(self, key: str) -> Fields:
        return Fields(self._get(key, _MISSING), self.where, f"{self.prefix}{key}.")
