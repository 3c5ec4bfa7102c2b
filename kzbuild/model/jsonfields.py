"""Typed reads of untrusted JSON: llama-bench's output and the lines of results files.

Every read checks one value's type and range; a wrong one raises :class:`BadRecord` naming
where it is, the key and the value. Numbers are returned as parsed (an int stays an int), so a
record read back hashes to the same content id it was stored under.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from kzbuild.errors import BadRecord

MAX_INT = 2**63 - 1  # SQLite's INTEGER; llama-bench's counts are far below it
SHOWN_CHARS = 60
JSON_SCALARS = (str, int, float, bool, type(None))
EXACT_SCALARS = frozenset(
    {str, bool, type(None)}
)  # always fine; ints can be too big, floats non-finite
SURROGATE_ESCAPE_RE = re.compile(
    r"\\u[dD][89a-fA-F]"
)  # \ud800-\udfff: json.loads lets lone ones through


def show(value: object) -> str:
    """A value for an error message: its repr, cut short."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


def tool_json(stdout: bytes, *, source: str, tool: str, item: str = "") -> Any:
    """A device tool's JSON output, read strictly (see loads); empty or non-UTF-8 output is a
    BadRecord naming ``source``."""
    try:
        text = stdout.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRecord(
            f"{source}: not UTF-8 text (byte {exc.start} is {stdout[exc.start]:#04x})"
        ) from None
    if not text.strip():
        raise BadRecord(f"{source}: {tool} printed nothing on stdout")
    return loads(text, where=source, item=item)


def loads(text: str, *, where: str, item: str = "") -> Any:
    """Strict JSON: no NaN or Infinity (Python's json reads them, the standard has none), no lone
    surrogates (they cannot be written back as UTF-8), no nesting deep enough to overflow. A bad
    value is named by its path, e.g. ``test 1: avg_ts`` with ``item="test"`` for a list of tests."""
    suspicious = False

    def note_constant(name: str) -> float:
        nonlocal suspicious
        suspicious = True
        return float(name)

    def note_float(literal: str) -> float:
        nonlocal suspicious
        value = float(literal)
        suspicious = suspicious or not math.isfinite(value)
        return value

    try:
        data = json.loads(text, parse_constant=note_constant, parse_float=note_float)
        if suspicious or SURROGATE_ESCAPE_RE.search(text):  # rare: only then walk the whole value
            if item and isinstance(data, list):
                for index, value in enumerate(data):
                    _check_values(value, f"{where}: {item} {index}")
            else:
                _check_values(data, where)
    except RecursionError:
        raise BadRecord(f"{where}: JSON nested too deeply") from None
    except ValueError as exc:
        raise BadRecord(f"{where}: not valid JSON: {exc}") from None
    return data


