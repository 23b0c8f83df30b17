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
