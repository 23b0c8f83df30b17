"""The config's string types (core/types.py) are one declaration read by two engines: validate
(Python's re) and the NixOS module's option types (nix/schema-options.nix, builtins.match). They
agree on every type's good and bad values and on generated strings, and the schema declares a
type for every string field."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llamanix.core import schema
from llamanix.core.types import TYPES, child_name, text_problem

ROOT = Path(__file__).resolve().parent.parent
needs_nix = pytest.mark.skipif(shutil.which("nix-instantiate") is None, reason="needs Nix")


def nix_verdicts(cases: list[tuple[str, str]], tmp: Path) -> list[bool]:
    """What the module's own check (schemaOptions.textOk) says of each (type, value)."""
    data = tmp / "cases.json"
    data.write_text(json.dumps([{"kind": k, "value": v} for k, v in cases]))
    expr = f"""
      let
        lib = import {ROOT}/tests/nix/stub-lib.nix;
        options = import {ROOT}/nix/schema-options.nix {{ inherit lib; }};
      in map (c: options.textOk c.kind c.value) (builtins.fromJSON (builtins.readFile {data}))
    """
    done = subprocess.run(
        ["nix-instantiate", "--eval", "--strict", "--json", "-E", expr],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    verdicts = json.loads(done.stdout)
    assert len(verdicts) == len(cases)
    return [bool(v) for v in verdicts]


def python_verdicts(cases: list[tuple[str, str]]) -> list[bool]:
    return [text_problem(k, v) is None for k, v in cases]  # type: ignore[arg-type]


def test_each_type_takes_its_good_values_and_refuses_its_bad_ones() -> None:
    for kind, t in TYPES.items():
        for value in t.good:
            assert text_problem(kind, value) is None, (kind, value)
        for value in t.bad:
            assert text_problem(kind, value) is not None, (kind, value)
        assert t.good and t.bad, f"{kind}: give good and bad values"


@needs_nix
def test_nix_and_python_agree_on_the_table(tmp_path: Path) -> None:
    # Nix strings cannot hold a NUL: the table's NUL cases are Python's alone.
    cases = [(k, v) for k, t in TYPES.items() for v in (*t.good, *t.bad) if "\x00" not in v]
    assert nix_verdicts(cases, tmp_path) == python_verdicts(cases)


NASTY = st.sampled_from([
    "\n", "\t", "\x1b", "\x7f", '"', "'", "\\", "%", "$", "`", "..", "/", ".", " ", ";", "#",
    "[", "]", ":", "@", "-", "_", "é", "\u2028", "a", "Z", "0", "9", "::", "1.2", "x.y",
])  # fmt: skip


@needs_nix
def test_nix_and_python_agree_on_generated_strings(tmp_path: Path) -> None:
    """One nix-instantiate call over a fixed, derandomized batch of generated strings."""
    batch: list[tuple[str, str]] = []

    @settings(
        max_examples=300,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(kind=st.sampled_from(sorted(TYPES)), parts=st.lists(NASTY, max_size=8))
    def collect(kind: str, parts: list[str]) -> None:
        batch.append((kind, "".join(parts)))

    collect()
    for kind, t in TYPES.items():  # each type's good values with a piece put in
        batch += [(kind, g[:1] + p + g[1:]) for g in t.good for p in ("..", "\n", " ", "/")]
    nix, python = nix_verdicts(batch, tmp_path), python_verdicts(batch)
    differ = [(c, n, p) for c, n, p in zip(batch, nix, python, strict=True) if n != p]
    assert not differ, differ[:10]


def test_every_string_field_declares_a_type() -> None:
    for fields in (
        schema.HOST_FIELDS,
        schema.ROUTER_FIELDS,
        schema.GATEWAY_FIELDS,
        schema.METRICS_FIELDS,
        schema.INSTANCE_FIELDS,
        schema.SPECULATIVE_FIELDS,
    ):
        for f in fields:
            if f.kind in (schema.STR, schema.PATH, schema.LIST_STR, schema.DICT_STR):
                assert f.text in TYPES, f.name
            if f.kind == schema.DICT_STR:
                assert f.keys in TYPES, f.name
    # A field without one is refused when the schema module loads.
    with pytest.raises(AssertionError, match="no declared text type"):
        schema.Field("new", schema.STR, "a field someone adds")


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "../x", "a\nb", "x" * 256])
def test_a_path_made_from_a_name_stays_in_its_directory(name: str) -> None:
    with pytest.raises(ValueError, match="not a file name inside its directory"):
        child_name(name)
    assert child_name("llamanix-chat.service") == "llamanix-chat.service"
