"""Random files never produce a traceback or a hang: every reader of a file llamanix reads
returns, or refuses in lines that are one line each.

The file-level side of tests/test_property.py (which fuzzes the parsed config): arbitrary bytes,
arbitrary nesting of JSON and TOML, a key given twice, every kind of file that is not a regular
file (FIFOs, devices, sockets, directories, symlink loops and dangling links, a file past the
size bound), and arbitrary names (control characters, NUL, bytes that are not UTF-8, names
longer than the kernel takes), each put where one reader reads: a config (TOML or JSON, read
or edited with ``--set``), a generation's record, manifest and ``current``, ``manager.json``,
a render's manifest, a key file, a prompts file, a probe, a bench result, a GGUF. tests/
test_bad_files.py runs the cases seen in the field through the real CLI.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llamanix.bench.bench_results import load_result
from llamanix.bench.prompts import load_prompts
from llamanix.config.model import load_config
from llamanix.core.api_key import read_api_key
from llamanix.core.errors import UserError
from llamanix.core.probe import load_capabilities
from llamanix.hosts.supervisor import load_specs
from llamanix.model.gguf_header import read_header
from llamanix.model.gguf_info import read_gguf
from llamanix.model.gguf_weights import weight_table
from llamanix.render.manifest import Manifest
from llamanix.state.config_edit import apply_sets, parse_text
from llamanix.state.generations import GenerationRecord, HostState, ManagerRecord

# A reader that takes longer than this on a file of a few kB hangs (a FIFO waited on, a
# device read): the alarm fails the example instead of the run.
HANG_S = 10

CONFIG = """\
[hosts.gpu1]
kind = "systemd-user"
binaries = { upstream = "/opt/llama/bin/llama-server" }

[instances.qwen]
model = "/srv/models/q.gguf"
port = 18123
"""
JSON_CONFIG = (
    '{"hosts": {"gpu1": {"kind": "systemd-user", "binaries": {"upstream": "/opt/l"}}},\n'
    ' "instances": {"qwen": {"model": "/srv/models/q.gguf", "port": 18123}}}\n'
)


class Hung(Exception):
    pass


@contextlib.contextmanager
def deadline() -> Iterator[None]:
    def ring(signum: int, frame: FrameType | None) -> None:
        raise Hung(f"a reader ran past {HANG_S}s: it hangs or reads without end")

    previous = signal.signal(signal.SIGALRM, ring)
    signal.alarm(HANG_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def read_or_refuse(read: Callable[[], object]) -> object:
    """``read()``'s value, or None when it refused in one line per problem."""
    with deadline():
        try:
            return read()
        except UserError as err:
            for problem in err.problems:
                line = str(problem)
                assert len(line.splitlines()) == 1, repr(line)
                assert len(line) < 2000, line[:300]
            return None


# --- where each reader reads --------------------------------------------------------------------

# Each reader: where in a fresh directory its file is, given that directory (which it may first
# fill with what else the reader needs), and the read.
Reader = tuple[Callable[[Path], Path], Callable[[Path], object]]


def _plain(name: str) -> Callable[[Path], Path]:
    return lambda d: d / name


def _state(d: Path) -> HostState:
    config = d / "llamanix.toml"
    config.write_text(CONFIG)
    state = HostState.beside(config, "gpu1")
    files = {"manifest.json": '{"kind": "systemd-user", "instances": {}}\n'}
    state.set_current(state.create(files, CONFIG, ".toml", GenerationRecord()))
    state.set_manager(ManagerRecord("systemd-user", units_dir=str(d / "units")))
    return state


def _in_state(where: Callable[[HostState], Path]) -> Callable[[Path], Path]:
    def place(d: Path) -> Path:
        path = where(_state(d))
        path.unlink()
        return path

    return place


def _whole_state(path: Path) -> object:
    """Everything a switch reads of the state ``path`` is in."""
    d = next(p for p in path.parents if p.name == ".llamanix-state").parent
    state = HostState.beside(d / "llamanix.toml", "gpu1")
    current = state.current()
    return (
        state.manager(),
        [(g.record, g.files()) for g in state.generations()],
        current and current.number,
    )


def _gguf(path: Path) -> object:
    read_header(path)  # lenient: None when it does not read
    return read_gguf(path), weight_table(path)


READERS: dict[str, Reader] = {
    "config.toml": (_plain("llamanix.toml"), load_config),
    "config.json": (_plain("llamanix.json"), load_config),
    "result.json": (_in_state(lambda s: s.generations()[-1].path / "result.json"), _whole_state),
    "manifest": (
        _in_state(lambda s: s.generations()[-1].path / "files" / "manifest.json"),
        _whole_state,
    ),
    "current": (_in_state(lambda s: s.root / "current"), _whole_state),
    "manager.json": (_in_state(lambda s: s.root / "manager.json"), _whole_state),
    "render": (_plain("manifest.json"), lambda p: (Manifest.load(p.parent), load_specs(p.parent))),
    "key": (_plain("key"), read_api_key),
    "prompts": (_plain("prompts.json"), lambda p: load_prompts(str(p))),
    "probe": (_plain("probe.json"), load_capabilities),
    "bench result": (_plain("result.json"), load_result),
    "gguf": (_plain("model.gguf"), _gguf),
}
READER_NAMES = st.sampled_from(sorted(READERS))
# The readers of a file a user names (the state's files have the names llamanix gives them).
NAMED_READERS = st.sampled_from(
    ["config.toml", "config.json", "render", "key", "prompts", "probe", "bench result", "gguf"]
)


