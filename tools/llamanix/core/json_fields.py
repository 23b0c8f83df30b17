"""Typed reads of parsed JSON: state records, manifests, gate verdicts, bench results and
llama-server's answers.

Two ways, one module. The functions are lenient: each takes a value from ``json.loads`` and
returns it when it has the expected type, else None (or nothing), so a record an older version
wrote, one a killed command never finished, or a server's answer missing a field still reads,
and the reader says what a missing value means. ``JsonFields`` is strict, for files whose every
field must be there (bench results, ceilings): a field that is missing or of the wrong type is
one clear error naming it, instead of a wrong number later. ``bool`` is never taken for a
number, though Python counts it as one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T", bound=str)


def table(value: object) -> Mapping[str, object]:
    """A JSON object, or an empty one."""
    return value if isinstance(value, dict) else {}


def text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def integer(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def number(value: object) -> float | None:
    """An int stays an int (a float to the type checker), so it is written back as it was."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    return None


def real(value: object) -> float | None:
    """A JSON number as a float (for arithmetic and formatting); None for anything else."""
    found = number(value)
    return None if found is None else float(found)


def flag(value: object) -> bool | None:
    return value if isinstance(value, bool) else None


def texts(value: object) -> tuple[str, ...]:
    """A list of strings; anything else in it is left out."""
    return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list) else ()


def numbers(value: object) -> tuple[float, ...] | None:
    """A list of numbers, or None when it is not a list or holds anything else."""
    if not isinstance(value, list):
        return None
    found = [number(v) for v in value]
    return tuple(v for v in found if v is not None) if None not in found else None


def choice(value: object, allowed: tuple[T, ...]) -> T | None:
    """``value`` when it is one of ``allowed`` (a Literal's values), typed as that Literal."""
    for candidate in allowed:
        if value == candidate:
            return candidate
    return None


@dataclass(frozen=True)
class JsonFields:
    """One JSON object read field by field; a field that is missing or of the wrong type raises
    ValueError naming it (``where.key``)."""

    data: Mapping[str, object]
    where: str

    @staticmethod
    def of(value: object, where: str) -> JsonFields:
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected an object")
        return JsonFields({str(k): v for k, v in value.items()}, where)

    def _wrong(self, key: str, expected: str) -> ValueError:
        return ValueError(f"{self.where}.{key}: expected {expected}")

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def string(self, key: str) -> str:
        value = text(self.data.get(key))
        if value is None:
            raise self._wrong(key, "a string")
        return value

    def opt_string(self, key: str) -> str | None:
        return self.string(key) if self.has(key) else None

    def integer(self, key: str) -> int:
        value = integer(self.data.get(key))
        if value is None:
            raise self._wrong(key, "an integer")
        return value

    def opt_integer(self, key: str) -> int | None:
        return self.integer(key) if self.has(key) else None

    def number(self, key: str) -> float:
        value = real(self.data.get(key))
        if value is None:
            raise self._wrong(key, "a number")
        return value

    def opt_number(self, key: str) -> float | None:
        return self.number(key) if self.has(key) else None

    def flag(self, key: str) -> bool:
        value = self.data.get(key)
        if not isinstance(value, bool):
            raise self._wrong(key, "true or false")
        return value

    def raw(self, key: str) -> object:
        """The field as parsed, for a reader of its own (``Stats.from_json``); None if absent."""
        return self.data.get(key)

    def items(self, key: str) -> list[object]:
        value = self.data.get(key)
        if not isinstance(value, list):
            raise self._wrong(key, "a list")
        return value

    def strings(self, key: str) -> list[str]:
        values = [text(v) for v in self.items(key)]
        texts = [v for v in values if v is not None]
        if len(texts) != len(values):
            raise self._wrong(key, "a list of strings")
        return texts

    def integers(self, key: str) -> list[int]:
        values = [integer(v) for v in self.items(key)]
        numbers = [v for v in values if v is not None]
        if len(numbers) != len(values):
            raise self._wrong(key, "a list of integers")
        return numbers

    def obj(self, key: str) -> JsonFields:
        return JsonFields.of(self.data.get(key), f"{self.where}.{key}")

    def opt_obj(self, key: str) -> JsonFields | None:
        return self.obj(key) if self.has(key) else None

    def names(self) -> list[str]:
        """The fields present, in file order."""
        return list(self.data)
