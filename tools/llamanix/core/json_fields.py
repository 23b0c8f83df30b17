"""Typed reads of JSON that llamanix wrote earlier: state records, manifests, gate verdicts.

Each function takes a value from ``json.loads`` and returns it when it has the expected type,
else None (or nothing): a record an older version wrote, or one a killed command never
finished, still reads, and the reader says what a missing value means. ``bool`` is never taken
for a number, though Python counts it as one.
"""

from __future__ import annotations

from collections.abc import Mapping
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
