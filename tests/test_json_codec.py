"""core/json_codec: a frozen dataclass to JSON and back, strict and lenient."""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

import pytest
from recorded_help import UPSTREAM, recorded

from llamanix.core import json_codec
from llamanix.core.json_codec import OMIT_NONE, JsonRecord, JsonShape, json_key, json_via
from llamanix.core.json_value import JsonObject
from llamanix.core.probe import Capabilities
from llamanix.render.manifest import Manifest, ManifestInstance, unit_name

Colour = Literal["red", "green"]


class Size(enum.Enum):
    SMALL = "s"
    LARGE = "l"


@dataclass(frozen=True)
class Point(JsonRecord):
    x: int
    y: float
    label: str | None = None


@dataclass(frozen=True)
class Shape(JsonRecord):
    name: str
    colour: Colour
    points: tuple[Point, ...]
    tags: Mapping[str, str]
    size: Size
    closed: bool = False
    centre: Point | None = None
    note: str | None = field(default=None, metadata=OMIT_NONE)
    by_colour: Mapping[Colour, tuple[int, ...]] = field(default_factory=dict)
    line_width: float = field(default=1.0, metadata=json_key("line-width"))


SHAPE = Shape(
    name="tri",
    colour="green",
    points=(Point(0, 0.5), Point(3, 4.0, "top")),
    tags={"by": "hand"},
    size=Size.LARGE,
    centre=Point(1, 1.5),
    by_colour={"red": (1, 2)},
    line_width=2.5,
)


def test_a_nested_record_goes_round_and_comes_back_equal() -> None:
    written = SHAPE.to_json()
    # Field order is key order; None is null unless the field says to leave it out; a renamed
    # field is written under its key.
    assert list(written) == [
        "name",
        "colour",
        "points",
        "tags",
        "size",
        "closed",
        "centre",
        "by_colour",
        "line-width",
    ]
    assert written["points"] == [
        {"x": 0, "y": 0.5, "label": None},
        {"x": 3, "y": 4.0, "label": "top"},
    ]
    assert written["size"] == "l" and written["by_colour"] == {"red": [1, 2]}
    text = json.dumps(written)
    back = Shape.from_json(json.loads(text), "shape")
    assert back == SHAPE and json.dumps(back.to_json()) == text
    noted = Shape.from_json({**written, "note": "n"}, "shape")
    assert noted.note == "n" and noted.to_json()["note"] == "n"


def test_a_strict_read_names_the_field_that_is_wrong() -> None:
    written = json.loads(json.dumps(SHAPE.to_json()))

    def error(data: object) -> str:
        with pytest.raises(ValueError) as err:
            Shape.from_json(data, "shape")
        return str(err.value)

    assert error({**written, "points": [{"x": 0, "y": 1}, {"x": "3", "y": 1}]}) == (
        "shape.points[1].x: expected an integer"
    )
    assert error({k: v for k, v in written.items() if k != "name"}) == (
        "shape.name: expected a string"
    )
    assert error({**written, "centre": {"x": 1, "y": True}}) == "shape.centre.y: expected a number"
    assert error({**written, "colour": "blue"}) == (
        "shape.colour: unknown colour 'blue' (expected one of 'red', 'green')"
    )
    assert error({**written, "tags": {"by": 1}}) == "shape.tags.by: expected a string"
    assert error({**written, "closed": "yes"}) == "shape.closed: expected true or false"
    assert error({**written, "by_colour": {"blue": [1]}}).startswith("shape.by_colour: unknown")
    assert error([]) == "shape: expected an object"
    assert error({k: v for k, v in written.items() if k != "size"}) == (
        "shape.size: expected one of 's', 'l'"
    )
    # A field added later, with a default, may be missing from a record written before it.
    older = {k: v for k, v in written.items() if k not in ("closed", "by_colour", "line-width")}
    assert Shape.from_json(older, "shape") == Shape(
        "tri", "green", SHAPE.points, SHAPE.tags, Size.LARGE, centre=SHAPE.centre
    )


