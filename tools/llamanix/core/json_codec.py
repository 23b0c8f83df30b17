"""A frozen dataclass to JSON and back, driven by its fields and their types.

``to_json`` writes a record as a ``JsonObject``: one key per field, in field order; a nested
dataclass is an object, a tuple a list, a Mapping an object, an Enum its value. A field that is
None is written as ``null``, except where its metadata is ``OMIT_NONE``
(``field(default=None, metadata=OMIT_NONE)``): then it is left out, so a file keeps the shape it
had when only some records carried it. ``metadata=json_key("other-name")`` names the key when
it differs from the field. A field whose JSON has another shape than its type (a list kept as
an object by name, say) names its own two functions: ``metadata=json_via(write, read)``.

More field metadata (they combine: ``{**OMIT_EMPTY, **json_key("x")}``):

- ``OMIT_EMPTY``: leave the key out when the value is empty (``()``, ``[]``, ``{}``, ``""``,
  ``False``, None).
- ``JSON_SKIP``: a field that is not part of the JSON (where a record was read from, a key it
  is kept under): never written, never read; the reader takes its default or the value the
  caller gives (``from_json(cls, value, where, name=...)``).
- ``json_default(value)``: what a reader takes when the value is missing (or, leniently, of
  the wrong type), for a field the constructor requires; ``of_key=f``: the default is
  ``f(key)`` of the key the record sits under in a table (an instance's unit, named for it);
  ``if_empty=True``: an empty string takes the default too.
- ``MUST_READ``: a value that is there must read, even leniently (a present table that is not
  one is an error, not the default), and a table or list of it keeps no item silently out;
  the items themselves are read as the rest of the record.
- ``JSON_INLINE``: a nested record whose keys sit beside the record's own (written merged in
  at the field's place, read from the same object).

And per class, ``json_shape: ClassVar[JsonShape]`` (read by ``to_json`` only):

- ``constants``: keys always written with the same value (``"format": 2``), before the
  fields unless ``order`` places them; never read.
- ``computed``: keys written from the record (a median of its runs), after the fields unless
  ``order`` places them; never read.
- ``order``: every key written, in the order written (fields, constants and computed keys).

A nested record that writes itself by hand (a ``to_json`` of its own) is written by it.

Two readers, as in ``json_fields``:

- ``from_json`` is strict: a field that is missing (without a default) or of the wrong type
  raises ValueError naming it (``where.field``, ``where.field[2]``), instead of a wrong number
  later. A field that is missing or null and has a default takes it, so a record an older
  version wrote (before the field existed) still reads; ``X | None`` reads null or nothing as
  None.
- ``from_json_lenient`` is for state files a killed command may have left half-written, and for
  records older versions wrote: a value that is missing or of the wrong type takes the field's
  default (None for ``X | None``); a list or table keeps the items of the right type. Only a
  field with neither a value nor a default is an error. ``from_json_or_none`` reads the same
  way and answers None for such a record (a record that says too little to be one).

A number is never read from ``true``/``false``, though Python counts a bool as an int; an int
in a ``float`` field reads as a float. Types understood: str, int, float, bool, None,
``Literal``, ``X | None``, ``tuple[X, ...]``, ``list[X]``, ``Mapping``/``dict`` with str or
Literal keys, ``Path`` (a string), Enums and nested dataclasses. The field types are resolved
once per class (``get_type_hints`` on first use, then cached), so importing this module costs
nothing.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import json
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal, Self, TypeVar, Union

from llamanix.core import json_fields as jf
from llamanix.core.json_value import JsonObject, JsonValue

T = TypeVar("T")

_KEY = "json"
_OMIT_NONE = "json_omit_none"
_WRITE = "json_write"
_READ = "json_read"
_OMIT_EMPTY = "json_omit_empty"
_SKIP = "json_skip"
_DEFAULT = "json_default"
_DEFAULT_OF_KEY = "json_default_of_key"
_DEFAULT_IF_EMPTY = "json_default_if_empty"
_MUST_READ = "json_must_read"
_INLINE = "json_inline"


OMIT_NONE: Mapping[str, object] = {_OMIT_NONE: True}
"""Field metadata: leave the key out when the value is None (``field(default=None,
metadata=OMIT_NONE)``)."""

OMIT_EMPTY: Mapping[str, object] = {_OMIT_EMPTY: True}
"""Field metadata: leave the key out when the value is empty (``()``, ``{}``, ``""``, False,
None)."""

JSON_SKIP: Mapping[str, object] = {_SKIP: True}
"""Field metadata: not part of the JSON; never written, never read (the reader takes the
field's default, ``json_default``'s, or what the caller gives)."""

MUST_READ: Mapping[str, object] = {_MUST_READ: True}
"""Field metadata: a value that is there must read, even leniently; a table or list of it
keeps no item silently out."""

JSON_INLINE: Mapping[str, object] = {_INLINE: True}
"""Field metadata: a nested record whose keys sit beside the record's own."""