def _check_values(value: object, where: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise BadRecord(f"{where}: {value} is not a JSON number")
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise BadRecord(f"{where}: {show(value)} holds a lone UTF-16 surrogate") from None
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_values(item, f"{where}[{index}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_values(key, where)
            _check_values(item, f"{where}: {key}")


def number_or_none(value: object) -> int | float | None:
    """The value when it is a finite JSON number (not a bool, not too big for a float), else
    None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return value if math.isfinite(float(value)) else None
    except OverflowError:
        return None


_REQUIRED: Any = object()


class Fields:
    """A JSON object whose values are read one typed key at a time."""

    def __init__(self, data: object, where: str) -> None:
        if not isinstance(data, dict):
            raise BadRecord(f"{where}: expected a JSON object, got {show(data)}")
        self.data: dict[str, Any] = data
        self.where = where

    def error(self, key: str, expected: str) -> BadRecord:
        return BadRecord(f"{self.where}: {key}: {show(self.data.get(key))} is not {expected}")

    def _value(self, key: str, default: Any) -> Any:
        if key in self.data:
            return self.data[key]
        if default is _REQUIRED:
            raise BadRecord(f"{self.where}: missing key '{key}'")
        return default

    def check_known(self, known: frozenset[str]) -> None:
        unknown = sorted(self.data.keys() - known)
        if unknown:
            raise BadRecord(f"{self.where}: unknown key '{unknown[0]}'")

    def text(self, key: str, default: Any = _REQUIRED) -> str:
        value = self._value(key, default)
        if not isinstance(value, str):
            raise self.error(key, "a string")
        return value

    def optional_text(self, key: str) -> str | None:
        value = self._value(key, None)
        return None if value is None else self.text(key)

    def choice(self, key: str, allowed: tuple[str, ...]) -> str:
        value = self.text(key)
        if value not in allowed:
            raise self.error(key, "one of " + ", ".join(allowed))
        return value

    def count(
        self, key: str, default: Any = _REQUIRED, *, minimum: int = 0, maximum: int = MAX_INT
    ) -> int:
        value = self._value(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
            raise self.error(key, f"an integer from {minimum} to {maximum}")
        return value

    def optional_count(self, key: str) -> int | None:
        return None if self._value(key, None) is None else self.count(key)

    def number(self, key: str, default: Any = _REQUIRED, *, zero_ok: bool = False) -> int | float:
        value = number_or_none(self._value(key, default))
        if value is None or value < 0 or (value == 0 and not zero_ok):
            raise self.error(key, "a number >= 0" if zero_ok else "a number > 0")
        return value

    def optional_number(self, key: str, *, zero_ok: bool = False) -> int | float | None:
        return None if self._value(key, None) is None else self.number(key, zero_ok=zero_ok)

    def numbers(
        self, key: str, default: Any = _REQUIRED, *, max_items: int, zero_ok: bool = False
    ) -> tuple[int | float, ...]:
        """A list of numbers > 0 (samples; >= 0 with ``zero_ok``)."""
        value = self._value(key, default)
        if not isinstance(value, (list, tuple)) or len(value) > max_items:
            raise self.error(key, f"a list of at most {max_items} numbers")
        for index, item in enumerate(value):
            number = number_or_none(item)
            if number is None or number < 0 or (number == 0 and not zero_ok):
                bound = ">= 0" if zero_ok else "> 0"
                where = f"{self.where}: {key}[{index}]"
                raise BadRecord(f"{where}: {show(item)} is not a number {bound}")
        return tuple(value)

    def texts(self, key: str, default: Any = _REQUIRED) -> tuple[str, ...]:
        value = self._value(key, default)
        if not isinstance(value, (list, tuple)) or not all(isinstance(item, str) for item in value):
            raise self.error(key, "a list of strings")
        return tuple(value)

    def text_map(self, key: str, default: Any = _REQUIRED) -> dict[str, str]:
        value = self._value(key, default)
        if not isinstance(value, dict) or not all(isinstance(item, str) for item in value.values()):
            raise self.error(key, "an object of strings")
        return dict(value)

    def scalar_map(self, key: str, default: Any = _REQUIRED) -> dict[str, Any]:
        """An object of JSON scalars (configuration fields)."""
        value = self._value(key, default)
        if not isinstance(value, dict):
            raise self.error(key, "an object")
        for name, item in value.items():
            check_scalar(item, where=f"{self.where}: {key}.{name}")
        return dict(value)

    def json_map(self, key: str, default: Any = _REQUIRED) -> dict[str, Any]:
        """An object of any JSON (device conditions, llama-bench's record as printed)."""
        value = self._value(key, default)
        if not isinstance(value, dict):
            raise self.error(key, "an object")
        return dict(value)

    def object(self, key: str, default: Any = _REQUIRED) -> Fields:
        return Fields(self._value(key, default), f"{self.where}: {key}")


def check_scalar(value: object, *, where: str) -> None:
    """A JSON scalar: a string, a finite number, a bool or null (never a list or an object)."""
    if (
        type(value) in EXACT_SCALARS
    ):  # the usual case, checked first: every configuration field of every record read
        return
    if not isinstance(value, JSON_SCALARS) or (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and number_or_none(value) is None
    ):
        raise BadRecord(f"{where}: {show(value)} is not a string, number, bool or null")
