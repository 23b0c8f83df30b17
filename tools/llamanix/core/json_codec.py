"""A frozen dataclass to JSON and back, driven by its fields and their types.

``to_json`` writes a record as a ``JsonObject``: one key per field, in field order; a nested
dataclass is an object, a tuple a list, a Mapping an object, an Enum its value. A field that is
None is written as ``null``, except where its metadata is ``OMIT_NONE``
(``field(default=None, metadata=OMIT_NONE)``): then it is left out, so a file keeps the shape it
had when only some records carried it. ``metadata=json_key("other-name")`` names the key when
it differs from the field. A field whose JSON has another shape than its type (a list kept as
an object by name, say) names its own two functions: ``metadata=json_via(write, read)``.

Two readers, as in ``json_fields``:

- ``from_json`` is strict: a field that is missing (without a default) or of the wrong type
  raises ValueError naming it (``where.field``, ``where.field[2]``), instead of a wrong number
  later. A field that is missing or null and has a default takes it, so a record an older
  version wrote (before the field existed) still reads; ``X | None`` reads null or nothing as
  None.
- ``from_json_lenient`` is for state files a killed command may have left half-written, and for
  records older versions wrote: a value that is missing or of the wrong type takes the field's
  default (None for ``X | None``); a list or table keeps the items of the right type. Only a
  field with neither a value nor a default is an error.

A number is never read from ``true``/``false``, though Python counts a bool as an int; an int
in a ``float`` field reads as a float. Types understood: str, int, float, bool, None,
``Literal``, ``X | None``, ``tuple[X, ...]``, ``list[X]``, ``Mapping``/``dict`` with str or
Literal keys, ``Path`` (a string), Enums and nested dataclasses. The field types are resolved
once per class (``get_type_hints`` on first use, then cached), so importing this module costs
nothing.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, Self, TypeVar, Union

from llamanix.core import json_fields as jf
from llamanix.core.json_value import JsonObject, JsonValue

T = TypeVar("T")

_KEY = "json"
_OMIT_NONE = "json_omit_none"
_WRITE = "json_write"
_READ = "json_read"


OMIT_NONE: Mapping[str, object] = {_OMIT_NONE: True}
"""Field metadata: leave the key out when the value is None (``field(default=None,
metadata=OMIT_NONE)``)."""


def json_key(key: str, *, omit_none: bool = False) -> Mapping[str, object]:
    """Field metadata: the JSON key when it is not the field's name."""
    return {_KEY: key, _OMIT_NONE: omit_none}


def json_via(
    write: Callable[[Any], JsonValue],
    read: Callable[[object], object],
    *,
    key: str | None = None,
    omit_none: bool = False,
) -> Mapping[str, object]:
    """Field metadata: the field's JSON is ``write(value)``, read back by ``read(raw)`` (which
    raises ValueError when ``raw`` is not one); for a field whose JSON has another shape than
    its type. ``key``: the JSON key when it is not the field's name; ``omit_none`` as
    ``OMIT_NONE``."""
    found: dict[str, object] = {_WRITE: write, _READ: read, _OMIT_NONE: omit_none}
    if key is not None:
        found[_KEY] = key
    return found


@dataclasses.dataclass(frozen=True)
class _Field:
    name: str
    key: str
    type: object
    required: bool  # no default: a reader without the value cannot build the record
    omit_none: bool
    write: Callable[[Any], JsonValue] | None = None
    read: Callable[[object], object] | None = None


_FIELDS: dict[type, tuple[_Field, ...]] = {}


def _fields(cls: type) -> tuple[_Field, ...]:
    """The class's fields with their types resolved, once per class."""
    found = _FIELDS.get(cls)
    if found is None:
        found = _FIELDS[cls] = _resolve(cls)
    return found


def _resolve(cls: type) -> tuple[_Field, ...]:
    hints = typing.get_type_hints(cls)
    return tuple(
        _Field(
            name=f.name,
            key=str(f.metadata.get(_KEY, f.name)),
            type=hints[f.name],
            required=f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
            and not _optional(hints[f.name]),
            omit_none=bool(f.metadata.get(_OMIT_NONE, False)),
            write=f.metadata.get(_WRITE),
            read=f.metadata.get(_READ),
        )
        for f in dataclasses.fields(cls)
        if f.init
    )


def _optional(tp: object) -> bool:
    return _is_union(tp) and type(None) in typing.get_args(tp)


def _is_union(tp: object) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType)


class JsonRecord:
    """A base for a frozen dataclass that the codec writes and reads: ``record.to_json()`` and
    ``Record.from_json(value, where)`` (strict), without writing either by hand."""

    __slots__ = ()

    def to_json(self) -> JsonObject:
        return to_json(self)

    @classmethod
    def from_json(cls, value: object, where: str) -> Self:
        return from_json(cls, value, where)


# --- writing ---------------------------------------------------------------------------------


def to_json(record: object) -> JsonObject:
    """The record as a JSON object, keys in field order."""
    out: JsonObject = {}
    for f in _fields(type(record)):
        value = getattr(record, f.name)
        if value is None and f.omit_none:
            continue
        out[f.key] = f.write(value) if f.write is not None else _value_json(value)
    return out


