"""Typed values out of parsed JSON: llama-server's answers and the files llamanix wrote.

``json.loads`` gives untyped values. Answers from a server are read leniently (a field of the
wrong type counts as absent: ``as_float``, ``as_int``, ``as_str``); files llamanix wrote itself are
read strictly through ``JsonFields``, which names the field that is missing or of the wrong type,
so a damaged file is one clear error instead of a wrong number later.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from llamanix.core.json_fields import integer as as_int
from llamanix.core.json_fields import number
from llamanix.core.json_fields import text as as_str

__all__ = ["JsonFields", "as_float", "as_int", "as_str"]


def as_float(value: object) -> float | None:
    """A JSON number as a float; None for anything else, booleans too (Python counts them as
    ints). The lenient reads themselves are core.json_fields'."""
    found = number(value)
    return None if found is None else float(found)


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
        value = as_str(self.data.get(key))
        if value is None:
            raise self._wrong(key, "a string")
        return value

    def opt_string(self, key: str) -> str | None:
        return self.string(key) if self.has(key) else None

    def integer(self, key: str) -> int:
        value = as_int(self.data.get(key))
        if value is None:
            raise self._wrong(key, "an integer")
        return value

    def opt_integer(self, key: str) -> int | None:
        return self.integer(key) if self.has(key) else None

    def number(self, key: str) -> float:
        value = as_float(self.data.get(key))
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
        values = [as_str(v) for v in self.items(key)]
        texts = [v for v in values if v is not None]
        if len(texts) != len(values):
            raise self._wrong(key, "a list of strings")
        return texts

    def integers(self, key: str) -> list[int]:
        values = [as_int(v) for v in self.items(key)]
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
