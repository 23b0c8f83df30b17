"""Edits of llamanix.toml: the one read of the file a switch or rollback makes, ``--set
KEY=VALUE`` applied with tomlkit (comments and layout kept), and the parse of an edited text
before anything is written."""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomlkit
import tomlkit.exceptions

from llamanix.core.config import Config, parse_config
from llamanix.core.errors import Problem, UserError


def _parse_value(text: str) -> Any:
    """A TOML value (3, 0.75, true, "x", ["a"]); anything else is taken as a bare string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_sets(path: Path, text: str, sets: tuple[str, ...]) -> str:
    """The config text with each ``KEY.PATH=VALUE`` applied (comments and layout kept)."""
    if not sets:
        return text
    edits: list[tuple[list[str], Any]] = []
    for item in sets:
        key, sep, value = item.partition("=")
        parts = key.strip().split(".")
        if not sep or not all(parts):
            raise UserError(
                Problem(
                    str(path),
                    "--set",
                    f"'{item}' is not KEY=VALUE",
                    "write e.g. --set instances.qwen.variant=ik",
                )
            )
        edits.append((parts, _parse_value(value.strip())))
    if path.suffix == ".json":
        data = json.loads(text)
        for parts, value in edits:
            _assign(data, parts, value, path)
        return json.dumps(data, indent=2) + "\n"
    try:
        doc = tomlkit.parse(text)
    except tomlkit.exceptions.ParseError as err:
        raise UserError(Problem(str(path), "", f"TOML syntax error: {err}")) from None
    for parts, value in edits:
        _assign(doc, parts, value, path)
    return tomlkit.dumps(doc)


def _assign(container: Any, parts: list[str], value: Any, path: Path) -> None:
    node = container
    for i, part in enumerate(parts[:-1]):
        if part not in node:
            node[part] = tomlkit.table() if not isinstance(container, dict) else {}
        node = node[part]
        if not hasattr(node, "__setitem__") or isinstance(node, str | list):
            where = ".".join(parts[: i + 1])
            raise UserError(
                Problem(
                    str(path),
                    "--set",
                    f"{where} is not a table",
                    "set a key inside a table, e.g. instances.NAME.KEY=VALUE",
                )
            )
    node[parts[-1]] = value


def parse_text(path: Path, text: str) -> Config:
    """Validate a (changed) config text as if it were the file."""
    try:
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as err:
        raise UserError(Problem(str(path), "", f"syntax error: {err}")) from None
    return parse_config(data, str(path))


# What identifies one state of a file without reading it: device, inode, size, and the
# modification and change times in nanoseconds.
FileStamp = tuple[int, int, int, int, int]


def _stamp(path: Path) -> FileStamp:
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclass(frozen=True)
class ConfigText:
    """The config file's text as one read found it, and the file's stamp at that read."""

    path: Path
    text: str
    stamp: FileStamp

    def unchanged(self) -> bool:
        """Whether the file still holds ``text``. llamanix writes a config only by an atomic
        rename (a new inode), so a switch or rollback that wrote it since always shows; an
        editor's write in place changes the size or the times."""
        try:
            return _stamp(self.path) == self.stamp
        except OSError:
            return False


def read_config(path: Path) -> ConfigText:
    """The one read of the config file that a switch or rollback makes."""
    try:
        # The stamp first: a write between the two then reads as a change (a second read),
        # never as a text that is not the file's.
        stamp = _stamp(path)
        text = path.read_text()
    except FileNotFoundError:
        raise UserError(Problem(str(path), "", "no such file", "check the path")) from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as err:
        raise UserError(Problem(str(path), "", f"cannot read: {err}")) from None
    return ConfigText(path, text, stamp)


def lenient_parse(path: Path, text: str) -> Config | None:
    """``text`` parsed as the config at ``path``; None where it is not valid."""
    try:
        return parse_text(path, text)
    except UserError:
        return None
