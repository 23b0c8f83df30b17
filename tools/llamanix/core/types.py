"""The config's names and strings: one declared type for each, checked at the boundary.

Every string a config carries (a table's name, a path, an address, an environment value, an
argv word) has one of the types below. ``core.schema`` names the type of each field;
``config.model`` (validate, ``--set``) checks values with ``check_text``; ``data/schema.json``
carries the same table, from which ``nix/schema-options.nix`` makes the NixOS options'
``types.strMatching`` (a test runs both engines over a table of good and bad values).

Each pattern is written in the subset that Python's ``re.fullmatch`` and Nix's
``builtins.match`` (POSIX extended regular expressions, whole string) read the same way: bracket
expressions, ``(...)``, ``|``, ``*``, ``+``, ``?`` and ``{m,n}``, no ``\\d``/``\\w`` or
look-ahead. Length is a separate bound (a long repetition count is slow in some engines).
A NUL can never be in a Nix string, and is refused here for every type.

Writers still quote or refuse what they write (render/systemd.py and friends): a type narrows
what reaches them, it does not replace them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from typing import Literal, get_args

from llamanix.core.errors import one_line
from llamanix.core.json_codec import JSON_SKIP, JsonRecord, json_via
from llamanix.core.json_value import JsonObject

TextKind = Literal[
    "name",
    "alias",
    "path",
    "program",
    "listen",
    "ssh_target",
    "version",
    "env_name",
    "text",
    "word",
    "cuda_arch",
    "devices",
]
TEXT_KINDS: tuple[TextKind, ...] = get_args(TextKind)

# ASCII control characters and DEL: a line break ends a unit's directive, an INI key or a YAML
# scalar; a tab or a form feed is whitespace to some parsers and not to others.
_CONTROL = "\x01-\x1f\x7f"
_DEC_OCTET = "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_IPV4 = f"{_DEC_OCTET}(\\.{_DEC_OCTET}){{3}}"
_H = "[0-9A-Fa-f]{1,4}"
# Every IPv6 text form without an embedded IPv4 part or a zone (RFC 4291 2.2, forms 1 and 2).
_IPV6 = "|".join(
    (
        f"({_H}:){{7}}{_H}",
        f"({_H}:){{1,7}}:",
        f"({_H}:){{1,6}}:{_H}",
        f"({_H}:){{1,5}}(:{_H}){{1,2}}",
        f"({_H}:){{1,4}}(:{_H}){{1,3}}",
        f"({_H}:){{1,3}}(:{_H}){{1,4}}",
        f"({_H}:){{1,2}}(:{_H}){{1,5}}",
        f"{_H}:(:{_H}){{1,6}}",
        f":((:{_H}){{1,7}}|:)",
    )
)
_LABEL = "[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?"
# The last label starts with a letter (RFC 1123 2.1): "0", "127.1" or "0x7f" would be read as
# an address by inet_aton, and a name gets no IP filter.
_TOP_LABEL = "[A-Za-z]([A-Za-z0-9-]*[A-Za-z0-9])?"
_DNS_NAME = f"({_LABEL}\\.)*{_TOP_LABEL}\\.?"
# A path component "." or "..", or "//": systemd ignores a credential path that is not
# normalized, and a path means what it says.
_NOT_NORMAL = ".*(//|/[.][.]?/).*|.*/[.][.]?"


def _pattern(forbidden: tuple[str, str]) -> str:
    return forbidden[0]


@dataclass(frozen=True)
class TextType(JsonRecord):
    """What one kind of config string may hold; its JSON (in schema.json) is what a value
    must match."""

    kind: TextKind = field(metadata=JSON_SKIP)
    doc: str  # what it is, for the config reference and the NixOS option's description
    pattern: str  # the whole value, in the shared regex subset (see the module's doc)
    max_length: int
    fix: str = field(metadata=JSON_SKIP)  # what to write instead, for the one line validate prints
    # A pattern (same subset) of whole values refused although they match, and what it is
    # (written: the pattern).
    forbidden: tuple[str, str] | None = field(
        default=None, metadata=json_via(_pattern, omit_none=True)
    )
    # Good and bad values: the reference shows the good ones, and the test that runs Python's
    # and Nix's engines side by side starts from both.
    good: tuple[str, ...] = field(default=(), metadata=JSON_SKIP)
    bad: tuple[str, ...] = field(default=(), metadata=JSON_SKIP)


TYPES: dict[TextKind, TextType] = {
    t.kind: t
    for t in (
        TextType(
            "name",
            "a name: a letter or digit, then letters, digits, '_', '.' or '-' (no '..'); it "
            "becomes part of unit names, file names and state directories",
            "[A-Za-z0-9][A-Za-z0-9_.-]*",
            64,
            "use letters, digits, '_', '.' and '-', starting with a letter or digit "
            '(e.g. "qwen27b")',
            (".*[.][.].*", "'..'"),
            ("chat", "qwen27b", "box-1", "a.b_c", "Q3"),
            ("", "my chat", "x/../../escaped", "-x", ".hidden", "a..b", "q$(id)", "é", "a\nb"),
        ),
        TextType(
            "alias",
            "a served model name: a letter or digit, then letters, digits and '_.:@+/-'",
            "[A-Za-z0-9][A-Za-z0-9_.:@+/-]*",
            128,
            "use letters, digits and '_.:@+/-', starting with a letter or digit "
            '(e.g. "qwen3.6-27b")',
            None,
            ("qwen3.6-27b", "Qwen/Qwen3-8B", "m:latest", "gemma@q4"),
            ("", "q]\nmodel = /etc/shadow\n[z", "a b", "[x]", "a;b", "a#b", "$x", "'q'"),
        ),
        TextType(
            "path",
            "an absolute, normalized path (no '.', '..' or empty component) with no control "
            "characters",
            f"/[^{_CONTROL}]*",
            4096,
            "use an absolute path without '.', '..', '//', line breaks or other control characters",
            (_NOT_NORMAL, "a '.' or '..' component or '//'"),
            ("/srv/models/a.gguf", "/opt/x y/llama-server", "/var/lib/100%/m.gguf", "/é", "/a/.b"),
            (
                "",
                "models/a.gguf",
                "/a\nExecStartPre=+/bin/true",
                "/a\rb",
                "/a\tb",
                "~/m.gguf",
                "//etc/x",
                "/a/../etc/shadow",
                "/a/./b",
                "/a/..",
            ),
        ),
        TextType(
            "program",
            "an absolute, normalized path of a program, without quotes or backslashes (systemd "
            "refuses them in a command's name)",
            f"/[^{_CONTROL}\"'\\\\]*",
            4096,
            "use an absolute path without quotes, backslashes, '.', '..' or '//'",
            (_NOT_NORMAL, "a '.' or '..' component or '//'"),
            ("/usr/local/bin/llama-server", "/opt/x y/llama-server", "/opt/ik/bin/llama-server"),
            ("", "llama-server", "/opt/a'b", '/opt/a"b', "/opt/a\\b", "/a/../b", "/a\nb"),
        ),
        TextType(
            "listen",
            "an address to listen on: an IPv4 or IPv6 address (no brackets), or a host name",
            f"{_IPV4}|{_IPV6}|{_DNS_NAME}",
            253,
            'write an IP address ("127.0.0.1", "0.0.0.0", "::1") or a host name',
            None,
            ("127.0.0.1", "0.0.0.0", "::", "::1", "fe80::1", "2001:db8::8:800:200c:417a", "box1"),
            (
                "",
                "not an address!",
                "0.0.0.0\n",
                "[::1]",
                "1.2.3.4:80",
                "a..b",
                "::::::",
                "-x",
                "0",
                "127.1",
                "0x7f.1",
                "1.2.3.999",
            ),
        ),
        TextType(
            "ssh_target",
            "an ssh target: HOST, USER@HOST, USER@HOST:PORT, ssh://USER@HOST:PORT, [IPv6]:PORT "
            "or a Host of your ssh config",
            "(\\[|[A-Za-z0-9_])(\\[|[]]|[A-Za-z0-9_.@:/$-])*",
            255,
            "write USER@HOST, USER@HOST:PORT, ssh://USER@HOST:PORT, [IPv6]:PORT or a Host of "
            "your ssh config",
            None,
            ("root@gpu1", "admin@box3:2222", "ssh://a@b:22", "[fe80::1]:22", "gpu1"),
            ("", "-oProxyCommand=x", "a b", "a\nb", "a;b", "a`id`"),
        ),
        TextType(
            "version",
            "a release number (PEP 440: 1.2.3, 1.2.3rc1, 1.2.3.post1, 1.2.3.dev4)",
            "[0-9]+(\\.[0-9]+)*((a|b|rc)[0-9]+)?(\\.post[0-9]+)?(\\.dev[0-9]+)?",
            32,
            'write a release number, e.g. "1.106.12"',
            None,
            ("1.106.12", "1.2", "2.0rc1", "1.0.post2", "3.1.dev0"),
            ("", "../../../../etc", "latest", "1.0 ; x", "v1.2", "1..2"),
        ),
        TextType(
            "env_name",
            "an environment variable's name (none that the dynamic loader, glibc or Python "
            "obey: a keyed unit's readiness check runs as root under the unit's environment)",
            "[A-Za-z_][A-Za-z0-9_]*",
            128,
            "use letters, digits and '_', not starting with a digit, and none of LD_*, "
            "PYTHON*, HOME (Python's user site), GLIBC_TUNABLES, MALLOC_* or glibc's other "
            "variables it ignores for setuid programs (install libraries where the loader finds "
            "them: the Nix build's RUNPATH, or /etc/ld.so.conf.d)",
            (
                "(LD_|PYTHON|MALLOC_)[A-Za-z0-9_]*|GLIBC_TUNABLES|GCONV_PATH|GETCONF_DIR"
                "|HOSTALIASES|LOCALDOMAIN|LOCPATH|NIS_PATH|NLSPATH|RESOLV_HOST_CONF|RES_OPTIONS"
                "|TMPDIR|TZDIR|HOME",
                "a variable that changes what a root process loads or runs",
            ),
            ("CUDA_VISIBLE_DEVICES", "_x", "OMP_NUM_THREADS", "XLD_PRELOAD", "MYPYTHONPATH"),
            (
                "",
                "1X",
                "A-B",
                "A B",
                "A=B",
                "A\nB",
                "LD_PRELOAD",
                "LD_LIBRARY_PATH",
                "PYTHONPATH",
                "PYTHONWARNINGS",
                "GCONV_PATH",
                "GLIBC_TUNABLES",
                "HOME",
            ),
        ),
        TextType(
            "text",
            "text with no control characters (line breaks, tabs)",
            f"[^{_CONTROL}]*",
            4096,
            "remove the line breaks and other control characters",
            None,
            ("x", "", "a b", "50%", '"q"', "$HOME", "ü"),
            ("x\nExecStartPre=+/usr/bin/touch /root/pwned", "a\rb", "a\tb", "\x1b[31m"),
        ),
        TextType(
            "word",
            "one argv word with no control characters",
            f"[^{_CONTROL}]*",
            4096,
            "remove the line breaks and other control characters",
            None,
            ("--mlock", "--override-kv", "a b", "x=%d"),
            ("--a\n--b", "\x00", "a\tb"),
        ),
        TextType(
            "cuda_arch",
            'a CUDA compute capability, e.g. "8.6" or "12.0" (an "a" or "f" suffix for the '
            "architecture-specific targets)",
            "[0-9]+\\.[0-9]+[af]?",
            8,
            'write it like "8.6" or "12.0"',
            None,
            ("8.6", "12.0", "9.0a", "10.0f"),
            ("", "sm_86", "86", "8.6 ", "8.6\n"),
        ),
        TextType(
            "devices",
            'devices as --list-devices names them, comma-separated, or "none"',
            "[A-Za-z0-9_]+(,[A-Za-z0-9_]+)*",
            256,
            'write e.g. "CUDA1" or "CUDA0,CUDA1", or "none"',
            None,
            ("CUDA1", "CUDA0,CUDA1", "none"),
            ("", "CUDA0, CUDA1", "a;b", "x\n"),
        ),
    )
}


@cache
def _compiled(kind: TextKind) -> re.Pattern[str]:
    return re.compile(TYPES[kind].pattern)


def text_problem(kind: TextKind, value: str) -> str | None:
    """Why ``value`` is not of type ``kind`` (one clause, the value shown escaped), or None."""
    t = TYPES[kind]
    shown = _shown(value)
    if "\x00" in value:
        return f"{shown} holds a NUL byte"
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > t.max_length:
        # Bytes, as Nix's stringLength counts them.
        return f"{_shown(value[:40])}... is {size} bytes long, above {t.max_length}"
    control = next((ch for ch in value if ord(ch) < 32 or ord(ch) == 127), None)
    if control is not None and kind in ("path", "program", "text", "word"):
        return f"{shown} holds the control character {control!r}"
    if not _compiled(kind).fullmatch(value):
        return f"{shown} is not {_article(t.doc)}"
    if t.forbidden and re.fullmatch(t.forbidden[0], value, re.DOTALL):
        return f"{shown} holds {t.forbidden[1]}"
    return None


def _article(doc: str) -> str:
    """The type's name as a message says it: its doc up to the first explanation."""
    return doc.split(" (")[0].split(":")[0]


def _shown(value: str) -> str:
    """A value as one line, quoted: control characters (and Unicode's line breaks) escaped,
    so an error never breaks a line or moves the cursor."""
    return "'" + one_line(value.replace("\\", "\\\\")).replace("'", "\\'") + "'"


def shown(value: str) -> str:
    """``value`` quoted and escaped for a one-line message."""
    return _shown(value)


def types_json() -> JsonObject:
    """The table as ``data/schema.json`` carries it (under ``types``)."""
    return {kind: t.to_json() for kind, t in TYPES.items()}


def child_name(name: str) -> str:
    """``name`` as one file name inside a directory, or ValueError: no '/', not empty, not
    '.' or '..', no control character. Every path made from a name (a unit file, a state
    directory, a record read back from disk) goes through here before anything is written or
    deleted, so that no name, however it reached us, leaves its directory."""
    if (
        not name
        or name in (".", "..")
        or "/" in name
        or any(ord(ch) < 32 or ord(ch) == 127 for ch in name)
        or len(name.encode("utf-8", "surrogatepass")) > 255
    ):
        raise ValueError(f"{shown(name)} is not a file name inside its directory")
    return name
