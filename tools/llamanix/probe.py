"""Capability probe: what a real llama-server binary accepts, read from its --version and --help.

A hand-kept dialect table can be wrong for the commit a user actually built; the probe is the
binary's own word. Flags whose help says they were removed are left out: upstream keeps
``--draft-max`` in --help only to fail with "the argument has been removed".
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llamanix.errors import Problem, UserError

if TYPE_CHECKING:
    from llamanix.argv import Arg

# An option line: optional small indent, then "-x, --long-name VALUE_HINT    help".
_OPTION = re.compile(r"^ {0,6}((?:--?[A-Za-z][\w.-]*(?:,\s*)?)+)(?: ((?:[^\s]|, )+))?")
_FLAG = re.compile(r"--?[A-Za-z][\w.-]*")
_VERSION = re.compile(r"version:\s*(\S+)(?:\s*\(build\s*(\d+),\s*commit\s*(\w+)\))?")
_BUILD = re.compile(r"build\s*[=:]\s*(\d+)\s*\((\w+)\)")
_ALLOWED = re.compile(r"allowed values:\s*([\w, ]+)")
_REMOVED = ("has been removed", "argument has been removed")
_CUDA_MARKERS = ("ggml_cuda_init", "CUDA0", "built with CUDA", "GGML_CUDA")


@dataclass
class Capabilities:
    binary: str
    version: str | None = None
    build: int | None = None
    commit: str | None = None
    flags: list[str] = field(default_factory=list)
    removed_flags: list[str] = field(default_factory=list)
    spec_types: list[str] = field(default_factory=list)
    flash_attn_values: list[str] = field(default_factory=list)
    cache_types: list[str] = field(default_factory=list)
    cuda: bool = False
    source: str = ""  # the probe file, for messages

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("source")
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any], source: str = "") -> Capabilities:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data and k != "source"}
        return cls(**known, source=source)

    def describe(self) -> str:
        what = self.source or self.binary
        return f"{what} (version {self.version or '?'}, commit {self.commit or '?'})"

    def check_args(self, args: list[Arg]) -> list[tuple[str, str, str]]:
        """(field, message, fix) for every flag or value this binary would not take."""
        known = set(self.flags)
        out: list[tuple[str, str, str]] = []
        for arg in args[1:]:
            tokens = arg.tokens
            flags = (
                [t for t in tokens if _FLAG.fullmatch(t)]
                if arg.field == "extra_args"
                else [tokens[0]]
            )
            for flag in flags:
                if flag not in known:
                    hint = (
                        f"{flag} was removed from this build"
                        if flag in self.removed_flags
                        else f"{flag} is not accepted by this build"
                    )
                    out.append(
                        (
                            arg.field,
                            f"{hint}: {self.describe()}",
                            "choose the variant that matches this binary, or re-probe it",
                        )
                    )
            if arg.field == "speculative.type" and self.spec_types:
                stage = tokens[1].split(":", 1)[0]
                if stage not in self.spec_types:
                    out.append(
                        (
                            arg.field,
                            f"--spec-type {stage} is not known to {self.describe()}",
                            "it knows: " + ", ".join(self.spec_types),
                        )
                    )
            if (
                arg.field == "flash_attn"
                and self.flash_attn_values
                and (tokens[1] not in self.flash_attn_values)
            ):
                out.append(
                    (
                        arg.field,
                        f"-fa {tokens[1]} is not accepted by {self.describe()}",
                        "use one of: " + ", ".join(self.flash_attn_values),
                    )
                )
            if (
                arg.field in ("cache_type_k", "cache_type_v")
                and self.cache_types
                and (tokens[1] not in self.cache_types)
            ):
                out.append(
                    (
                        arg.field,
                        f"cache type {tokens[1]} is not known to {self.describe()}",
                        "use one of: " + ", ".join(self.cache_types),
                    )
                )
        return out


def parse_help(text: str) -> tuple[list[str], list[str], dict[str, tuple[str, str]]]:
    """Flags, removed flags, and per flag (value hint, description) from --help output."""
    entries: list[tuple[list[str], str, list[str]]] = []
    for line in text.splitlines():
        m = _OPTION.match(line)
        if m and not line.lstrip().startswith("- "):
            names = _FLAG.findall(m.group(1))
            hint = m.group(2) or ""
            rest = line[m.end() :].strip()
            entries.append((names, hint, [rest] if rest else []))
        elif entries:
            entries[-1][2].append(line.strip())
    flags: list[str] = []
    removed: list[str] = []
    details: dict[str, tuple[str, str]] = {}
    for names, hint, desc_lines in entries:
        desc = " ".join(desc_lines)
        target = removed if any(r in desc for r in _REMOVED) else flags
        for name in names:
            if name not in target:
                target.append(name)
            details[name] = (hint, desc)
    return flags, removed, details


def _values_from_hint(hint: str) -> list[str]:
    inner = hint.strip("[]{}<>")
    if not re.search(r"[,|]", inner):
        return []
    return [v for v in re.split(r"[,|]", inner) if re.fullmatch(r"[\w.-]+", v)]


def parse_capabilities(binary: str, version_text: str, help_text: str) -> Capabilities:
    flags, removed, details = parse_help(help_text)
    caps = Capabilities(binary=binary, flags=flags, removed_flags=removed)
    m = _VERSION.search(version_text)
    if m:
        caps.version = m.group(1)
        caps.build = int(m.group(2)) if m.group(2) else None
        caps.commit = m.group(3)
    b = _BUILD.search(version_text)
    if b and caps.build is None:
        caps.build, caps.commit = int(b.group(1)), b.group(2)
    if "--spec-type" in details:
        hint, desc = details["--spec-type"]
        caps.spec_types = _values_from_hint(hint) or _spec_types_from_text(desc)
    if "-fa" in details:
        caps.flash_attn_values = _values_from_hint(details["-fa"][0])
    if "-ctk" in details:
        a = _ALLOWED.search(details["-ctk"][1])
        if a:
            caps.cache_types = [v.strip() for v in a.group(1).split(",") if v.strip()]
    caps.cuda = any(marker in version_text for marker in _CUDA_MARKERS)
    return caps


def _spec_types_from_text(desc: str) -> list[str]:
    # ik documents its stage names in prose ("... one of: none, draft, mtp, ...").
    m = re.search(r"(?:types?|one of|stages?)[^:]*:\s*([\w-]+(?:\s*[,|]\s*[\w-]+)+)", desc)
    if not m:
        return []
    return [v.strip() for v in re.split(r"[,|]", m.group(1)) if v.strip()]


def run_binary(binary: str, arg: str, timeout: float = 60) -> str:
    """Run ``BINARY ARG`` and return stdout+stderr (llama-server prints --version to stderr)."""
    try:
        proc = subprocess.run(
            [binary, arg], capture_output=True, text=True, timeout=timeout, check=False
        )
    except (FileNotFoundError, PermissionError, OSError) as err:
        raise UserError(
            Problem(binary, "", f"cannot run: {err}", "give the path of a llama-server binary")
        ) from None
    except subprocess.TimeoutExpired:
        raise UserError(Problem(binary, "", f"'{arg}' did not finish in {timeout:g} s")) from None
    return proc.stdout + proc.stderr


def probe_binary(binary: str | Path) -> Capabilities:
    path = str(binary)
    caps = parse_capabilities(path, run_binary(path, "--version"), run_binary(path, "--help"))
    if not caps.flags:
        raise UserError(Problem(path, "", "--help listed no flags; is this llama-server?"))
    return caps


def load_capabilities(path: Path) -> Capabilities:
    source = str(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(
            Problem(
                source,
                "",
                "no such probe file",
                "make one with: llamanix probe BINARY --json > FILE",
            )
        ) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(
            Problem(
                source,
                "",
                f"not a probe JSON file: {err}",
                "make one with: llamanix probe BINARY --json > FILE",
            )
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("flags"), list):
        raise UserError(
            Problem(
                source,
                "flags",
                "missing; this is not a llamanix probe",
                "make one with: llamanix probe BINARY --json > FILE",
            )
        )
    return Capabilities.from_json(data, source)
