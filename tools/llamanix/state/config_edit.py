"""Edits of llamanix.toml: the one read of the file a switch or rollback makes, ``--set
KEY=VALUE`` applied with tomlkit (comments and layout kept), the parse of an edited text
before anything is written, and the write itself, which keeps the file as its owner set it up
(through a symlink, its mode and owner kept)."""

from __future__ import annotations

import json
import os
import stat
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomlkit
import tomlkit.exceptions

from llamanix.config.model import Config, config_data, parse_config, read_config_text, suggest
from llamanix.core import file_reader
from llamanix.core.errors import Problem, UserError
from llamanix.external.files import rewrite


def _parse_value(text: str) -> Any:
    """A TOML value (3, 0.75, true, "x", ["a"]); anything else is taken as a bare string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except (tomllib.TOMLDecodeError, RecursionError, ValueError):
        # ValueError: an integer of more digits than Python converts. Nesting too deep for
        # the parser is no value either; the config's check names what the field wants.
        return text


_SET_EXAMPLE = "write e.g. --set instances.qwen.variant=ik"
# Tables of named entries: --set edits an entry that is there, never makes one up from a typo.
_NAMED = {"instances": "instance", "hosts": "host"}


def _key_parts(path: Path, item: str, key: str) -> list[str]:
    """KEY as TOML reads a dotted key: a name with a dot in it is quoted
    (``instances."a.b".variant``)."""
    parts: list[str] = []
    try:
        node: Any = tomllib.loads(f"{key} = 0")
    except (tomllib.TOMLDecodeError, RecursionError):
        node = None
    while isinstance(node, dict) and len(node) == 1:
        [(name, node)] = node.items()
        parts.append(name)
    if node != 0 or not parts:
        raise UserError(
            Problem(
                str(path),
                "--set",
                f"'{item}' is not KEY=VALUE with a TOML key",
                _SET_EXAMPLE + ', and quote a name with a dot: instances."a.b".variant=ik',
            )
        )
    return parts


def _as_text(path: Path, item: str) -> None:
    """Refuse what is not text: bytes that are not UTF-8 reach argv as lone surrogates, which
    the config file cannot hold (its write would fail after the dry run said yes)."""
    try:
        item.encode("utf-8")
    except UnicodeEncodeError:
        shown = item.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        raise UserError(
            Problem(
                str(path),
                "--set",
                f"'{shown}' is not UTF-8 text",
                "pass it as UTF-8 text",
            )
        ) from None


def _check_named(path: Path, data: Any, parts: list[str]) -> None:
    """``instances.NAME.KEY`` and ``hosts.NAME.KEY`` name an entry the config has."""
    kind = _NAMED.get(parts[0])
    if kind is None or len(parts) < 3:
        return
    table = data.get(parts[0]) if isinstance(data, Mapping) else None
    names: tuple[str, ...] = tuple(table) if isinstance(table, Mapping) else ()
    if parts[1] in names:
        return
    for end in range(len(parts) - 1, 2, -1):
        dotted = ".".join(parts[1:end])
        if dotted in names:
            quoted = ".".join([parts[0], json.dumps(dotted), *parts[end:]])
            fix = f"quote a name with a dot in it: {quoted}=..."
            raise UserError(
                Problem(str(path), "--set", f"no {kind} '{parts[1]}', but one '{dotted}'", fix)
            )
    known = suggest(parts[1], names) if names else f"the config has no {kind}"
    raise UserError(
        Problem(
            str(path),
            "--set",
            f"no {kind} '{parts[1]}' in this config ({known})",
            f"name one of its {parts[0]}, or add [{parts[0]}.{parts[1]}] to the file first",
        )
    )


def apply_sets(path: Path, text: str, sets: tuple[str, ...]) -> str:
    """The config text with each ``KEY.PATH=VALUE`` applied (comments and layout kept)."""
    if not sets:
        return text
    # The file as it is first, through the one reader's checks (nesting, a key twice, NUL),
    # which tomlkit's recursive parser does not make.
    data = config_data(text, str(path), path.suffix == ".json")
    edits: list[tuple[list[str], Any]] = []
    for item in sets:
        _as_text(path, item)
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UserError(Problem(str(path), "--set", f"'{item}' is not KEY=VALUE", _SET_EXAMPLE))
        parts, parsed = _key_parts(path, item, key.strip()), _parse_value(value.strip())
        if len(parts) + file_reader.depth(parsed) > file_reader.MAX_DEPTH:
            raise UserError(
                Problem(
                    str(path),
                    "--set",
                    f"{'.'.join(parts)}: nested more than {file_reader.MAX_DEPTH} levels deep",
                    "no config field nests that deep: give the value it takes",
                )
            )
        edits.append((parts, parsed))
    if path.suffix == ".json":
        for parts, value in edits:
            _check_named(path, data, parts)
            _assign(data, parts, value, path)
        return json.dumps(data, indent=2) + "\n"
    try:
        doc = tomlkit.parse(text)
    except tomlkit.exceptions.ParseError as err:
        raise UserError(Problem(str(path), "", f"TOML syntax error: {err}")) from None
    for parts, value in edits:
        _check_named(path, doc, parts)
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
    return parse_config(config_data(text, str(path), path.suffix == ".json"), str(path))


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
    except (OSError, ValueError):
        # The reader says why in one line (no such file, a loop of links, a NUL in the path).
        read_config_text(path)
        raise
    return ConfigText(path, read_config_text(path), stamp)


def lenient_parse(path: Path, text: str) -> Config | None:
    """``text`` parsed as the config at ``path``; None where it is not valid."""
    try:
        return parse_text(path, text)
    except UserError:
        return None


_KEEP_FIX = "run llamanix as the file's owner, or as root"


def rewrite_problem(path: Path) -> Problem | None:
    """Why this process could not write the config at ``path`` with its mode and owner kept
    (``write_config``), or None: checked before a switch changes anything."""
    target = Path(os.path.realpath(path))
    try:
        st = os.stat(target)
    except OSError as err:
        return Problem(str(path), "", f"cannot read it ({err.strerror})", "check the path")
    shown = f"{path} (a link to {target})" if path.is_symlink() else str(path)
    if not os.access(target.parent, os.W_OK | os.X_OK):
        return Problem(
            str(path),
            "",
            f"cannot write {shown}: its directory {target.parent} is not writable here",
            _KEEP_FIX,
        )
    if os.geteuid() == 0:
        return None
    if st.st_uid != os.geteuid():
        return Problem(
            str(path),
            "",
            f"{shown} belongs to uid {st.st_uid}: written as uid {os.geteuid()}, it would "
            "change owners",
            _KEEP_FIX,
        )
    if st.st_gid not in {os.getegid(), *os.getgroups()}:
        return Problem(
            str(path),
            "",
            f"{shown} has group {st.st_gid}, which uid {os.geteuid()} is not in: written "
            "here, it would change groups",
            _KEEP_FIX,
        )
    return None


def write_config(path: Path, text: str) -> None:
    """Write a switch's or rollback's text to the config at ``path`` atomically, as its owner
    set it up: through a symlink to its target, with its mode and owner (a 0600 file stays
    0600). One line, with nothing written, where that cannot be done."""
    try:
        rewrite(path, text)
    except OSError as err:
        found = rewrite_problem(path)
        raise UserError(
            found or Problem(str(path), "", f"cannot write it ({err.strerror})", _KEEP_FIX)
        ) from None


def config_mode(path: Path) -> int:
    """The config file's permission bits, for its copies (a generation's snapshot): no
    copy is readable by more users than the file is."""
    return stat.S_IMODE(os.stat(path).st_mode) & 0o666
