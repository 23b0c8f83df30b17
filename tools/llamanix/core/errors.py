"""Errors a user can act on.

Every mistake a user can make ends as one line, ``FILE: FIELD: what is wrong (how to fix)``,
exit code 2, and nothing written. The CLI turns these exceptions into that line.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the user's input.

    ``source`` is where the bad input is, as the user wrote it: a file path (a config, a model,
    a results file), a URL or an environment variable the user set, or, for a command-line
    argument, the command (``llamanix variant pin``). ``field`` then names the key, option or
    argument inside it.
    """

    source: str
    field: str
    message: str
    fix: str = ""

    def __str__(self) -> str:
        where = f"{self.source}: {self.field}: " if self.field else f"{self.source}: "
        fix = f" ({self.fix})" if self.fix else ""
        # One line, whatever a file's name or a key in it holds.
        return printable(f"{where}{self.message}{fix}")


def printable(text: str) -> str:
    """``text`` as one printable line: control characters (a newline in a TOML key, a NUL in
    a path) written as escapes (``\\n``, ``\\x00``), and the bytes of a file name that are
    not UTF-8 (kept by Python as lone surrogates, which no terminal can be sent) as ``\\xNN``."""
    if text.isprintable():
        return text
    return "".join(_printable_char(ch) for ch in text)


# The name every writer and message uses: a value shown in one line.
one_line = printable
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _printable_char(ch: str) -> str:
    code = ord(ch)
    if ch in _NAMED:
        return _NAMED[ch]
    if 0xDC80 <= code <= 0xDCFF:  # a byte that is not UTF-8, as os.fsdecode keeps it
        return f"\\x{code - 0xDC00:02x}"
    if code < 0x20 or 0x7F <= code <= 0x9F:  # C0, DEL and C1 (U+0085 ends a line too)
        return f"\\x{code:02x}"
    if code in (0x2028, 0x2029):  # the line and paragraph separators
        return f"\\u{code:04x}"
    if 0xD800 <= code <= 0xDFFF:  # a lone surrogate (a JSON "\\ud800"): no text at all
        return f"\\u{code:04x}"
    return ch


class UserError(Exception):
    """Input the user can correct: reported as one line per problem, exit code 2."""

    exit_code = 2

    def __init__(self, problems: list[Problem] | Problem | str) -> None:
        if isinstance(problems, str):
            problems = [Problem("llamanix", "", problems)]
        elif isinstance(problems, Problem):
            problems = [problems]
        self.problems: list[Problem] = problems
        super().__init__("\n".join(str(p) for p in problems))


class ExternalCommandError(Exception):
    """A program we ran (nixos-rebuild, systemctl, llama-server ...) failed."""

    exit_code = 1
