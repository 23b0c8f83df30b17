"""The one writer of systemd unit text: every value a unit line holds goes through here.

A unit file is line-based: a line break in a value starts a directive of its own (a newline in
an environment value once became ``ExecStartPre=+...``, run as root), a trailing backslash joins
the next line to this one, ``%`` starts a specifier, and each directive unquotes (or not) in its
own way. So the unit templates (render/templates) never place a raw string: their one Jinja
environment's ``finalize`` (unit_templates.py) lets through only ``UnitText`` made by the
functions below, numbers, and plain tokens that mean the same in every directive
(``[A-Za-z0-9_.:@+/-]``); anything else is refused with ``UnitValueError``, so a value that
validate let through by mistake is still never written.

Each function quotes for the directive it is for, or refuses:

- ``text``: free text (``Description=``): specifiers escaped, no control character, no
  trailing backslash;
- ``word``/``words``: one token, or a space-separated list of tokens (``StateDirectory=``,
  ``IPAddressAllow=``): nothing that a list would split or unquote;
- ``path``: an absolute, normalized path (``LoadCredential=ID:PATH``): specifiers escaped;
  systemd ignores a non-normalized credential path;
- ``exec_line``: ``ExecStart=``-style command lines, each word quoted (``exec_word``);
- ``assignment``: ``Environment=`` quoted assignments;
- ``credential``: ``SetCredential=ID:DATA``, C-escaped data;
- ``comment``: a ``#`` line's text, control characters escaped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from llamanix.core.errors import Problem, UserError, one_line


class UnitText(str):
    """Text this module made: safe to place after a directive's ``=`` (or in a comment)."""

    __slots__ = ()


class UnitValueError(UserError):
    """A value that no directive may hold as it is: refused, and nothing is written."""

    def __init__(self, value: str, what: str) -> None:
        super().__init__(
            Problem(
                "render",
                "",
                f"{what} cannot be written into a unit: {_quoted(value)}",
                "this is a gap in validate: please report it; remove the control characters, "
                "quotes or backslashes from that value",
            )
        )


# What means the same in every directive: no whitespace, quote, backslash, specifier or '$'.
PLAIN = re.compile(r"[A-Za-z0-9_.:@+/-]*")
_EXEC_PLAIN = re.compile(r"[\w@+=:,./-]+")
# A specifier systemd must expand, as llamanix itself writes it (never a config's value).
_SPECIFIER = re.compile(r"%[dCSEhLT]/[A-Za-z0-9_.:@+-]+|%[dCSEhLT]")


def _quoted(value: str) -> str:
    return "'" + one_line(value) + "'"


def _no_control(value: str, what: str) -> None:
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise UnitValueError(value, what)


def text(value: str) -> UnitText:
    """Free text, as ``Description=`` takes it: ``%`` escaped, nothing that ends the line."""
    _no_control(value, "text")
    if value.endswith("\\"):
        raise UnitValueError(value, "text ending in a backslash (it would join the next line)")
    return UnitText(value.replace("%", "%%"))


def word(value: str) -> UnitText:
    """One token of a directive that splits on whitespace and unquotes."""
    if not value or not PLAIN.fullmatch(value):
        raise UnitValueError(value, "a token")
    return UnitText(value)


def words(values: Iterable[str]) -> UnitText:
    """A space-separated list of tokens (``IPAddressAllow=``, ``StateDirectory=``)."""
    return UnitText(" ".join(word(v) for v in values))


_NOT_NORMALIZED = re.compile(r"//|/\.\.?(/|$)")


def path(value: str) -> UnitText:
    """An absolute, normalized path, as ``LoadCredential=`` takes its source (the rest of the
    line, not unquoted): ``%`` escaped; no control character, no space at either end (systemd
    strips it), no trailing backslash (it joins the next line), no ``.``/``..`` component or
    ``//`` (systemd ignores a credential whose path is not normalized)."""
    _no_control(value, "a path")
    if not value.startswith("/") or _NOT_NORMALIZED.search(value):
        raise UnitValueError(value, "a path that is not absolute and normalized")
    if value != value.strip() or value.endswith("\\"):
        raise UnitValueError(value, "a path ending in a space or a backslash")
    return UnitText(value.replace("%", "%%"))