def json_default(
    value: object = None,
    *,
    of_key: Callable[[str], object] | None = None,
    if_empty: bool = False,
) -> Mapping[str, object]:
    """Field metadata: the value a reader takes when the field is missing (or, leniently, of
    the wrong type). ``of_key``: the default is ``of_key(key)`` of the key the record sits
    under in a table. ``if_empty``: an empty string takes the default too."""
    return {_DEFAULT: value, _DEFAULT_OF_KEY: of_key, _DEFAULT_IF_EMPTY: if_empty}


@dataclasses.dataclass(frozen=True)
class JsonShape:
    """A class's keys beyond its fields (``json_shape: ClassVar[JsonShape]``), for writing:
    ``constants`` (first unless ``order`` says), ``computed`` from the record (last unless
    ``order`` says), and ``order``, every key written in the order written; ``omit_none``:
    the computed keys left out when None."""

    constants: Mapping[str, JsonValue] = dataclasses.field(default_factory=dict)
    computed: Mapping[str, Callable[[Any], object]] = dataclasses.field(default_factory=dict)
    order: tuple[str, ...] | None = None
    # Computed keys left out when None (a note only some records carry).
    omit_none: tuple[str, ...] = ()


def json_key(key: str, *, omit_none: bool = False) -> Mapping[str, object]:
    """Field metadata: the JSON key when it is not the field's name."""
    return {_KEY: key, _OMIT_NONE: omit_none}


def json_via(
    write: Callable[[Any], JsonValue] | None,
    read: Callable[[object], object] | None = None,
    *,
    key: str | None = None,
    omit_none: bool = False,
) -> Mapping[str, object]:
    """Field metadata: the field's JSON is ``write(value)``, read back by ``read(raw)`` (which
    raises ValueError when ``raw`` is not one); for a field whose JSON has another shape than
    its type. ``write`` None: written as any other field; ``read`` None: read as any other
    (a record only ever written). ``key``: the JSON key when it is not the field's name;
    ``omit_none`` as ``OMIT_NONE``."""
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
    omit_empty: bool = False
    skip: bool = False
    must_read: bool = False
    inline: bool = False
    # json_default: whether there is one, the value, or the function of the record's key.
    has_default: bool = False
    default: object = None
    default_of_key: Callable[[str], object] | None = None
    default_if_empty: bool = False

    def fallback(self, key: str | None) -> object:
        """json_default's value (a copy: a table or list is the record's own)."""
        if self.default_of_key is not None and key is not None:
            return self.default_of_key(key)
        return copy.copy(self.default)


_FIELDS: dict[type, tuple[_Field, ...]] = {}


def _fields(cls: type) -> tuple[_Field, ...]:
    """The class's fields with their types resolved, once per class."""
    found = _FIELDS.get(cls)
    if found is None:
        found = _FIELDS[cls] = _resolve(cls)
    return found


# The JSON aliases are strings (they name themselves): a field typed with one resolves only
# where they are known.
_ALIASES = {"JsonValue": JsonValue, "JsonObject": JsonObject}