def test_a_lenient_read_takes_defaults_for_what_is_missing_or_wrong() -> None:
    found = json_codec.from_json_lenient(
        Shape,
        {
            "name": "sq",
            "colour": "red",
            "points": [{"x": 1, "y": 2}, "not a point", {"x": "bad", "y": 0}],
            "tags": {"ok": "yes", "bad": 3},
            "size": "s",
            "closed": "maybe",
            "centre": "nowhere",
            "by_colour": {"purple": [1], "green": [1, "two", 3]},
        },
        "shape",
    )
    assert found == Shape(
        "sq",
        "red",
        (Point(1, 2.0),),
        {"ok": "yes"},
        Size.SMALL,
        closed=False,
        centre=None,
        by_colour={"green": (1, 3)},
    )
    with pytest.raises(ValueError, match=r"^shape\.name: expected a string$"):
        json_codec.from_json_lenient(Shape, {"name": 3}, "shape")


def test_an_older_probe_file_reads_with_the_newer_fields_at_their_defaults() -> None:
    """A probe file written before the dialect, the V cache types and the chain spelling were
    recorded, read back: the newer fields take their defaults, the rest is as written."""
    probed = recorded(UPSTREAM)
    written = probed.to_json()
    assert "source" not in written
    older = {
        k: v
        for k, v in written.items()
        if k not in ("dialect", "dialect_guess", "cache_types_v", "spec_chain")
    }
    found = json_codec.from_json_lenient(
        Capabilities, json.loads(json.dumps(older)), "old.json", source="old.json"
    )
    assert found.source == "old.json" and found.flags == probed.flags
    assert found.dialect is None and found.cache_types_v == [] and found.spec_chain is None
    again = json_codec.from_json_lenient(Capabilities, json.loads(json.dumps(written)))
    assert again.to_json() == written


def test_a_manifest_entry_reads_leniently_and_writes_back_as_it_was() -> None:
    data = {"argv": ["llama-server", 7], "port": "8080", "gpu": True, "environment": []}
    entry = Manifest.parse(json.dumps({"kind": "systemd", "instances": {"chat": data}})).instances[
        "chat"
    ]
    assert entry == ManifestInstance(unit=unit_name("chat"), argv=("llama-server",), gpu=True)
    text = json.dumps(
        {
            "config_hash": "abc",
            "host": "h",
            "kind": "systemd",
            "instances": {"chat": json_codec.to_json(entry)},
        },
        indent=2,
    )
    assert Manifest.parse(text).text() == text + "\n"


def _named_json(points: tuple[Point, ...]) -> dict[str, object]:
    return {p.label or "?": {"x": p.x, "y": p.y} for p in points}


def _named_from_json(data: object) -> tuple[Point, ...]:
    if not isinstance(data, dict):
        raise ValueError("expected an object of points by name")
    return tuple(Point.from_json({**v, "label": k}, k) for k, v in data.items())


@dataclass(frozen=True)
class Drawing(JsonRecord):
    where: Path
    # Kept as an object by label: its JSON has another shape than its type.
    marks: tuple[Point, ...] = field(
        default=(), metadata=json_via(_named_json, _named_from_json, key="by_label")
    )
    spare: Path | None = None


def test_a_path_and_a_field_with_its_own_shape_go_round() -> None:
    drawing = Drawing(Path("/srv/x"), (Point(1, 2.0, "a"), Point(3, 4.0, "b")))
    written = drawing.to_json()
    assert written == {
        "where": "/srv/x",
        "by_label": {"a": {"x": 1, "y": 2.0}, "b": {"x": 3, "y": 4.0}},
        "spare": None,
    }
    assert Drawing.from_json(json.loads(json.dumps(written)), "d") == drawing
    with pytest.raises(ValueError, match=r"^d\.by_label: expected an object of points by name$"):
        Drawing.from_json({"where": "/x", "by_label": [1]}, "d")
    with pytest.raises(ValueError, match=r"^d\.where: expected a path$"):
        Drawing.from_json({"where": 3}, "d")
    # Leniently, a field its reader refuses takes its default.
    lenient = json_codec.from_json_lenient(Drawing, {"where": "/x", "by_label": [1]})
    assert lenient == Drawing(Path("/x"))