def bind_path(source: str, destination: str, *, optional: bool = True) -> UnitText:
    """One ``BindReadOnlyPaths=`` item, ``[-]SOURCE:DESTINATION``: a list item that systemd
    splits at blanks and at ':', so neither path may hold one (nor a quote or a backslash)."""
    for value in (source, destination):
        path(value)
        if any(ch in value for ch in " :\"'\\"):
            raise UnitValueError(value, "a bound path with a blank, ':', a quote or a backslash")
    return UnitText(("-" if optional else "") + f"{path(source)}:{path(destination)}")


def credential_path(credential: str, source: str) -> UnitText:
    """``LoadCredential=``'s value: the credential's id and the file systemd reads it from."""
    return UnitText(f"{word(credential)}:{path(source)}")


def specifier(value: str) -> UnitText:
    """A specifier llamanix itself writes (``%d/api-key``, ``%S``): left for systemd."""
    if not _SPECIFIER.fullmatch(value):
        raise UnitValueError(value, "a specifier")
    return UnitText(value)


def exec_word(arg: str) -> str:
    """One word of an ``Exec*=`` line: specifiers and variables are not expanded in user data;
    a word with anything but plain characters is double-quoted with C escapes."""
    _no_control(arg, "an argv word")
    escaped = arg.replace("%", "%%").replace("$", "$$")
    if _EXEC_PLAIN.fullmatch(escaped):
        return escaped
    escaped = escaped.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def exec_line(argv: Iterable[str], *, keep: Iterable[str] = (), prefix: str = "") -> UnitText:
    """An ``Exec*=`` value: each word quoted, except the specifiers and variables llamanix
    itself writes (``keep``: ``%d/api-key``, ``$MAINPID``), which systemd must expand."""
    kept = set(keep)
    for token in kept:
        if not (_SPECIFIER.fullmatch(token) or token == "$MAINPID"):
            raise UnitValueError(token, "an unescaped word")
    if prefix not in ("", "+", "-", "!", "@"):
        raise UnitValueError(prefix, "an Exec prefix")
    argv = list(argv)
    if argv and any(ch in argv[0] for ch in "\"'\\"):
        # systemd refuses a command whose name holds these ("special characters").
        raise UnitValueError(argv[0], "a program's path with a quote or a backslash")
    return UnitText(prefix + " ".join(t if t in kept else exec_word(t) for t in argv))


def assignment(key: str, value: str, *, expand: bool = False) -> UnitText:
    """``Environment=``'s quoted ``KEY=VALUE``; ``expand``: the value is llamanix's own and
    holds a specifier systemd must expand (``%C/...``)."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        raise UnitValueError(key, "an environment variable's name")
    _no_control(value, "an environment value")
    if expand:
        specifier(value)
    body = f"{key}={value}" if expand else f"{key}={value.replace('%', '%%')}"
    body = body.replace("\\", "\\\\").replace('"', '\\"')
    return UnitText(f'"{body}"')


def credential(credential_id: str, data: str) -> UnitText:
    """``SetCredential=ID:DATA``: systemd C-unescapes the data and expands no specifier there
    (checked under systemd 252 and 257), so backslashes and line breaks are escaped."""
    escaped = data.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in escaped):
        raise UnitValueError(data, "a credential's data")
    return UnitText(f"{word(credential_id)}:{escaped}")


def comment(value: str) -> UnitText:
    """A ``#`` line's text: a line break there would end the comment (and a trailing
    backslash would join the next line to it)."""
    line = one_line(value)
    return UnitText(line + " ." if line.endswith("\\") else line)


def finalize(value: object) -> object:
    """Jinja's ``finalize`` for unit templates: what may be placed as it is."""
    if isinstance(value, UnitText) or value is None:
        return value
    if isinstance(value, bool):
        raise TypeError("a unit template placed a bool: write yes/no in the template")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and PLAIN.fullmatch(value):
        return value
    raise UnitValueError(str(value), "a value not written by render/systemd.py")


