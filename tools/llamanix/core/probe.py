"""Capability probe: what a real llama-server binary accepts, read from its --version and --help.

A hand-kept dialect table can be wrong for the commit a user actually built; the probe is the
binary's own word. Flags whose help says they were removed are left out: upstream keeps
``--draft-max`` in --help only to fail with "the argument has been removed".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from llamanix.core import file_reader
from llamanix.core.errors import Problem, UserError
from llamanix.core.json_codec import JSON_SKIP, JsonRecord, from_json_lenient

# An option line: optional small indent, then "-x, --long-name VALUE_HINT    help".
# ik indents a long-only option by nine spaces (aligned under "-x,   --long"); continuation
# lines start far deeper.
_OPTION = re.compile(r"^ {0,10}((?:--?[A-Za-z][\w.-]*(?:,\s*)?)+)(?: ((?:[^\s]|, )+))?")
FLAG = re.compile(r"--?[A-Za-z][\w.-]*")
_VERSION = re.compile(r"version:\s*(\S+)(?:\s*\(build\s*(\d+),\s*commit\s*(\w+)\))?")
_BUILD = re.compile(r"build\s*[=:]\s*(\d+)\s*\((\w+)\)")
_ALLOWED = re.compile(r"allowed values:\s*([\w, ]+)")
_REMOVED = ("has been removed", "argument has been removed")
_CUDA_MARKERS = ("ggml_cuda_init", "CUDA0", "built with CUDA", "GGML_CUDA")


@dataclass
class Capabilities(JsonRecord):
    """What a binary accepts. A probe file (``llamanix variant probe --json``) is read leniently
    (``from_json_lenient(Capabilities, data, where, source=where)``): one an older version
    wrote lacks the newer fields, which take their defaults."""

    binary: str
    version: str | None = None
    build: int | None = None
    commit: str | None = None
    flags: list[str] = field(default_factory=list)
    removed_flags: list[str] = field(default_factory=list)
    spec_types: list[str] = field(default_factory=list)
    flash_attn_values: list[str] = field(default_factory=list)
    cache_types: list[str] = field(default_factory=list)  # -ctk's allowed values
    # -ctv's, where they differ (BeeLlama v0.4 lists KVarN for V only); empty: same as K.
    cache_types_v: list[str] = field(default_factory=list)
    cuda: bool = False
    # The flag dialect this binary's --help shows (a name from core.variants.DIALECTS), or None
    # when it matches none of them.
    dialect: str | None = None
    # Why the dialect is only the family's (a build newer than the recorded one): its markers.
    # Empty when the --help matches a recorded build of that dialect.
    dialect_guess: str = ""
    # How --spec-type takes a chain: "comma" (one comma-separated value), "repeat" (one flag
    # per stage), "single"; None when the binary has no --spec-type.
    spec_chain: str | None = None
    # The probe file, for messages: where this record was read from, not part of it.
    source: str = field(default="", metadata=JSON_SKIP)

    def all_cache_types(self) -> list[str]:
        return [*dict.fromkeys([*self.cache_types, *self.cache_types_v])]

    def cache_types_for(self, key: str) -> list[str]:
        """The types -ctk (``cache_type_k``) or -ctv (``cache_type_v``) accepts."""
        if key.endswith("_v") and self.cache_types_v:
            return self.cache_types_v
        return self.cache_types

    def describe(self) -> str:
        what = self.source or self.binary
        return f"{what} (version {self.version or '?'}, commit {self.commit or '?'})"


def parse_help(text: str) -> tuple[list[str], list[str], dict[str, tuple[str, str]]]:
    """Flags, removed flags, and per flag (value hint, description) from --help output."""
    entries: list[tuple[list[str], str, list[str]]] = []
    for line in text.splitlines():
        m = _OPTION.match(line)
        if m and not line.lstrip().startswith("- "):
            names = FLAG.findall(m.group(1))
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


def _allowed(details: dict[str, tuple[str, str]], flag: str) -> list[str]:
    if flag not in details:
        return []
    a = _ALLOWED.search(details[flag][1])
    return [v.strip() for v in a.group(1).split(",") if v.strip()] if a else []


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
        # ik's hint is the stage syntax (SPEC[:k=v,...]); its types are listed in the prose.
        from_hint = [] if hint.startswith("SPEC") else _values_from_hint(hint)
        caps.spec_types = from_hint or _spec_types_from_text(desc)
        if "comma-separated list" in desc:
            caps.spec_chain = "comma"
        elif re.search(r"repeat for .*chain", desc):
            caps.spec_chain = "repeat"
        else:
            caps.spec_chain = "single"
    if "-fa" in details:
        caps.flash_attn_values = _values_from_hint(details["-fa"][0])
    caps.cache_types = _allowed(details, "-ctk")
    v_types = _allowed(details, "-ctv")
    if v_types != caps.cache_types:
        caps.cache_types_v = v_types
    caps.cuda = any(marker in version_text for marker in _CUDA_MARKERS)
    caps.dialect, caps.dialect_guess = detect_dialect(caps, help_text)
    return caps


# BeeLlama's own additions, any of which marks a build as BeeLlama: its KV cache families
# (TurboQuant until v0.3, KVarN since v0.4), its draftless types, DFlash's slot limit.
_BEELLAMA_CACHE_PREFIXES = ("turbo", "kvarn")
_BEELLAMA_SPEC_TYPES = ("copyspec", "recycle")
_BEELLAMA_FLAGS = ("--spec-dflash-max-slots",)


def _beellama_markers(caps: Capabilities) -> list[str]:
    found = sorted(
        {
            p + "*"
            for t in caps.all_cache_types()
            for p in _BEELLAMA_CACHE_PREFIXES
            if t.startswith(p)
        }
    )
    found += [t for t in _BEELLAMA_SPEC_TYPES if t in caps.spec_types]
    found += [f for f in _BEELLAMA_FLAGS if f in caps.flags]
    return found


def _is_beellama_v03(caps: Capabilities) -> bool:
    """The recorded v0.3 (ba1fdce): TurboQuant caches, a bare ``dflash`` type, ``-cd``."""
    return (
        any(t.startswith("turbo") for t in caps.cache_types)
        and "dflash" in caps.spec_types
        and "-cd" in caps.flags
    )


def detect_dialect(caps: Capabilities, help_text: str) -> tuple[str | None, str]:
    """Which family of spellings the --help shows, and (second) the markers it was inferred
    from when the build is not one llamanix has a recording of ("" when it is).

    Checked from the most specific family down: BeeLlama (any of its own cache types, types or
    flags; not one word, since v0.4 renamed most of them), ik's ``--spec-type SPEC[:k=v,...]``
    stages, upstream's ``draft-*`` types (with ``--spec-draft-model`` since mid 2026, ``-md``
    before), and b8770's ``--draft-max``, which later builds list only as removed."""
    markers = _beellama_markers(caps)
    if markers:
        if _is_beellama_v03(caps):
            return "beellama", ""
        return "beellama", "not v0.3: " + ", ".join(markers)
    if re.search(r"--spec-type\s+SPEC\[:", help_text):
        return "ik", ""
    if "draft-simple" in caps.spec_types:
        return ("upstream" if "--spec-draft-model" in caps.flags else "upstream-2026-05"), ""
    if "--draft-max" in caps.flags:
        return "b8770", ""
    return None, ""