def _resolve(cls: type) -> tuple[_Field, ...]:
    hints = typing.get_type_hints(cls, localns=_ALIASES)
    found = tuple(
        _Field(
            name=f.name,
            key=str(f.metadata.get(_KEY, f.name)),
            type=hints[f.name],
            required=f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
            and _DEFAULT not in f.metadata
            and not _optional(hints[f.name]),
            omit_none=bool(f.metadata.get(_OMIT_NONE, False)),
            write=f.metadata.get(_WRITE),
            read=f.metadata.get(_READ),
            omit_empty=bool(f.metadata.get(_OMIT_EMPTY, False)),
            skip=bool(f.metadata.get(_SKIP, False)),
            must_read=bool(f.metadata.get(_MUST_READ, False)),
            inline=bool(f.metadata.get(_INLINE, False)),
            has_default=_DEFAULT in f.metadata,
            default=f.metadata.get(_DEFAULT),
            default_of_key=f.metadata.get(_DEFAULT_OF_KEY),
            default_if_empty=bool(f.metadata.get(_DEFAULT_IF_EMPTY, False)),
        )
        for f in dataclasses.fields(cls)
        if f.init
    )
    shape = _shape(cls)
    if shape is not None and shape.order is not None:
        keys = [f.key for f in found if not f.skip and not f.inline]
        declared = [*keys, *shape.constants, *shape.computed]
        if sorted(declared) != sorted(shape.order):
            raise TypeError(f"{cls.__name__}.json_shape.order must name {sorted(declared)}")
    return found


def _shape(cls: type) -> JsonShape | None:
    found = getattr(cls, "json_shape", None)
    return found if isinstance(found, JsonShape) else None


def _optional(tp: object) -> bool:
    return _is_union(tp) and type(None) in typing.get_args(tp)


def _is_union(tp: object) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType)


class JsonRecord:
    """A base for a frozen dataclass that the codec writes and reads: ``record.to_json()`` and
    ``Record.from_json(value, where)`` (strict), without writing either by hand; as one line of
    JSON text, ``record.to_text()`` and ``Record.from_text(text, source)``."""

    __slots__ = ()
    json_shape: ClassVar[JsonShape | None] = None

    def to_json(self) -> JsonObject:
        return to_json(self)

    @classmethod
    def from_json(cls, value: object, where: str) -> Self:
        return from_json(cls, value, where)

    def to_text(self) -> str:
        """The record as one line of JSON (what goes over a pipe)."""
        return json.dumps(self.to_json())

    @classmethod
    def from_text(cls, text: str, source: str) -> Self:
        """The record in ``text``, one JSON value read strictly; ValueError naming ``source``
        and what is wrong."""
        try:
            data = json.loads(text)
        except ValueError as err:
            raise ValueError(f"{source}: not JSON: {err}") from None
        return from_json(cls, data, source)


# --- writing ---------------------------------------------------------------------------------


def to_json(record: object) -> JsonObject:
    """The record as a JSON object: its constants, its fields in order, its computed keys (or
    in its shape's ``order``)."""
    shape = _shape(type(record))
    out: JsonObject = {}
    if shape is not None:
        out.update(shape.constants)
    for f in _fields(type(record)):
        value = getattr(record, f.name)
        if f.skip or (value is None and f.omit_none):
            continue
        if f.omit_empty and (value is None or value is False or value in ("", (), [], {})):
            continue
        if f.inline:
            out.update(_record_json(value))
            continue
        out[f.key] = f.write(value) if f.write is not None else _value_json(value)
    if shape is not None:
        for key, compute in shape.computed.items():
            value = compute(record)
            if value is not None or key not in shape.omit_none:
                out[key] = _value_json(value)
        if shape.order is not None:
            return {k: out[k] for k in shape.order if k in out}
    return out


def _record_json(value: object) -> JsonObject:
    """A nested record: by its own ``to_json`` where it writes itself by hand."""
    own = getattr(type(value), "to_json", None)
    if own is not None and own is not JsonRecord.to_json:
        found = value.to_json()  # type: ignore[attr-defined]
        assert isinstance(found, dict)
        return found
    return to_json(value)


def _value_json(value: object) -> JsonValue:
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, enum.Enum):
        return _value_json(value.value)
    if isinstance(value, Path):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _record_json(value)
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


def from_json(cls: type[T], value: object, where: str, **given: object) -> T:
    """The record of type ``cls`` in ``value``; ValueError naming the field that is missing or
    of the wrong type. ``given``: the values of fields the JSON does not hold (``JSON_SKIP``)."""
    try:
        return _record(cls, value, strict=True, given=given)
    except _Wrong as err:
        raise _error(where, err) from None