def _fresh() -> contextlib.AbstractContextManager[str]:
    return tempfile.TemporaryDirectory(prefix="llamanix-fuzz.")


# --- contents -------------------------------------------------------------------------------------


def _nested_json(depth: int, opener: str) -> str:
    return {"[": "[" * depth + "]" * depth, "{": '{"a": ' * depth + "1" + "}" * depth}[opener]


def _nested_toml(depth: int, shape: str) -> str:
    if shape == "array":
        return "a = " + "[" * depth + "]" * depth + "\n"
    if shape == "inline":
        return "a = " + "{b = " * depth + "1" + "}" * depth + "\n"
    if shape == "dotted":
        return ".".join(["a"] * max(depth, 1)) + " = 1\n"
    return "[" + ".".join(["a"] * max(depth, 1)) + "]\nb = 1\n"


NESTING = st.one_of(
    st.builds(_nested_json, st.integers(0, 20_000), st.sampled_from("[{")),
    st.builds(
        _nested_toml,
        st.integers(0, 20_000),
        st.sampled_from(["array", "inline", "dotted", "header"]),
    ),
).map(str.encode)


@st.composite
def _mutated(draw: st.DrawFn) -> bytes:
    """A valid config (TOML or JSON) with bytes put in, taken out or changed at random."""
    data = bytearray(draw(st.sampled_from([CONFIG, JSON_CONFIG])).encode())
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data)))
        what = draw(st.sampled_from(["insert", "delete", "replace"]))
        chunk = draw(st.binary(min_size=1, max_size=8))
        if what == "insert":
            data[at:at] = chunk
        elif what == "delete":
            del data[at : at + len(chunk)]
        else:
            data[at : at + len(chunk)] = chunk
    return bytes(data)