# --- reading back what the writers wrote -------------------------------------------------------
# The same rules as systemd's: specifiers expanded first, then words split at blanks with quotes
# removed and C escapes resolved (extract_first_word with EXTRACT_UNQUOTE|EXTRACT_CUNESCAPE).
# `llamanix up` runs the units it reads through these, and the boundary tests read every
# rendered unit back with them (and, on the host bed, with systemd itself).

_C_ESCAPES = {
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
    '"': '"',
    "'": "'",
    "s": " ",
}
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}


def expand_specifiers(value: str, known: dict[str, str] | None = None) -> str:
    """``%%`` as ``%``; ``%X`` as ``known[X]`` where given, else left as it is."""
    table = known or {}
    return re.sub(r"%(.)", lambda m: "%" if m[1] == "%" else table.get(m[1], m[0]), value)


def split_words(value: str) -> list[str]:
    """A directive's value as systemd splits it into words (unquoted, C escapes resolved);
    ValueError for what systemd would not read (an open quote, a bad escape)."""
    words: list[str] = []
    i, n = 0, len(value)
    while True:
        while i < n and value[i] in " \t\n\r":
            i += 1
        if i >= n:
            return words
        word: list[str] = []
        quote: str | None = None
        while i < n:
            ch = value[i]
            if quote is None and ch in " \t\n\r":
                break
            if ch == quote:
                quote, i = None, i + 1
                continue
            if quote is None and ch in "'\"":
                quote, i = ch, i + 1
                continue
            if ch == "\\":
                if i + 1 >= n:
                    raise ValueError("a backslash at the end")
                escape = value[i + 1]
                if escape in _C_ESCAPES:
                    word.append(_C_ESCAPES[escape])
                    i += 2
                elif escape in _HEX_ESCAPES:
                    digits = value[i + 2 : i + 2 + _HEX_ESCAPES[escape]]
                    word.append(chr(int(digits, 16)))
                    i += 2 + len(digits)
                elif escape in "01234567":
                    word.append(chr(int(value[i + 1 : i + 4], 8)))
                    i += 4
                else:
                    raise ValueError(f"an unknown escape \\{escape}")
                continue
            word.append(ch)
            i += 1
        if quote is not None:
            raise ValueError("an open quote")
        words.append("".join(word))


def exec_argv(value: str, known: dict[str, str] | None = None) -> tuple[str, list[str]]:
    """An ``Exec*=`` value as systemd runs it: (its prefix characters, its argv). ``$$`` is a
    dollar; ``$NAME`` words are left for the caller (llamanix writes only ``$MAINPID``)."""
    prefix = ""
    while value[:1] in ("+", "-", "!", "@", ":") and value:
        prefix, value = prefix + value[0], value[1:]
    words = split_words(expand_specifiers(value, known))
    return prefix, [w.replace("$$", "$") for w in words]


def assignments(value: str, known: dict[str, str] | None = None) -> list[tuple[str, str]]:
    """An ``Environment=`` value as systemd reads it: its ``KEY=VALUE`` words."""
    out = []
    for word in split_words(expand_specifiers(value, known)):
        key, _, val = word.partition("=")
        out.append((key, val))
    return out


def read_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """A unit file's directives by section, as systemd's parser sees the lines: comments
    dropped, a line ending in a backslash joined to the next, values stripped."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    pending = ""
    for raw in text.split("\n"):
        line = pending + raw
        if line.endswith("\\") and not line.lstrip().startswith(("#", ";")):
            pending = line[:-1] + " "
            continue
        pending = ""
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", ";")):
            continue
        if stripped.startswith("[") and stripped.endswith("]"):
            current = sections.setdefault(stripped[1:-1], {})
            continue
        if current is None or "=" not in stripped:
            raise ValueError(f"a line systemd would not read: {one_line(stripped)}")
        key, _, val = stripped.partition("=")
        current.setdefault(key.strip(), []).append(val.strip())
    return sections
