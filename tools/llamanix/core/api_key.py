"""Reading an API key from its file: the one reader every command and check uses.

llama-server reads ``--api-key-file`` as one key per line, skipping empty lines and lines that
start with ``#``, and takes each line exactly as it is (spaces and a carriage return included).
A client needs one of those keys: llamanix uses the first, read the same way, and refuses one
that no HTTP client could send as the server holds it. No message here ever carries a key's
bytes: a line is named by its number.

Here rather than next to the HTTP client so that ``llamanix readiness`` (every keyed unit's
``ExecStartPost=``) reads a key without importing an HTTP library.
"""

from __future__ import annotations

import re
from pathlib import Path

from llamanix.core import file_reader
from llamanix.core.errors import Problem, UserError

# A key file holds a key or a few: anything larger is some other file.
KEY_FILE_LIMIT = 64 * 1024

__all__ = ["first_key", "key_env", "key_if_readable", "read_api_key"]

# What an Authorization header carries unchanged: printable ASCII, spaces only inside.
_PRINTABLE = frozenset(range(0x20, 0x7F))
# A bearer token (RFC 6750's b64token). Root reads key files and sends their first key to the
# port a config names: a first line of another shape (a password hash, a PEM or ssh key's
# header) is some other file, and is never sent.
_TOKEN = re.compile(rb"[A-Za-z0-9._~+/-]+=*")


def key_env(instance: str) -> str:
    """The variable a gateway replica's key reaches LiteLLM through (``os.environ/NAME`` in its
    config): the instance's name in upper case, other characters as ``_``. Two names that
    differ only there share one variable, which validate refuses."""
    return "LLAMANIX_KEY_" + "".join(ch if ch.isalnum() else "_" for ch in instance.upper())


def _unsendable(line: bytes) -> tuple[str, str] | None:
    """(what is wrong, the fix) when ``line``, taken whole as llama-server takes it, is no key
    a client can send; None when it is one."""
    if line.endswith(b"\r"):
        return (
            "ends in a carriage return (the file has Windows line ends): llama-server keeps it "
            "as part of the key, and no HTTP client can send it",
            "save the file with Unix line ends, e.g. sed -i 's/\\r$//' FILE",
        )
    if line != line.strip(b" \t"):
        return (
            "has spaces or tabs around the key: llama-server keeps them as part of the key, "
            "and HTTP drops them from a header",
            "remove them",
        )
    if any(byte not in _PRINTABLE for byte in line):
        return (
            "holds a character an HTTP header cannot carry (a control character or non-ASCII)",
            "use a key of printable ASCII characters",
        )
    if not _TOKEN.fullmatch(line):
        return (
            "is not a bearer token (letters, digits and '-._~+/', then '=' padding): llamanix "
            "sends no other line, as it may be another file's secret",
            "write a key such as the output of: openssl rand -hex 32",
        )
    return None


def first_key(data: bytes, source: str, field: str) -> str | None:
    """The first key of a key file's bytes, as llama-server reads the file (one key per line,
    empty lines and ``#`` lines skipped); None when it holds none (llama-server then asks for
    no key). UserError naming ``source``, ``field`` and the line, never its text, when that
    key could not be sent."""
    for number, line in enumerate(data.split(b"\n"), start=1):
        if not line or line.startswith(b"#"):
            continue
        wrong = _unsendable(line)
        if wrong is not None:
            message, fix = wrong
            raise UserError(Problem(source, field, f"line {number} {message}", fix))
        return line.decode("ascii")
    return None


def read_api_key(path: Path, field: str = "--api-key-file") -> str | None:
    """The first key in a key file (``first_key``), read by the one bounded reader, or one
    line naming the file and ``field`` when it cannot be read or its first key cannot be sent."""
    data = file_reader.read_bytes(path, limit=KEY_FILE_LIMIT, field=field)
    return first_key(data, str(path), field)


def key_if_readable(path: str | Path | None) -> str | None:
    """The key in an instance's ``api_key_file`` when that file is readable here, else None:
    a key file on another host, or one only root may read, leaves the caller to check what it
    can without the key (the server then answers 401, which says so)."""
    if path is None:
        return None
    try:
        return read_api_key(Path(path), "api_key_file")
    except UserError:
        return None