@st.composite
def _json_with_duplicates(draw: st.DrawFn) -> bytes:
    """A JSON object whose keys may repeat, at any depth."""
    keys = st.sampled_from(["hosts", "instances", "gpu1", "qwen", "port", "model", "a"])
    leaves = st.one_of(st.integers(), st.text(max_size=5), st.booleans(), st.none())

    def obj(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        pairs = st.lists(st.tuples(keys, children), max_size=4)
        return pairs.map(lambda ps: "{" + ", ".join(f'"{k}": {v}' for k, v in ps) + "}")

    value = st.recursive(leaves.map(lambda v: _json_leaf(v)), obj, max_leaves=12)
    return draw(obj(value)).encode()


def _json_leaf(value: Any) -> str:
    return json.dumps(value)


CONTENTS = st.one_of(
    st.binary(max_size=600),
    NESTING,
    _mutated(),
    _json_with_duplicates(),
    st.sampled_from([b"", b"\xef\xbb\xbf", b"\x00" * 64, b"GGUF" + bytes(60), b"GGUF\x03\x00"]),
    st.integers(4300, 6000).map(lambda n: b"port = " + b"1" * n),  # past int()'s digit limit
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(READER_NAMES, CONTENTS)
def test_arbitrary_bytes_anywhere_never_traceback(reader: str, data: bytes) -> None:
    where, read = READERS[reader]
    with _fresh() as tmp:
        path = where(Path(tmp))
        path.write_bytes(data)
        read_or_refuse(lambda: read(path))


@settings(max_examples=200, deadline=None)
@given(
    st.text(max_size=40).filter(lambda s: "\n" not in s),
    st.sampled_from(["llamanix.toml", "llamanix.json"]),
)
def test_arbitrary_set_values_never_traceback(value: str, name: str) -> None:
    """``--set`` takes any text as a value: TOML that nests deep, a NUL, text that is not."""
    with _fresh() as tmp:
        path = Path(tmp) / name
        path.write_text(JSON_CONFIG if name.endswith(".json") else CONFIG)
        text = path.read_text()
        for item in (f"instances.qwen.model={value}", f"instances.qwen.{value}=1"):
            read_or_refuse(lambda: parse_text(path, apply_sets(path, text, (item,))))  # noqa: B023


# --- kinds of files -------------------------------------------------------------------------------


def _make_kind(path: Path, kind: str) -> None:
    """Put at ``path`` something that is not a readable regular file of sane size."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "socket":
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(path))
    elif kind == "loop":
        path.symlink_to(path.name)
    elif kind == "loop of two":
        other = path.with_name(path.name + ".other")
        other.symlink_to(path.name)
        path.symlink_to(other.name)
    elif kind == "dangling":
        path.symlink_to(path.name + ".gone")
    elif kind.startswith("/dev/"):
        path.symlink_to(kind)
    elif kind == "link to a fifo":
        os.mkfifo(path.with_name(path.name + ".fifo"))
        path.symlink_to(path.name + ".fifo")
    elif kind == "past the bound":
        with path.open("wb") as fh:  # sparse: costs no disk
            fh.truncate(2 * 1024 * 1024 * 1024)
    else:
        raise AssertionError(kind)


KINDS = st.sampled_from(
    [
        "fifo",
        "directory",
        "socket",
        "loop",
        "loop of two",
        "dangling",
        "/dev/zero",
        "/dev/null",
        "/dev/urandom",
        "/dev/full",
        "link to a fifo",
        "past the bound",
    ]
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(READER_NAMES, KINDS)
def test_special_files_anywhere_never_hang(reader: str, kind: str) -> None:
    where, read = READERS[reader]
    with _fresh() as tmp:
        path = where(Path(tmp))
        _make_kind(path, kind)
        read_or_refuse(lambda: read(path))


def test_a_file_past_the_bound_is_refused_by_size() -> None:
    with _fresh() as tmp:
        path = Path(tmp) / "llamanix.toml"
        _make_kind(path, "past the bound")
        try:
            load_config(path)
        except UserError as err:
            assert "larger than 16 MiB" in str(err), err
        else:
            raise AssertionError("a 2 GiB config was read")


# --- names ---------------------------------------------------------------------------------------

# A name as the kernel takes it: any bytes but "/" (NUL too, which no call takes), as long as
# the kernel takes (255 bytes) and longer.
NAMES = st.one_of(
    st.binary(min_size=1, max_size=300).filter(lambda b: b"/" not in b and b not in (b".", b"..")),
    st.integers(250, 5000).map(lambda n: b"a" * n),
    # Digits of any script ("²", "٣"), which str.isdigit and int() take for numbers.
    st.text(st.characters(categories=("Nd", "No")), min_size=1, max_size=4).map(os.fsencode),
).map(os.fsdecode)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(NAMED_READERS, NAMES, st.booleans())
def test_arbitrary_names_never_traceback(reader: str, name: str, deep: bool) -> None:
    """A file of that name (when the kernel makes one) holding a good config, or nothing there;
    and the same name as a directory on the way to it."""
    where, read = READERS[reader]
    with _fresh() as tmp:
        d = Path(tmp)
        usual = where(d)
        path = d / name / usual.name if deep else usual.with_name(name)
        with contextlib.suppress(OSError, ValueError):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(CONFIG)
        read_or_refuse(lambda: read(path))


@settings(max_examples=100, deadline=None)
@given(st.lists(NAMES, max_size=4))
def test_arbitrary_names_in_the_generations_directory(names: list[str]) -> None:
    """Only names of ASCII digits are generations; anything else there is passed over."""
    with _fresh() as tmp:
        state = _state(Path(tmp))
        for name in names:
            with contextlib.suppress(OSError, ValueError):
                (state.generations_dir / name).mkdir()
        with deadline():
            found = state.generations()
        assert 1 in [g.number for g in found]
        assert all(g.path.name.isascii() and g.path.name.isdigit() for g in found), found


@pytest.mark.parametrize(
    ("header", "keys_read"),
    [
        # a key whose length no file holds
        (struct.pack("<4sIQQQ", b"GGUF", 3, 0, 1, 2**63), False),
        # a string value as long
        (struct.pack("<4sIQQQ1sIQ", b"GGUF", 3, 0, 1, 1, b"k", 8, 2**63 - 1), False),
        # a tensor of 2**32 - 1 dimensions (the keys, none, read)
        (struct.pack("<4sIQQQ1sI", b"GGUF", 3, 1, 0, 1, b"t", 2**32 - 1), True),
        # an element of a string array as long as no file is
        (struct.pack("<4sIQQQ1sIIQQ", b"GGUF", 3, 0, 1, 1, b"a", 9, 8, 2, 2**64 - 1), False),
        # a key longer than GGUF's keys may be (65535 bytes), the file holding it
        (struct.pack("<4sIQQQ", b"GGUF", 3, 0, 1, 70_000) + b"k" * 70_000, False),
        # a tensor of 4 dimensions of 2**64 - 1 elements each, in a file of a few bytes
        (struct.pack("<4sIQQQ1sI4QIQ", b"GGUF", 3, 1, 0, 1, b"t", 4, *[2**64 - 1] * 4, 0, 0), True),
    ],
)
def test_a_gguf_with_impossible_lengths_is_refused_in_one_line(
    tmp_path: Path, header: bytes, keys_read: bool
) -> None:
    """Lengths and counts no file holds: the header reader answers None where the keys do not
    read, and the weight table is one line naming the file (they used to overflow a slice, a
    traceback)."""
    path = tmp_path / "model.gguf"
    path.write_bytes(header + bytes(64))
    assert (read_header(path) is not None) is keys_read
    with pytest.raises(UserError, match=r"model\.gguf: model: not a readable GGUF"):
        weight_table(path)
