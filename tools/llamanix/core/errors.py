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
    argument, the command (``llamanix pin``). ``field`` then names the key, option or argument
    inside it.
    """

    source: str
    field: str
    message: str
    fix: str = ""

    def __str__(self) -> str:
        where = f"{self.source}: {self.field}: " if self.field else f"{self.source}: "
        fix = f" ({self.fix})" if self.fix else ""
        return one_line(f"{where}{self.message}{fix}")


def one_line(text: str) -> str:
    """``text`` with its control characters escaped: a problem is one line, whatever a file
    name, a key or a value held (a line break there would start a line of its own)."""
    return "".join(
        ch.encode("unicode_escape").decode("ascii")
        if ord(ch) < 32 or 127 <= ord(ch) < 160 or ch in "\u2028\u2029"
        else ch
        for ch in text
    )


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
