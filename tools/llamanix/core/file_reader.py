"""The one way llamanix reads a file: a regular file only, up to a size bound, and every way it
can fail as one line naming the file and the fix.

Configs, records, manifests, key files, prompt files and the headers of GGUFs all come through
here, so none of them can hang on a FIFO, read ``/dev/zero`` until killed, follow a symlink
loop into a traceback, or hand a parser more nesting than Python's stack holds:

- the path is looked at before it is opened (``stat``, following symlinks as a read would):
  a FIFO, a device, a socket or a directory is refused without opening it (opening a FIFO
  waits for a writer; opening some devices does something);
- it is opened without blocking and checked again (``fstat``) in case it was replaced between;
- at most ``limit`` bytes are read (a file in /proc says it is empty and is not);
- a path the kernel cannot take (a NUL byte in it, too long, a loop of symlinks) is a refusal
  like any other, with the path shown escaped and, when very long, shortened;
- text is UTF-8 (a byte order mark is allowed), with the line and column of the first byte
  that is not;
- JSON refuses a key given twice in one object (Python's reader keeps the last silently), and
  JSON and TOML refuse nesting deeper than ``MAX_DEPTH``.

Every refusal is a ``FileRefused``, a ``UserError``: one line, exit code 2. A caller that reads
leniently (a record a killed command may not have written) catches it; the ``*_if_present``
readers already return None for a file that is not there.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from llamanix.core.errors import Problem, UserError, printable
from llamanix.core.json_value import JsonObject, JsonValue

__all__ = [
    "LIMIT",
    "MAX_DEPTH",
    "FileRefused",
    "decode_utf8",
    "depth",
    "json_if_present",
    "open_regular",
    "parse_json",
    "parse_toml",
    "read_bytes",
    "read_json",
    "read_text",
    "read_toml",
    "shown_path",
    "text_if_present",
]

# The most any file llamanix reads may hold (a generous multiple of the largest config, record
# or manifest llamanix writes); prompt files may pass a larger bound.
LIMIT = 16 * 1024 * 1024
# The deepest nesting of tables and lists a config or record may have (a config needs 5).
MAX_DEPTH = 64
# Paths longer than _SHOWN_MAX are shown by their first _SHOWN_HEAD characters and their
# length (which leaves a path shown so as it is: shortening is done once).
_SHOWN_MAX = 200
_SHOWN_HEAD = 160
_BOM = b"\xef\xbb\xbf"


class FileRefused(UserError):
    """A file llamanix cannot or will not read, as one line naming it."""

    def __init__(self, problem: Problem, errno_: int | None = None) -> None:
        super().__init__(problem)
        self.errno = errno_


def shown_path(path: str | Path) -> str:
    """A path as one printable line (see ``errors.printable``), a very long one cut to its
    head and its length."""
    text = os.fspath(path)
    escaped = printable(text)
    if len(escaped) > _SHOWN_MAX:
        return f"{escaped[:_SHOWN_HEAD]}... ({len(text)} characters)"
    return escaped


def _refuse(
    source: str, message: str, fix: str, field: str = "", code: int | None = None
) -> FileRefused:
    return FileRefused(Problem(shown_path(source), field, message, fix), code)


_KINDS = (
    (stat.S_ISDIR, "is a directory", "name the file in it"),
    (stat.S_ISFIFO, "is a FIFO (named pipe)", "name a regular file: llamanix reads no pipes"),
    (stat.S_ISCHR, "is a character device", "name a regular file: llamanix reads no devices"),
    (stat.S_ISBLK, "is a block device", "name a regular file: llamanix reads no devices"),
    (stat.S_ISSOCK, "is a socket", "name a regular file: llamanix reads no sockets"),
)


def _not_regular(mode: int, source: str, field: str, linked: bool = False) -> FileRefused | None:
    if stat.S_ISREG(mode):
        return None
    for test, message, fix in _KINDS:
        if test(mode):
            said = message.replace("is ", "links to ", 1) if linked else message
            return _refuse(source, said, fix, field)
    return _refuse(source, "is not a regular file", "name a regular file", field)


def _is_link(path: Path) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(path).st_mode)
    except OSError:
        return False


# errno -> (what is wrong, how to fix it); the rest are said in the kernel's words.
_ERRNO = {
    errno.ENOENT: ("no such file", "check the path"),
    errno.ENOTDIR: ("a part of the path is not a directory", "check the path"),
    errno.ELOOP: (
        "a loop of symbolic links (or too many of them)",
        "point the link at the file itself",
    ),
    errno.ENAMETOOLONG: ("the path is too long", "give a shorter path"),
    errno.EACCES: ("permission denied", "run as a user who may read it, or change its mode"),
    errno.EPERM: ("permission denied", "run as a user who may read it, or change its mode"),
}


def _os_error(err: OSError, source: str, field: str) -> FileRefused:
    code = err.errno or 0
    message, fix = _ERRNO.get(code, (f"cannot read: {err.strerror or err}", "check the file"))
    return _refuse(source, message, fix, field, code)


@contextmanager
def _opened(path: Path, source: str, field: str) -> Iterator[int]:
    """A descriptor of ``path``, a regular file: refused before opening anything else."""
    try:
        before = os.stat(path)
    except OSError as err:
        raise _os_error(err, source, field) from None
    except ValueError:  # "embedded null byte"
        raise _refuse(
            source, "the path holds a NUL byte", "remove it from the path", field
        ) from None
    refused = _not_regular(before.st_mode, source, field, _is_link(path))
    if refused is not None:
        raise refused
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as err:
        raise _os_error(err, source, field) from None
    try:
        refused = _not_regular(os.fstat(fd).st_mode, source, field)  # replaced since the stat
        if refused is not None:
            raise refused
        yield fd
    finally:
        os.close(fd)


def _source(path: Path, source: str | None) -> str:
    return source if source is not None else shown_path(path)


@contextmanager
def open_regular(path: Path, *, source: str | None = None, field: str = "") -> Iterator[IO[bytes]]:
    """``path`` opened for reading in binary (for a caller that maps or seeks it, as the GGUF
    readers do); a FileRefused when it is not a regular file or cannot be opened."""
    where = _source(path, source)
    with _opened(path, where, field) as fd, os.fdopen(os.dup(fd), "rb") as fh:
        yield fh


def read_bytes(
    path: Path, *, limit: int = LIMIT, source: str | None = None, field: str = ""
) -> bytes:
    """The bytes of ``path``, a regular file of at most ``limit`` bytes."""
    where = _source(path, source)
    chunks: list[bytes] = []
    size = 0
    with _opened(path, where, field) as fd:
        while size <= limit:
            try:
                chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            except OSError as err:
                raise _os_error(err, where, field) from None
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            size += len(chunk)
    raise _refuse(
        where,
        f"larger than {_size(limit)}: not a file llamanix reads",
        "check that the path names the right file",
        field,
    )


def _size(n: int) -> str:
    return f"{n // (1024 * 1024)} MiB" if n >= 1024 * 1024 else f"{n} bytes"


def decode_utf8(data: bytes, source: str, field: str = "") -> str:
    """``data`` as UTF-8 text (a leading byte order mark dropped); else one line naming the
    line and column of the first byte that is not UTF-8."""
    try:
        return data.removeprefix(_BOM).decode("utf-8")
    except UnicodeDecodeError as err:
        start = err.start + (len(_BOM) if data.startswith(_BOM) else 0)
        line = data.count(b"\n", 0, start) + 1
        column = start - (data.rfind(b"\n", 0, start) + 1) + 1
        raise _refuse(
            source,
            f"line {line}, column {column}: byte 0x{data[start]:02x} is not UTF-8",
            "save the file as UTF-8, e.g. with iconv -f latin1 -t utf-8",
            field,
        ) from None


def read_text(path: Path, *, limit: int = LIMIT, source: str | None = None, field: str = "") -> str:
    """The text of ``path``: ``read_bytes``, then ``decode_utf8``."""
    where = _source(path, source)
    return decode_utf8(read_bytes(path, limit=limit, source=where, field=field), where, field)


def text_if_present(
    path: Path, *, limit: int = LIMIT, source: str | None = None, field: str = ""
) -> str | None:
    """``read_text``, or None when there is no such file (nothing at the path)."""
    try:
        return read_text(path, limit=limit, source=source, field=field)
    except FileRefused as err:
        if err.errno == errno.ENOENT:
            return None
        raise


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _unique_keys(pairs: list[tuple[str, JsonValue]]) -> JsonObject:
    found: JsonObject = {}
    for key, value in pairs:
        if key in found:
            raise _DuplicateKey(key)
        found[key] = value
    return found


def depth(value: object) -> int:
    """How deeply lists and tables nest in ``value`` (a scalar is 0), without recursion."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict):
            children: list[object] = list(node.values())
        elif isinstance(node, list):
            children = list(node)
        else:
            continue
        deepest = max(deepest, level + 1)
        if deepest > MAX_DEPTH:
            return deepest
        stack.extend((child, level + 1) for child in children)
    return deepest


