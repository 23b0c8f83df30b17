"""Writers for the files llamanix renders besides units: INI (llama-server's router presets),
YAML (llama-swap's config), JSON (LiteLLM's config, manifests, argv files).

Each quotes what its format can quote and refuses what it cannot, so that a file parses back to
the values it was given (tests/test_boundary.py reads each one back with configparser,
yaml.safe_load and json). A value a config carries is typed before it gets here (core.types);
these writers are the second line, for every value, whatever its source.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence

from llamanix.core.errors import one_line
from llamanix.core.json_value import JsonValue


class FormatError(ValueError):
    """A value this format cannot hold as it is; the message says why, in a clause."""


def comment_lines(prefix: str, lines: Sequence[str]) -> list[str]:
    """Comment lines (``#`` or ``;``): each on one line, whatever a name or a path held."""
    return [f"{prefix} {one_line(line)}".rstrip() for line in lines]


# --- JSON (and YAML that is JSON) ------------------------------------------------------------


def json_text(data: JsonValue) -> str:
    """JSON, ASCII only: every character outside ASCII escaped, so nothing can end a line."""
    return json.dumps(data, indent=2, ensure_ascii=True) + "\n"


def yaml_scalar(value: str | int | float | bool) -> str:
    """A YAML scalar: a JSON number or boolean, or a double-quoted string in ASCII. YAML's
    escapes are JSON's but for characters beyond 16 bits, which YAML writes as one \\U
    escape where JSON writes a surrogate pair (a YAML reader would keep two lone halves)."""
    if not isinstance(value, str):
        return json.dumps(value)
    text = json.dumps(value, ensure_ascii=False)
    return "".join(_yaml_escape(ch) for ch in text)


def _yaml_escape(ch: str) -> str:
    code = ord(ch)
    if 0x20 <= code < 0x7F:
        return ch
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


# Keys left bare: identifiers that no YAML reader takes for anything but a string (YAML 1.1
# reads yes/no/on/off/y/n as booleans).
_BARE_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_YAML_WORDS = {"y", "n", "yes", "no", "on", "off", "true", "false", "null"}


def yaml_key(key: str) -> str:
    if _BARE_KEY.fullmatch(key) and key.lower() not in _YAML_WORDS:
        return key
    return yaml_scalar(key)


def yaml_block(data: Mapping[str, JsonValue], indent: int = 0) -> list[str]:
    """A mapping as YAML block lines: keys and scalars double-quoted (JSON), lists as ``-``
    items; a YAML reader gets back exactly ``data``."""
    pad = " " * indent
    out: list[str] = []
    for key, value in data.items():
        if isinstance(value, Mapping):
            out.append(f"{pad}{yaml_key(key)}:" + ("" if value else " {}"))
            out += yaml_block(value, indent + 2)
        elif isinstance(value, list):
            out.append(f"{pad}{yaml_key(key)}:" + ("" if value else " []"))
            for item in value:
                if isinstance(item, Mapping | list):
                    raise FormatError("a list of tables or lists has no YAML writer here")
                else:
                    out.append(f"{pad}  - {_scalar(item)}")
        else:
            out.append(f"{pad}{yaml_key(key)}: {_scalar(value)}")
    return out


def _scalar(value: JsonValue) -> str:
    if value is None:
        return "null"
    if isinstance(value, str | int | float | bool):
        return yaml_scalar(value)
    raise FormatError("a nested value has no YAML writer here")


def yaml_text(header: Sequence[str], data: Mapping[str, JsonValue]) -> str:
    """A YAML document: comment lines, then ``data`` in block style."""
    return "\n".join([*comment_lines("#", header), *yaml_block(data)]) + "\n"


# --- INI, as llama-server's preset parser reads it -------------------------------------------

# Its grammar: a key is an identifier; a value runs to the end of the line or to the first ';'
# or '#' (a comment), and the blanks around it are dropped; a section name is anything but ']'.
_INI_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_INI_VALUE_STOP = re.compile(r"[;#\r\n]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# The router renames a section "NAME:TAG" to its canonical tag (an upper-case quantization
# name): a name it would rename would not be served under the name the config gave.
_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)


def canonical_tag(tag: str) -> str:
    """llama-server's canonical form of a section name's tag (after its last ':')."""
    found = _TAG.search(tag)
    return (found.group(1) if found else tag).upper()


def ini_key(key: str) -> str:
    if not _INI_KEY.fullmatch(key):
        raise FormatError(f"{key!r} is not a key a llama-server preset can hold")
    return key


def ini_value(value: str) -> str:
    if _INI_VALUE_STOP.search(value) or _CONTROL.search(value):
        raise FormatError(f"{value!r} holds ';', '#' or a newline")
    if value != value.strip(" \t"):
        raise FormatError(f"{value!r} starts or ends with a blank, which the preset drops")
    return value


def ini_section(name: str) -> str:
    if not name or "]" in name or _CONTROL.search(name) or name != name.strip(" \t"):
        raise FormatError(f"{name!r} cannot be a preset's section name")
    if ":" in name:
        tag = name.rsplit(":", 1)[1]
        if canonical_tag(tag) != tag:
            raise FormatError(
                f"llama-server's router would serve {name!r} as "
                f"{name.rsplit(':', 1)[0]}:{canonical_tag(tag)!s}"
            )
    return name


def ini_text(
    header: Sequence[str],
    top: Sequence[tuple[str, str]],
    sections: Sequence[tuple[str, Sequence[tuple[str, str]]]],
) -> str:
    """A preset file: comment lines, keys before any section, then each section's keys."""
    lines = comment_lines(";", header)
    lines += [f"{ini_key(k)} = {ini_value(v)}" for k, v in top]
    for name, keys in sections:
        lines += ["", f"[{ini_section(name)}]"]
        lines += [f"{ini_key(k)} = {ini_value(v)}" for k, v in keys]
    return "\n".join(lines) + "\n"