def from_json_lenient(cls: type[T], value: object, where: str = "", **given: object) -> T:
    """The record of type ``cls`` in ``value``, a missing or ill-typed value taking its field's
    default; ValueError only for a field with neither. ``given`` as in ``from_json``."""
    try:
        return _record(cls, value, strict=False, given=given)
    except _Wrong as err:
        raise _error(where, err) from None


def from_json_or_none(cls: type[T], value: object, **given: object) -> T | None:
    """``from_json_lenient``'s record, or None where a field has neither a value nor a
    default (a record that says too little to be one)."""
    try:
        return _record(cls, value, strict=False, given=given)
    except _Wrong:
        return None


def _error(where: str, err: _Wrong) -> ValueError:
    """``where.field: expected ...``; with no ``where`` (the top of a file) the path alone."""
    path = f"{where}{err.path}" if where else err.path.removeprefix(".")
    return ValueError(f"{path or 'value'}: {err.expected}")


def _record(
    cls: type[T],
    value: object,
    strict: bool,
    given: Mapping[str, object] | None = None,
    key: str | None = None,
) -> T:
    """``key``: the key the record sits under in a table (for ``json_default(of_key=)``)."""
    if not isinstance(value, dict):
        raise _Wrong("expected an object")
    values: dict[str, object] = dict(given or {})
    for f in _fields(cls):
        if f.name in values:
            continue
        if f.skip:
            if f.has_default:
                values[f.name] = f.fallback(key)
            continue  # the field's default
        raw = value if f.inline else value.get(f.key)
        if f.default_if_empty and raw == "":
            raw = None
        if raw is None:
            if f.required:
                raise _Wrong(f"expected {_expected(f.type)}", f".{f.key}")
            if f.has_default:
                values[f.name] = f.fallback(key)
            elif _optional(f.type):
                values[f.name] = None
            continue  # the field's default
        try:
            values[f.name] = _read_field(f, raw, strict)
        except _Wrong as err:
            if strict or f.required or f.must_read:
                raise _Wrong(err.expected, f".{f.key}{err.path}") from None
            if f.has_default:
                values[f.name] = f.fallback(key)
            elif _optional(f.type):
                values[f.name] = None
    return cls(**values)


def _read_field(f: _Field, raw: object, strict: bool) -> object:
    if f.read is None:
        return _read(f.type, raw, strict, f.key, must=f.must_read)
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


def _read(tp: Any, raw: object, strict: bool, name: str, must: bool = False) -> object:
    """``raw`` read as ``tp`` (``name``: the field, for a Literal's error); _Wrong if it is not
    one. ``raw`` is never None here unless ``tp`` admits it. ``must``: a table or list keeps
    no item silently out (``MUST_READ``)."""
    origin = typing.get_origin(tp)
    if _is_union(tp):
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        if raw is None:
            return None
        if len(options) != 1:
            raise TypeError(f"the codec reads X | None, not {tp}")
        return _read(options[0], raw, strict, name, must)
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
        return tuple(_items(typing.get_args(tp)[0], raw, strict, name, must))
    if origin is list:
        return _items(typing.get_args(tp)[0], raw, strict, name, must)
    if origin in (Mapping, dict):
        return _table(typing.get_args(tp), raw, strict, must)
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


def _items(tp: Any, raw: object, strict: bool, name: str, must: bool = False) -> list[object]:
    if not isinstance(raw, list):
        raise _Wrong("expected a list")
    out: list[object] = []
    for i, item in enumerate(raw):
        try:
            out.append(_read(tp, item, strict, name))
        except _Wrong as err:
            if strict or must:
                raise _Wrong(err.expected, f"[{i}]{err.path}") from None
    return out


def _table(
    args: tuple[Any, ...], raw: object, strict: bool, must: bool = False
) -> dict[object, object]:
    key_type, value_type = args
    if not isinstance(raw, dict):
        raise _Wrong("expected an object")
    out: dict[object, object] = {}
    for key, item in raw.items():
        try:
            name = _read(key_type, key, strict, "key")
        except _Wrong:
            if strict or must:
                raise
            continue
        try:
            if isinstance(value_type, type) and dataclasses.is_dataclass(value_type):
                # The key the record sits under: some defaults are named for it.
                out[name] = _record(value_type, item, strict, key=str(key))
            else:
                out[name] = _read(value_type, item, strict, str(key))
        except _Wrong as err:
            if strict or must:
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
