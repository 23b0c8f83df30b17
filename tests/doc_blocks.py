"""The fenced blocks of README.md and docs/*.md, with the markers that say how the docs test
treats each one (docs/development.md, "The docs test").

A marker is an HTML comment on the line (or lines) right above a block's opening fence:

- ``<!-- not run: REASON -->``: a command block that cannot run here; REASON starts with one
  of ``NOT_RUN_REASONS``.
- ``<!-- run by PATH[::TEST], ... -->``: a command block another test runs (the demo, the
  host bed); each file and test must exist.
- ``<!-- synopsis -->``: a command's usage with its options in brackets; every option it names
  must be one the command's ``--help`` lists.
- ``<!-- dry run -->``: ``switch``, ``rollback`` and ``pin`` in the block run with
  ``--dry-run``, so nothing on this machine changes; the block is sh (it shows no output).
- ``<!-- file: PATH -->``: the block is the file PATH, there for the command blocks of the
  same document to read.
- ``<!-- files: NAME=SOURCE, ... -->``: the command block runs with these files; SOURCE is a
  path in the repository, ``synthetic`` (a small generated GGUF), ``probe:STEM`` (the probe
  of the ``--help`` recorded as tests/data/help/STEM, or of the derived
  ``beellama-after-v0.3``) or a document whose ``file:`` block of the same NAME it is.

Commands are ``sh`` blocks (one command a line, ``\\`` continues it; each must succeed) and
``console`` blocks, a transcript: ``$ `` starts a command and the lines after it are all it
prints (none: it prints nothing), a line ``...`` alone standing for any lines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast

ROOT = Path(__file__).resolve().parent.parent
COMMAND_LANGUAGES = ("sh", "console")
NOT_RUN_REASONS = (
    "needs a GPU",
    "needs NixOS",
    "needs Nix",  # a Nix that builds: flake outputs, nixpkgs, the network
    "needs another host",
    "changes this machine",
    "needs a running server",
    "is interactive",
    "is a benchmark",  # its figures differ run to run; the text says where they were measured
)
MarkerKind = Literal["not run", "run by", "synopsis", "dry run", "file", "files"]
_MARKER = re.compile(
    r"\s*<!--\s*(not run|run by|synopsis|dry run|files|file)\b:?\s*(.*?)\s*-->\s*$"
)
_FENCE = re.compile(r"^(\s*)```(.*)$")


def docs() -> list[Path]:
    return sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])


@dataclass(frozen=True)
class Marker:
    kind: MarkerKind
    value: str


@dataclass(frozen=True)
class Command:
    text: str  # as written, continuation lines joined with their backslash-newline
    line: int  # 1-based line of its first line in the document
    output: tuple[str, ...] | None  # the output a console block shows; None in an sh block
    out_start: int  # where its output starts in the block's body (an index)
    out_end: int  # where its output ends (blank lines after it not counted)


@dataclass(frozen=True)
class Block:
    doc: str  # path relative to the repository
    line: int  # 1-based line of the opening fence
    language: str
    indent: str
    body: tuple[str, ...]  # lines between the fences, indent removed
    markers: tuple[Marker, ...]

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def is_command(self) -> bool:
        return self.language in COMMAND_LANGUAGES

    def marker(self, kind: MarkerKind) -> Marker | None:
        found = [m for m in self.markers if m.kind == kind]
        return found[0] if found else None

    def commands(self) -> list[Command]:
        """The commands of an sh or console block, with the output a console block shows."""
        out: list[Command] = []
        lines = list(self.body)
        i = 0
        while i < len(lines):
            raw = lines[i]
            number = self.line + 1 + i
            if self.language == "console":
                if not raw.startswith("$ "):
                    raise ValueError(f"{self.id}: output before the first '$ ' command")
                first = raw[2:]
            else:
                if raw.startswith("$ "):
                    raise ValueError(f"{self.id}: line {number}: '$ ' in an sh block (use console)")
                if not raw.strip() or raw.lstrip().startswith("#"):
                    i += 1
                    continue
                first = raw
            text = [first]
            while text[-1].rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                text.append(lines[i])
            i += 1
            output: tuple[str, ...] | None = None
            start = i
            if self.language == "console":
                shown: list[str] = []
                while i < len(lines) and not lines[i].startswith("$ "):
                    shown.append(lines[i].rstrip())
                    i += 1
                while shown and not shown[-1]:
                    shown.pop()
                output = tuple(shown)
            out.append(Command("\n".join(text), number, output, start, start + len(output or ())))
        return out


def parse(path: Path) -> list[Block]:
    """Every fenced block of one Markdown file, with the markers right above it."""
    lines = path.read_text().splitlines()
    rel = str(path.relative_to(ROOT))
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, language = m.group(1), m.group(2).strip()
        markers: list[Marker] = []
        j = i - 1
        while j >= 0 and (found := _MARKER.match(lines[j])):
            markers.insert(0, Marker(cast(MarkerKind, found.group(1)), found.group(2)))
            j -= 1
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            line = lines[i]
            body.append(line[len(indent) :] if line.startswith(indent) else line.lstrip())
            i += 1
        if i == len(lines):
            raise ValueError(f"{rel}:{start + 1}: a fence that is never closed")
        blocks.append(Block(rel, start + 1, language, indent, tuple(body), tuple(markers)))
        i += 1
    return blocks


def stray_markers(path: Path) -> list[int]:
    """Lines of markers that stand above no fence (1-based): they would be ignored."""
    lines = path.read_text().splitlines()
    out = []
    for i, line in enumerate(lines):
        if _MARKER.match(line):
            j = i + 1
            while j < len(lines) and _MARKER.match(lines[j]):
                j += 1
            if j == len(lines) or not _FENCE.match(lines[j]):
                out.append(i + 1)
    return out


def all_blocks() -> list[Block]:
    return [block for doc in docs() for block in parse(doc)]


def files_of(marker: Marker) -> dict[str, str]:
    """``files: a=b, c=d`` as {"a": "b", "c": "d"}."""
    out: dict[str, str] = {}
    for item in marker.value.split(","):
        name, sep, source = item.strip().partition("=")
        if not sep or not name or not source:
            raise ValueError(f"files marker: '{item.strip()}' is not NAME=SOURCE")
        out[name.strip()] = source.strip()
    return out


def run_by_targets(marker: Marker) -> list[tuple[str, str | None]]:
    """``run by a.py::t, .ci/run`` as [("a.py", "t"), (".ci/run", None)]."""
    out: list[tuple[str, str | None]] = []
    for item in marker.value.split(","):
        path, _, test = item.strip().partition("::")
        out.append((path, test or None))
    return out