def _too_deep(source: str, field: str, what: str) -> FileRefused:
    return _refuse(
        source,
        f"{what}: tables and lists nest more than {MAX_DEPTH} levels deep",
        "no llamanix file nests that deep: check that this is the right file",
        field,
    )


def parse_json(text: str, source: str, field: str = "") -> JsonValue:
    """JSON text as Python values; one line for a syntax error (its line and column), a key
    given twice in one object, nesting deeper than ``MAX_DEPTH``, or a number Python will not
    read."""
    try:
        data: JsonValue = json.loads(text, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as err:
        raise _refuse(
            source,
            f"JSON syntax error at line {err.lineno}, column {err.colno}: {err.msg}",
            "fix the syntax at that line and column",
            field,
        ) from None
    except _DuplicateKey as err:
        raise _refuse(
            source,
            f"the key {json.dumps(err.key)} appears twice in one object",
            "keep one of them: JSON readers disagree on which one counts",
            field,
        ) from None
    except RecursionError:
        raise _too_deep(source, field, "JSON") from None
    except ValueError as err:  # an integer of more digits than Python converts
        raise _refuse(source, f"JSON: {err}", "check that this is the right file", field) from None
    if depth(data) > MAX_DEPTH:
        raise _too_deep(source, field, "JSON")
    return data


def parse_toml(text: str, source: str, field: str = "") -> dict[str, object]:
    """TOML text as a table; one line for a syntax error, nesting deeper than ``MAX_DEPTH``,
    or a number Python will not read."""
    import tomllib  # here: ``llamanix readiness`` reads a key file and never TOML

    try:
        data: dict[str, object] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise _refuse(
            source, f"TOML syntax error: {err}", "fix the syntax at that line and column", field
        ) from None
    except RecursionError:
        raise _too_deep(source, field, "TOML") from None
    except ValueError as err:  # an integer of more digits than Python converts
        raise _refuse(source, f"TOML: {err}", "check that this is the right file", field) from None
    if depth(data) > MAX_DEPTH:
        raise _too_deep(source, field, "TOML")
    return data


def read_json(
    path: Path, *, limit: int = LIMIT, source: str | None = None, field: str = ""
) -> JsonValue:
    where = _source(path, source)
    return parse_json(read_text(path, limit=limit, source=where, field=field), where, field)


def json_if_present(
    path: Path, *, limit: int = LIMIT, source: str | None = None, field: str = ""
) -> JsonValue | None:
    """``read_json``, or None when there is no such file."""
    where = _source(path, source)
    text = text_if_present(path, limit=limit, source=where, field=field)
    return None if text is None else parse_json(text, where, field)


def read_toml(
    path: Path, *, limit: int = LIMIT, source: str | None = None, field: str = ""
) -> dict[str, object]:
    where = _source(path, source)
    return parse_toml(read_text(path, limit=limit, source=where, field=field), where, field)
