"""Bad files: one line naming the file and the fix, exit 2, nothing written, never a traceback
or a hang. Each case runs the real CLI in a process of its own, with a time limit.

Every file llamanix reads goes through one reader (``llamanix.core.file_reader``); these cases
are what was seen to hang, read until killed, or end in a traceback before it. The fuzzer over
the same reader is tests/test_property_files.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest
from cli_run import run_llamanix
from standins import recorded, stand_in

from llamanix.state.generations import GenerationRecord, HostState, ManagerRecord

# A bad file must be refused well within this (a hang or a read of /dev/zero never ends).
LIMIT_S = 30

CONFIG = """\
[hosts.gpu1]
kind = "systemd-user"
binaries = { upstream = "/opt/llama/bin/llama-server" }

[instances.qwen]
model = "/srv/models/q.gguf"
port = 18123
"""

JSON_CONFIG = """\
{"hosts": {"gpu1": {"kind": "systemd-user",
                    "binaries": {"upstream": "/opt/llama/bin/llama-server"}}},
 "instances": {"qwen": {"model": "/srv/models/q.gguf", "port": 18123}}}
"""

NOT_UTF8 = b'{"instances": {"caf\xe9": {}}}\n'


llamanix = partial(run_llamanix, timeout=LIMIT_S, errors="replace")


def tree(root: Path) -> dict[str, tuple[str, int, int]]:
    """Every entry under ``root`` (not followed: a FIFO is never opened): kind, size, mtime."""
    found: dict[str, tuple[str, int, int]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath) / name
            st = path.lstat()
            kind = "link" if path.is_symlink() else "dir" if path.is_dir() else "file"
            found[str(path.relative_to(root))] = (kind, st.st_size, st.st_mtime_ns)
    return found


def config(d: Path, text: str = CONFIG, name: str = "llamanix.toml") -> Path:
    path = d / name
    path.write_text(text)
    return path


def with_generation(d: Path) -> tuple[Path, HostState]:
    """A config with one recorded generation that serves (as a switch leaves it)."""
    path = config(d)
    state = HostState.beside(path, "gpu1")
    files = {"manifest.json": '{"kind": "systemd-user", "instances": {}}\n'}
    gen = state.create(files, path.read_text(), ".toml", GenerationRecord())
    state.set_current(gen)
    state.set_manager(ManagerRecord("systemd-user", units_dir=str(d / "units")))
    return path, state


@dataclass(frozen=True)
class Case:
    """``setup(tmp)`` makes the bad file and returns the arguments and the file the one line
    must begin with; ``says`` is what the line must say is wrong."""

    id: str
    setup: Callable[[Path], tuple[list[str], str]]
    says: str


def _deep_toml(d: Path) -> tuple[list[str], str]:
    path = d / "llamanix.toml"
    path.write_text("a = " + "[" * 100_000 + "\n")
    return ["validate", str(path)], str(path)


def _deep_json(d: Path) -> tuple[list[str], str]:
    path = d / "llamanix.json"
    path.write_text('{"a": ' + "[" * 100_000 + "\n")
    return ["validate", str(path)], str(path)


def _symlink_loop(d: Path) -> tuple[list[str], str]:
    (d / "a.toml").symlink_to("b.toml")
    (d / "b.toml").symlink_to("a.toml")
    return ["validate", str(d / "a.toml")], str(d / "a.toml")


def _nul_in_model(d: Path) -> tuple[list[str], str]:
    path = config(d, CONFIG.replace("q.gguf", "q\\u0000.gguf"))
    return ["validate", str(path)], f"{path}: instances.qwen.model: holds a NUL byte"


def _nul_through_set(d: Path) -> tuple[list[str], str]:
    path = config(d)
    units = d / "units"
    args = ["switch", str(path), "--units-dir", str(units), "--dry-run"]
    args += ["--set", 'instances.qwen.model="/srv/models/q\\u0000.gguf"']
    return args, f"{path}: instances.qwen.model: holds a NUL byte"


def _long_name(d: Path) -> tuple[list[str], str]:
    name = "a" * 100_000
    return ["validate", name], "a" * 100


def _dev_zero(d: Path) -> tuple[list[str], str]:
    (d / "llamanix.toml").symlink_to("/dev/zero")
    return ["validate", str(d / "llamanix.toml")], str(d / "llamanix.toml")


def _fifo(d: Path) -> tuple[list[str], str]:
    os.mkfifo(d / "llamanix.toml")
    return ["validate", str(d / "llamanix.toml")], str(d / "llamanix.toml")


def _not_utf8_config(d: Path) -> tuple[list[str], str]:
    (d / "llamanix.toml").write_bytes(b'[hosts.gpu1]\nkind = "caf\xe9"\n')
    return ["validate", str(d / "llamanix.toml")], str(d / "llamanix.toml")


def _duplicate_key(d: Path) -> tuple[list[str], str]:
    text = JSON_CONFIG.replace('"port": 18123', '"port": 18123, "port": 18124')
    path = config(d, text, "llamanix.json")
    return ["validate", str(path)], f'{path}: the key "port" appears twice'


def _result_json(d: Path) -> tuple[list[str], str]:
    path, state = with_generation(d)
    record = state.generations()[-1].path / "result.json"
    record.write_bytes(NOT_UTF8)
    return ["generations", str(path), "--host", "gpu1"], str(record)


def _manager_json(d: Path) -> tuple[list[str], str]:
    path, state = with_generation(d)
    (state.root / "manager.json").write_bytes(NOT_UTF8)
    args = ["switch", str(path), "--set", "instances.qwen.context=2048", "--dry-run"]
    return args, str(state.root / "manager.json")


def _manifest_json(d: Path) -> tuple[list[str], str]:
    path, state = with_generation(d)
    manifest = state.generations()[-1].path / "files" / "manifest.json"
    manifest.write_bytes(NOT_UTF8)
    args = ["switch", str(path), "--units-dir", str(d / "units"), "--dry-run"]
    return args, str(manifest)


def _current_not_a_number(d: Path) -> tuple[list[str], str]:
    path, state = with_generation(d)
    (state.root / "current").write_text("²\n")
    return ["generations", str(path), "--host", "gpu1"], str(state.root / "current")


def _synth_into_proc(d: Path) -> tuple[list[str], str]:
    return ["testbed", "synth-model", "/proc/nope.gguf", "--layers", "1"], "/proc/nope.gguf"


def _key_file_fifo(d: Path) -> tuple[list[str], str]:
    os.mkfifo(d / "key")
    return ["bench", "run", "--url", "http://127.0.0.1:9", "--api-key-file", str(d / "key")], str(
        d / "key"
    )


def _prompts_dev_zero(d: Path) -> tuple[list[str], str]:
    (d / "prompts.json").symlink_to("/dev/zero")
    args = ["bench", "run", "--url", "http://127.0.0.1:9", "--prompts", str(d / "prompts.json")]
    return args, str(d / "prompts.json")


def _bench_result_deep(d: Path) -> tuple[list[str], str]:
    (d / "a.json").write_text("[" * 100_000)
    return ["bench", "compare", str(d / "a.json"), str(d / "a.json")], str(d / "a.json")


def _capabilities_fifo(d: Path) -> tuple[list[str], str]:
    path = config(d)
    os.mkfifo(d / "probe.json")
    return ["validate", "--capabilities", str(d / "probe.json"), str(path)], str(d / "probe.json")


def _gguf_fifo(d: Path) -> tuple[list[str], str]:
    os.mkfifo(d / "m.gguf")
    return ["model", "ceiling", "--gpu", "rtx3090", "--model", str(d / "m.gguf")], str(d / "m.gguf")


CASES = [
    Case("deeply nested TOML", _deep_toml, "nest more than 64 levels deep"),
    Case("deeply nested JSON", _deep_json, "nest more than 64 levels deep"),
    Case("a symlink loop", _symlink_loop, "a loop of symbolic links"),
    Case("a NUL in a model path", _nul_in_model, "holds a NUL byte"),
    Case("a NUL through --set", _nul_through_set, "holds a NUL byte"),
    Case("a path of 100 kB", _long_name, "(100000 characters): the path is too long"),
    Case("a config that links to /dev/zero", _dev_zero, "links to a character device"),
    Case("a config that is a FIFO", _fifo, "is a FIFO"),
    Case("a config that is not UTF-8", _not_utf8_config, "byte 0xe9 is not UTF-8"),
    Case("a JSON config with a key twice", _duplicate_key, "appears twice in one object"),
    Case("a result.json that is not UTF-8", _result_json, "byte 0xe9 is not UTF-8"),
    Case("a manager.json that is not UTF-8", _manager_json, "byte 0xe9 is not UTF-8"),
    Case("a manifest.json that is not UTF-8", _manifest_json, "byte 0xe9 is not UTF-8"),
    Case("a current that names no generation", _current_not_a_number, "not a generation number"),
    Case("synth-model into /proc", _synth_into_proc, "cannot write it"),
    Case("a key file that is a FIFO", _key_file_fifo, "is a FIFO"),
    Case(
        "a prompts file that links to /dev/zero", _prompts_dev_zero, "links to a character device"
    ),
    Case("a bench result nested deep", _bench_result_deep, "nest more than 64 levels deep"),
    Case("a probe file that is a FIFO", _capabilities_fifo, "is a FIFO"),
    Case("a GGUF that is a FIFO", _gguf_fifo, "is a FIFO"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_bad_file_is_one_line(case: Case, tmp_path: Path) -> None:
    args, names = case.setup(tmp_path)
    before = tree(tmp_path)
    try:
        proc = llamanix(*args, cwd=tmp_path)
    except subprocess.TimeoutExpired:
        pytest.fail(f"llamanix {args[0]} hung on it for {LIMIT_S}s")
    lines = proc.stderr.splitlines()
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert len(lines) == 1, lines
    [line] = lines
    assert line.startswith(names), line[:400]
    assert case.says in line, line[:400]
    # Ends with the fix in parentheses, and is short enough to read however long the path.
    assert line.endswith(")") and " (" in line, line[:400]
    assert len(line) < 600, line[:400]
    assert tree(tmp_path) == before


def test_a_generation_directory_not_named_by_ascii_digits_is_no_generation(
    tmp_path: Path,
) -> None:
    """``int("²")`` is 2: a directory of that name was taken for a generation and failed."""
    path, state = with_generation(tmp_path)
    (state.generations_dir / "²").mkdir()
    (state.generations_dir / "٣").mkdir()  # an Arabic-Indic three
    proc = llamanix("generations", str(path), "--host", "gpu1", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert [row["number"] for row in json.loads(proc.stdout)] == [1]


def test_a_model_that_is_a_fifo_does_not_hang_plan(tmp_path: Path) -> None:
    """plan reads each model's header for its chat template, as evidence it may lack: a FIFO
    there was opened and waited on forever."""
    os.mkfifo(tmp_path / "m.gguf")
    path = config(tmp_path, CONFIG.replace("/srv/models/q.gguf", str(tmp_path / "m.gguf")))
    proc = llamanix("plan", str(path), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "qwen" in proc.stdout


# --- a full disk during a switch ----------------------------------------------------------------

# Inside a private mount namespace (it and its tmpfs go when the process ends, however it
# ends): a fresh small tmpfs for each amount of free space, the prepared config and state
# copied in, the rest filled, one real switch, and what the disk holds before and after.
_DISK = textwrap.dedent(
    """\
    import hashlib, json, os, shutil, subprocess, sys
    src, disk, free_pages = sys.argv[1], sys.argv[2], int(sys.argv[3])
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0755", "tmpfs", disk], check=True)
    try:
        shutil.copytree(src, disk, dirs_exist_ok=True, symlinks=True)
        with open(os.path.join(disk, "filler"), "wb") as fh:
            while True:
                fs = os.statvfs(disk)
                left = fs.f_bavail * fs.f_frsize - free_pages * fs.f_frsize
                if left <= 0:
                    break
                fh.write(b"x" * min(left, 1 << 16))
                fh.flush()
        def snapshot():
            out = {}
            for dirpath, dirnames, filenames in os.walk(disk):
                for name in dirnames + filenames:
                    path = os.path.join(dirpath, name)
                    rel = os.path.relpath(path, disk)
                    if rel == "filler":
                        continue
                    if os.path.isdir(path):
                        out[rel] = "dir"
                    else:
                        with open(path, "rb") as fh:
                            out[rel] = hashlib.sha256(fh.read()).hexdigest()
            return out
        before = snapshot()
        argv = [sys.executable, "-m", "llamanix", "switch", os.path.join(disk, "llamanix.toml"),
                "--set", "instances.qwen.context=8192", "--timeout", "1"]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        print(json.dumps({"rc": proc.returncode, "stderr": proc.stderr,
                          "before": before, "after": snapshot()}))
    finally:
        subprocess.run(["umount", "-l", disk], check=False)
    """
)


def test_a_full_disk_during_a_switch_changes_nothing(tmp_path: Path) -> None:
    """A real tmpfs, filled to leave 0, 1, 2 ... pages, and a real switch on it each time until
    one gets through its staging: every one before it says so in one line and leaves the
    config and the generations exactly as they were, wherever its write failed."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs (in a private mount namespace) needs root")
    for program, package in (("mount", "mount"), ("umount", "mount"), ("unshare", "util-linux")):
        if shutil.which(program) is None:
            pytest.skip(f"{program} is missing: apt-get install {package} (.ci/run does)")
    src = tmp_path / "src"
    src.mkdir()
    path = config(src, CONFIG.replace('kind = "systemd-user"', 'kind = "nixos"'))
    (src / "flake.nix").write_text("{ outputs = _: { }; }\n")
    state = HostState.beside(path, "gpu1")
    gen = state.create(
        {"manifest.json": '{"kind": "nixos", "instances": {}}\n'},
        path.read_text(),
        ".toml",
        GenerationRecord(),
    )
    state.set_current(gen)
    state.set_manager(ManagerRecord("nixos", flake=str(src)))
    (state.root / "lock").touch()  # the lock the switch takes (an empty file, as it leaves it)
    bin_dir, record = tmp_path / "bin", tmp_path / "record.jsonl"
    stand_in(bin_dir, "nixos-rebuild", record=record)
    script = tmp_path / "disk.py"
    script.write_text(_DISK)
    disk = tmp_path / "disk"
    disk.mkdir()
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    failed_at: set[str] = set()
    for free_pages in range(40):
        inside = [sys.executable, str(script), str(src), str(disk), str(free_pages)]
        done = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "--", *inside],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=True,
        )
        run = json.loads(done.stdout)
        if recorded(record):
            break  # through its staging: nixos-rebuild ran
        lines = run["stderr"].splitlines()
        assert "Traceback" not in run["stderr"], run["stderr"][-3000:]
        assert run["rc"] == 2 and len(lines) == 1, (free_pages, run["rc"], lines)
        assert "no space left on device" in lines[0], lines
        assert "gpu1 was not switched (its config and generations are as they were)" in lines[0]
        assert run["after"] == run["before"], (free_pages, lines)
        failed_at.add(lines[0].split(":")[0].replace(str(disk), ""))
        print("DEBUG", free_pages, lines[0].replace(str(disk), ""))
    else:
        pytest.fail("no switch got through its staging on a 2 MiB tmpfs")
    # The failures fell on every write of the staging: the new generation's own files, and
    # manager.json after it, when the generation made had to be removed again.
    assert len(failed_at) >= 4, failed_at
    assert "/.llamanix-state/gpu1/manager.json" in failed_at, failed_at
    assert not list(disk.iterdir()), "the tmpfs outlived its namespace"
    shutil.rmtree(src)
