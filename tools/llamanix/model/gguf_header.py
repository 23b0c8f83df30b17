"""A GGUF's metadata keys, read straight from its header: fast enough for ``plan``.

``gguf_info`` parses a whole model with the gguf library (every tensor, every token as a numpy
view), which takes seconds on a large vocabulary. Whether a model carries a chat template of
its own needs only the metadata keys: this walks the key/value section with ``struct`` over a
memory map, skipping fixed-size arrays in one step (a 262k-token vocabulary takes ~50 ms).
``gguf_weights`` walks it the same way (``walk_key_values``), then reads the tensor table.

A model without ``tokenizer.chat_template`` is usually a base model: llama-server then falls
back to chatml, and a base model asked through the chat endpoint continues the template's
markers instead of answering. Such a model is served raw text through ``/completion``.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from llamanix.core import file_reader
from llamanix.core.errors import UserError

CHAT_TEMPLATE_KEY = "tokenizer.chat_template"
_MAGIC = b"GGUF"
_STRING, _ARRAY = 8, 9
_UINT32, _UINT64, _INT32, _INT64 = 4, 10, 5, 11
# Bytes per value of GGUF's fixed-size types (uint8 .. float64, bool).
_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_INTEGERS = {_UINT32: "<I", _INT32: "<i", _UINT64: "<Q", _INT64: "<q"}
# GGUF's keys (and tensor names, far shorter) are at most 65535 bytes: a longer one is a
# corrupt file, not a name to copy.
MAX_NAME = 65535


@dataclass(frozen=True)
class GgufHeader:
    """The metadata keys of one GGUF, and the values of its string keys."""

    keys: frozenset[str]
    strings: dict[str, str]

    @property
    def chat_template(self) -> str | None:
        return self.strings.get(CHAT_TEMPLATE_KEY)


def read_header(path: Path) -> GgufHeader | None:
    """The header of ``path``; None when it is not a readable GGUF (missing, truncated, not
    GGUF): the callers only add a remark, and other checks name an unreadable model."""
    try:
        stat = path.stat()
        return _read_cached(path.resolve(), stat.st_mtime_ns, stat.st_size)
    except (OSError, ValueError, struct.error, KeyError, UserError):
        return None


def has_chat_template(path: Path) -> bool | None:
    """Whether the model carries a chat template; None when the file is not readable here."""
    header = read_header(path)
    return None if header is None else header.chat_template is not None


@dataclass(frozen=True)
class KeyValues:
    """A GGUF's key/value section as walked: every key, the values of its string keys and of
    its integer keys, and where its tensor table starts (``gguf_weights`` reads on from
    there)."""

    keys: frozenset[str]
    strings: dict[str, str]
    integers: dict[str, int]
    n_tensors: int
    end: int


def walk_key_values(m: mmap.mmap, size: int) -> KeyValues:
    """The key/value section of the GGUF mapped in ``m`` (``size`` bytes), skipping arrays in
    one step; ValueError, struct.error or KeyError when it is not a readable GGUF."""
    if m[:4] != _MAGIC:
        raise ValueError("no GGUF magic")
    n_tensors, n_kv = struct.unpack_from("<QQ", m, 8)
    offset = 24
    keys: set[str] = set()
    strings: dict[str, str] = {}
    integers: dict[str, int] = {}
    for _ in range(n_kv):
        key, offset = string_at(m, offset, MAX_NAME)
        (kind,) = struct.unpack_from("<I", m, offset)
        offset += 4
        keys.add(key)
        if kind == _STRING:
            strings[key], offset = string_at(m, offset)
        elif kind == _ARRAY:
            element, count = struct.unpack_from("<IQ", m, offset)
            offset += 12
            if element == _STRING:
                for _ in range(count):
                    (length,) = struct.unpack_from("<Q", m, offset)
                    offset += 8 + length
                    if offset > size:  # before the next read: no offset past the file
                        raise ValueError("truncated")
            else:
                offset += _SIZES[element] * count
        else:
            if kind in _INTEGERS:
                (integers[key],) = struct.unpack_from(_INTEGERS[kind], m, offset)
            offset += _SIZES[kind]
        if offset > size:
            raise ValueError("truncated")
    return KeyValues(frozenset(keys), strings, integers, n_tensors, offset)


@lru_cache(maxsize=32)
def _read_cached(path: Path, mtime_ns: int, size: int) -> GgufHeader:
    with (
        file_reader.open_regular(path) as fh,
        mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as m,
    ):
        kv = walk_key_values(m, size)
    return GgufHeader(kv.keys, kv.strings)


def string_at(m: mmap.mmap, offset: int, most: int | None = None) -> tuple[str, int]:
    """The GGUF string at ``offset`` (its length, then its bytes) and the offset after it;
    ValueError when it runs past the file, or is longer than ``most`` bytes."""
    (length,) = struct.unpack_from("<Q", m, offset)
    start = offset + 8
    if start + length > len(m):  # a length no file holds (a slice that long overflows)
        raise ValueError("truncated")
    if most is not None and length > most:
        raise ValueError(f"a name of {length} bytes")
    return m[start : start + length].decode("utf-8", errors="replace"), start + length
