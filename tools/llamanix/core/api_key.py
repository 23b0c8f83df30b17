"""Reading an API key from its file: the one reader every command and check uses.

Here rather than next to the HTTP client so that ``llamanix readiness`` (every keyed unit's
``ExecStartPost=``) reads a key without importing an HTTP library.
"""

from __future__ import annotations

from pathlib import Path

from llamanix.core import file_reader
from llamanix.core.errors import Problem, UserError

# A key file holds a key or a few: anything larger is some other file.
KEY_FILE_LIMIT = 64 * 1024

__all__ = ["key_env", "key_if_readable", "read_api_key"]


def key_env(instance: str) -> str:
    """The variable a gateway replica's key reaches LiteLLM through (``os.environ/NAME`` in its
    config): the instance's name in upper case, other characters as ``_``. Two names that
    differ only there share one variable, which validate refuses."""
    return "LLAMANIX_KEY_" + "".join(ch if ch.isalnum() else "_" for ch in instance.upper())


def read_api_key(path: Path, field: str = "--api-key-file") -> str | None:
    """The key in a key file (whitespace around it ignored; an empty file means no key), or
    one line naming the file and ``field`` when it cannot be read."""
    data = file_reader.read_bytes(path, limit=KEY_FILE_LIMIT, field=field)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        # Where and which byte would be a piece of the key: the line says neither.
        raise UserError(
            Problem(str(path), field, "is not UTF-8 text", "give a file holding the key as text")
        ) from None
    return text.strip() or None


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