# --- the extensions: shapes beyond one key per field ------------------------------------------


@dataclass(frozen=True)
class Run(JsonRecord):
    """A record with keys no field holds: a constant first, a computed key placed by order."""

    samples: tuple[float, ...]
    label: str = field(default="", metadata=json_codec.OMIT_EMPTY)
    tags: tuple[str, ...] = field(default=(), metadata=json_codec.OMIT_EMPTY)
    source: str = field(default="", metadata=json_codec.JSON_SKIP)

    json_shape: ClassVar[JsonShape] = JsonShape(
        constants={"format": 2},
        computed={"total": lambda r: sum(r.samples)},
        order=("format", "total", "samples", "label", "tags"),
    )


def test_constant_and_computed_keys_are_written_in_order_and_never_read() -> None:
    run = Run((1.0, 2.5), "x", source="a.json")
    assert list(run.to_json().items()) == [
        ("format", 2),
        ("total", 3.5),
        ("samples", [1.0, 2.5]),
        ("label", "x"),
    ]
    # Read back: the constant and the computed key are not fields; the skipped field is given.
    back = json_codec.from_json(Run, {**run.to_json(), "total": 99}, "run", source="a.json")
    assert back == run
    assert Run.from_json(run.to_json(), "run").source == ""
    # Without an order: constants first, then the fields, then the computed keys.

    @dataclass(frozen=True)
    class Loose(JsonRecord):
        n: int
        json_shape: ClassVar[JsonShape] = JsonShape(
            constants={"format": 1}, computed={"twice": lambda r: 2 * r.n}
        )

    assert list(Loose(3).to_json()) == ["format", "n", "twice"]


def test_an_order_that_leaves_out_a_key_is_refused() -> None:
    @dataclass(frozen=True)
    class Bad(JsonRecord):
        a: int
        b: int
        json_shape: ClassVar[JsonShape] = JsonShape(order=("a",))

    with pytest.raises(TypeError, match="must name"):
        Bad(1, 2).to_json()


def test_omit_empty_leaves_out_empty_values_only() -> None:
    assert Run((1.0,)).to_json() == {"format": 2, "total": 1.0, "samples": [1.0]}
    assert Run((1.0,), tags=("t",)).to_json()["tags"] == ["t"]


@dataclass(frozen=True)
class Entry(JsonRecord):
    # Named for the key the entry sits under, where the entry does not say (or says "").
    unit: str = field(
        metadata=json_codec.json_default(of_key=lambda k: f"{k}.service", if_empty=True)
    )
    listen: str = field(metadata=json_codec.json_default("127.0.0.1"))
    ok: bool = field(metadata=json_codec.json_default(True))
    port: int | None = None


@dataclass(frozen=True)
class Table(JsonRecord):
    kind: Literal["a", "b"]
    entries: Mapping[str, Entry] = field(metadata=json_codec.MUST_READ)
    extra: Entry | None = field(default=None, metadata={**OMIT_NONE, **json_codec.MUST_READ})
    loose: Mapping[str, Entry] = field(default_factory=dict)


def test_reading_defaults_match_what_is_missing_or_wrong() -> None:
    found = json_codec.from_json_lenient(
        Table,
        {
            "kind": "a",
            "entries": {"x": {}, "y": {"unit": "", "listen": 3, "ok": "no"}, "z": {"unit": "u"}},
        },
    )
    assert found.entries == {
        "x": Entry("x.service", "127.0.0.1", True),
        "y": Entry("y.service", "127.0.0.1", True),
        "z": Entry("u", "127.0.0.1", True),
    }
    # Strictly, a wrong type is still an error; a missing value takes the reading default.
    with pytest.raises(ValueError, match=r"^t\.entries\.y\.ok: expected true or false$"):
        Table.from_json({"kind": "a", "entries": {"y": {"ok": "no"}}}, "t")
    assert Table.from_json({"kind": "b", "entries": {"y": {}}}, "t").entries["y"].ok is True