def _value_json(value: object) -> JsonValue:
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, enum.Enum):
        return _value_json(value.value)
    if isinstance(value, Path):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_json(value)
    if isinstance(value, Mapping):
        return {str(k): _value_json(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_value_json(v) for v in value]
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


# --- reading ---------------------------------------------------------------------------------


class _Wrong(Exception):
    """A value of the wrong type: what was expected, and where (within the value)."""

    def __init__(self, expected: str, path: str = "") -> None:
        super().__init__(expected)
        self.expected = expected
        self.path = path


_MISSING = object()


def from_json(cls: type[T], value: object, where: str) -> T:
    """The record of type ``cls`` in ``value``; ValueError naming the field that is missing or
    of the wrong type."""
    try:
        return _record(cls, value, strict=True)
    except _Wrong as err:
        raise _error(where, err) from None


def from_json_lenient(cls: type[T], value: object, where: str = "") -> T:
    """The record of type ``cls`` in ``value``, a missing or ill-typed value taking its field's
    default; ValueError only for a field with neither."""
    try:
        return _record(cls, value, strict=False)
    except _Wrong as err:
        raise _error(where, err) from None


def _error(where: str, err: _Wrong) -> ValueError:
    """``where.field: expected ...``; with no ``where`` (the top of a file) the path alone."""
    path = f"{where}{err.path}" if where else err.path.removeprefix(".")
    return ValueError(f"{path or 'value'}: {err.expected}")


def _record(cls: type[T], value: object, strict: bool) -> T:
    if not isinstance(value, dict):
        raise _Wrong("expected an object")
    values: dict[str, object] = {}
    for f in _fields(cls):
        raw = value.get(f.key)
        if raw is None:
            if f.required:
                raise _Wrong(f"expected {_expected(f.type)}", f".{f.key}")
            if _optional(f.type):
                values[f.name] = None
            continue  # the field's default
        try:
            values[f.name] = _read_field(f, raw, strict)
        except _Wrong as err:
            if strict or f.required:
                raise _Wrong(err.expected, f".{f.key}{err.path}") from None
            if _optional(f.type):
                values[f.name] = None
    return cls(**values)


def _read_field(f: _Field, raw: object, strict: bool) -> object:
    if f.read is None:
        return _read(f.type, raw, strict, f.key)
    try:
        return f.read(raw)
    except ValueError as err:
        raise _Wrong(str(err)) from None


# The scalar readers are json_fields', so the codec and the hand-written readers agree on what
# a value is (a bool is never a number; an int in a float field reads as a float).
_SCALARS: dict[object, tuple[Callable[[object], object], str]] = {
    str: (jf.text, "expected a string"),
    bool: (jf.flag, "expected true or false"),
    int: (jf.integer, "expected an integer"),
    float: (jf.real, "expected a number"),
}


def _read(tp: Any, raw: object, strict: bool, name: str) -> object:
    """``raw`` read as ``tp`` (``name``: the field, for a Literal's error); _Wrong if it is not
    one. ``raw`` is never None here unless ``tp`` admits it."""
    origin = typing.get_origin(tp)
    if _is_union(tp):
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        if raw is None:
            return None
        if len(options) != 1:
            raise TypeError(f"the codec reads X | None, not {tp}")
        return _read(options[0], raw, strict, name)
    if tp in _SCALARS:
        reader, expected = _SCALARS[tp]
        found = reader(raw)
        if found is None:
            raise _Wrong(expected)
        return found
    if origin is Literal:
        found = jf.choice(raw, typing.get_args(tp))
        if found is None:
            choices = ", ".join(repr(a) for a in typing.get_args(tp))
            raise _Wrong(f"unknown {name} {raw!r} (expected one of {choices})")
        return found
    if origin is tuple:
        return tuple(_items(typing.get_args(tp)[0], raw, strict, name))
    if origin is list:
        return _items(typing.get_args(tp)[0], raw, strict, name)
    if origin in (Mapping, dict):
        return _table(typing.get_args(tp), raw, strict)
    if tp is Path:
        text = jf.text(raw)
        if text is None:
            raise _Wrong("expected a path")
        return Path(text)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(raw)
        except ValueError:
            raise _Wrong(f"unknown {name} {raw!r}") from None
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _record(tp, raw, strict)
    raise TypeError(f"the codec cannot read {tp}")


def _items(tp: Any, raw: object, strict: bool, name: str) -> list[object]:
    if not isinstance(raw, list):
        raise _Wrong("expected a list")
    out: list[object] = []
    for i, item in enumerate(raw):
        try:
            out.append(_read(tp, item, strict, name))
        except _Wrong as err:
            if strict:
                raise _Wrong(err.expected, f"[{i}]{err.path}") from None
    return out


def _table(args: tuple[Any, ...], raw: object, strict: bool) -> dict[object, object]:
    key_type, value_type = args
    if not isinstance(raw, dict):
        raise _Wrong("expected an object")
    out: dict[object, object] = {}
    for key, item in raw.items():
        try:
            name = _read(key_type, key, strict, "key")
        except _Wrong:
            if strict:
                raise
            continue
        try:
            out[name] = _read(value_type, item, strict, str(key))
        except _Wrong as err:
            if strict:
                raise _Wrong(err.expected, f".{key}{err.path}") from None
    return out


def _expected(tp: object) -> str:
    """What a missing required field should have been, in an error's words."""
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "one of " + ", ".join(repr(m.value) for m in tp)
    try:
        _read(tp, _MISSING, True, "")
    except _Wrong as err:
        return err.expected.removeprefix("expected ")
    return "a value"