def _spec_types_from_text(desc: str) -> list[str]:
    # ik documents its stage names in prose ("... one of: none, draft, mtp, ...").
    m = re.search(r"(?:types?|one of|stages?)[^:]*:\s*([\w-]+(?:\s*[,|]\s*[\w-]+)+)", desc)
    if not m:
        return []
    return [v.strip() for v in re.split(r"[,|]", m.group(1)) if v.strip()]


def commit_of(version_line: str) -> str | None:
    """The commit hash in a ``version: ... (build N, commit HASH)`` line."""
    match = re.search(r"commit ([0-9a-f]+)", version_line)
    return match.group(1) if match else None


def load_capabilities(path: Path) -> Capabilities:
    source = str(path)
    make = "make one with: llamanix variant probe BINARY --json > FILE"
    text = file_reader.text_if_present(path, source=source)
    if text is None:
        raise UserError(Problem(source, "", "no such probe file", make))
    try:
        data = file_reader.parse_json(text, source)
    except file_reader.FileRefused as err:
        message = err.problems[0].message
        raise UserError(Problem(source, "", f"not a probe JSON file: {message}", make)) from None
    if not isinstance(data, dict) or not isinstance(data.get("flags"), list):
        raise UserError(
            Problem(
                source,
                "flags",
                "missing; this is not a llamanix probe",
                "make one with: llamanix variant probe BINARY --json > FILE",
            )
        )
    try:
        return from_json_lenient(Capabilities, data, source, source=source)
    except ValueError as err:  # a field the lenient read must have (MUST_READ), such as binary
        raise UserError(Problem(source, "", f"not a probe: {err}", make)) from None