def test_what_must_read_is_refused_even_leniently() -> None:
    def lenient(data: object) -> Table:
        return json_codec.from_json_lenient(Table, data, "t")

    # A table keeps no entry silently out, and a present record must be one.
    with pytest.raises(ValueError, match=r"^t\.entries\.x: expected an object$"):
        lenient({"kind": "a", "entries": {"x": 1}})
    with pytest.raises(ValueError, match=r"^t\.entries: expected an object$"):
        lenient({"kind": "a", "entries": []})
    with pytest.raises(ValueError, match=r"^t\.extra: expected an object$"):
        lenient({"kind": "a", "entries": {}, "extra": "x"})
    # Absent or null, it is None; a field without MUST_READ stays lenient.
    assert lenient({"kind": "a", "entries": {}, "extra": None, "loose": {"x": 1}}) == Table("a", {})


def test_from_json_or_none_answers_none_for_a_record_that_says_too_little() -> None:
    assert json_codec.from_json_or_none(Table, {"kind": "c", "entries": {}}) is None
    assert json_codec.from_json_or_none(Table, None) is None
    assert json_codec.from_json_or_none(Table, {"kind": "a", "entries": {}}) == Table("a", {})


@dataclass(frozen=True)
class Inner(JsonRecord):
    date: str | None = None
    note: str | None = field(default=None, metadata=OMIT_NONE)


@dataclass(frozen=True)
class Row:
    number: int
    # Its keys sit beside the row's own.
    inner: Inner = field(metadata=json_codec.JSON_INLINE)
    hand: Point | None = None


class HandWritten(Point):
    def to_json(self) -> dict[str, object]:  # type: ignore[override]
        return {"by": "hand"}


def test_an_inline_record_and_a_nested_record_that_writes_itself() -> None:
    row = Row(2, Inner("d", "n"), HandWritten(1, 2.0))
    assert list(json_codec.to_json(row).items()) == [
        ("number", 2),
        ("date", "d"),
        ("note", "n"),
        ("hand", {"by": "hand"}),
    ]
    back = json_codec.from_json_lenient(Row, {"number": 2, "date": "d", "hand": {"x": 1, "y": 2}})
    assert back == Row(2, Inner("d"), Point(1, 2.0))


def test_a_field_read_by_its_own_function_is_written_as_any_other() -> None:
    def runs(raw: object) -> tuple[float, ...]:
        if not isinstance(raw, list) or not raw:
            raise ValueError("expected runs")
        return tuple(raw)

    @dataclass(frozen=True)
    class Runs(JsonRecord):
        samples: tuple[float, ...] = field(metadata=json_via(None, runs))

    assert Runs((1, 2.5)).to_json() == {"samples": [1, 2.5]}
    assert json_codec.from_json_lenient(Runs, {"samples": [3, 4.5]}) == Runs((3, 4.5))
    assert json_codec.from_json_or_none(Runs, {"samples": []}) is None


@dataclass(frozen=True)
class Free(JsonRecord):
    """A field typed with the JSON alias (a string that names itself) resolves."""

    gpu: JsonObject = field(default_factory=dict)


def test_a_field_of_free_json_is_written_as_it_is() -> None:
    assert Free({"name": "g", "l": [1, None]}).to_json() == {"gpu": {"name": "g", "l": [1, None]}}


def test_a_record_as_one_line_of_text_goes_round_and_bad_text_is_named() -> None:
    """``to_text``/``from_text``: what the fleet's orders and requests travel as on stdin."""
    text = SHAPE.to_text()
    assert "\n" not in text and json.loads(text) == SHAPE.to_json()
    assert Shape.from_text(text, "stdin") == SHAPE
    with pytest.raises(ValueError, match=r"^stdin: not JSON: "):
        Shape.from_text("{not json", "stdin")
    with pytest.raises(ValueError, match=r"stdin\.colour"):
        Shape.from_text(json.dumps({**SHAPE.to_json(), "colour": "blue"}), "stdin")
