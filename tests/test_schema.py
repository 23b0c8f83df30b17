"""The places that must agree with the schema (schema.py) do."""

from __future__ import annotations

import json
import types
import typing
from importlib import resources
from pathlib import Path

import pytest

from llamanix.config import model
from llamanix.core import schema
from llamanix.core.gpus import load_gpus
from llamanix.core.variants import VARIANTS

ROOT = Path(__file__).resolve().parent.parent


def test_schema_json_is_current() -> None:
    # The NixOS module builds its options from this file: regenerate with
    # `llamanix schema --json > tools/llamanix/data/schema.json`.
    shipped = resources.files("llamanix").joinpath("data/schema.json").read_text()
    assert json.loads(shipped) == schema.schema_json()


def test_config_reference_is_current() -> None:
    # Regenerate with `llamanix schema --markdown` and paste between the markers.
    readme = (ROOT / "docs/configuration.md").read_text()
    begin, end = "<!-- schema:begin -->\n", "<!-- schema:end -->"
    assert readme[readme.index(begin) + len(begin) : readme.index(end)].strip() == (
        schema.schema_markdown().strip()
    )


def test_variant_enum_matches_the_registry() -> None:
    assert set(schema.INSTANCE["variant"].values) == set(VARIANTS)


def test_gpu_table_entries_are_complete() -> None:
    gpus = load_gpus()
    for name in (
        "rtx3090",
        "rtx3090ti",
        "rtx4090",
        "rtx5090",
        "a100-40gb",
        "a100-80gb",
        "h100-pcie",
        "h100-sxm",
        "h200",
        "l40s",
        "b200",
    ):
        gpu = gpus[name]
        assert gpu.bandwidth_gb_s > 0 and gpu.memory_gib > 0
        assert gpu.compute_capability.replace(".", "").isdigit()
    text = resources.files("llamanix").joinpath("data/gpus.toml").read_text()
    # Every entry cites where its numbers come from.
    for block in text.split("\n[")[1:]:
        assert "\n# " in block, block.splitlines()[0]


def test_every_number_has_both_bounds() -> None:
    """A value no machine could use (an extra digit, a byte count) is refused, never rendered."""
    tables = (
        schema.HOST_FIELDS,
        schema.ROUTER_FIELDS,
        schema.GATEWAY_FIELDS,
        schema.INSTANCE_FIELDS,
        schema.SPECULATIVE_FIELDS,
    )
    numeric = [f for t in tables for f in t if f.kind in (schema.INT, schema.FLOAT, schema.LAYERS)]
    assert len(numeric) == 22
    for f in numeric:
        assert f.minimum is not None and f.maximum is not None, f.name
        if f.kind != schema.FLOAT:
            assert isinstance(f.minimum, int) and isinstance(f.maximum, int), f.name


# What the parser's check gives for a value of each kind (config.model's _Checker.value).
_CHECKED = {
    schema.STR: ("text",),
    schema.PATH: ("/abs/path",),
    schema.INT: (1,),
    schema.FLOAT: (0.5,),
    schema.BOOL: (True,),
    schema.LAYERS: (1, "all", "auto"),
    schema.LIST_STR: (("a", "b"),),
    schema.DICT_STR: ({"A": "b"},),
}


def _admits(annotation: object, value: object) -> bool:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None):
        return value is None
    if origin in (typing.Union, types.UnionType):
        return any(_admits(a, value) for a in args)
    if origin is typing.Literal:
        return value in args
    if origin is tuple:
        return isinstance(value, tuple) and all(_admits(args[0], v) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(
            _admits(args[0], k) and _admits(args[1], v) for k, v in value.items()
        )
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    assert isinstance(annotation, type), annotation
    return isinstance(value, annotation)


@pytest.mark.parametrize(
    ("fields", "record", "renamed"),
    [
        (schema.ROUTER_FIELDS, model.Router, {}),
        (schema.GATEWAY_FIELDS, model.Gateway, {}),
        (schema.METRICS_FIELDS, model.Metrics, {}),
        (schema.INSTANCE_FIELDS, model.Instance, {}),
        (schema.SPECULATIVE_FIELDS, model.Speculative, {"type": "types"}),
    ],
)
def test_each_field_fits_the_record_it_fills(
    fields: tuple[schema.Field, ...], record: type, renamed: dict[str, str]
) -> None:
    """The parser builds these records from checked values by name, where mypy cannot see
    the schema: every value a field's check gives fits the record field's annotation."""
    hints = typing.get_type_hints(record, vars(model))
    for f in fields:
        name = renamed.get(f.name, f.name)
        assert name in hints, f"{record.__name__} has no field {name}"
        if f.kind == schema.ENUM:
            values: tuple[object, ...] = f.values
        elif f.kind == schema.ENUM_LIST:
            values = tuple((v,) for v in f.values)
        else:
            values = _CHECKED[f.kind]
        for value in values:
            assert _admits(hints[name], value), (record.__name__, name, value)
