"""Paths a unit will not see or cannot read: the rules, real files with real modes, and the
lines `llamanix validate` (exit 2) and `llamanix plan` (a warning) print for them."""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import llamanix.render.units as units
from llamanix.cli import main
from llamanix.config.model import parse_config
from llamanix.core.visibility import (
    Node,
    PathState,
    Reader,
    Role,
    Sandbox,
    finding,
    hidden_by,
    protect_home,
)
from llamanix.external.paths import path_state, script_interpreter
from llamanix.render.units import render_host

SYSTEM = Sandbox(dynamic_user=True, protect_home="yes", private_devices=True)
SYSTEM_HOME = Sandbox(dynamic_user=True, protect_home="read-only", private_devices=True)
USER_GPU = Sandbox(dynamic_user=False, protect_home="yes", private_devices=False)
DYNAMIC = Reader(None)
DIR = stat.S_IFDIR
FILE = stat.S_IFREG
MOVE_MODEL = "move it under /srv/models"
OPEN_MODEL = f"{MOVE_MODEL}, or chmod o+r it and o+x each directory above it"
VENV = (
    "install llamanix into a venv under /opt: python3 -m venv /opt/llamanix, then run "
    "/opt/llamanix/bin/llamanix"
)


def state(path: str, *dirs: tuple[str, int], target: int | None, **kw: object) -> PathState:
    """A snapshot: directories (path, mode) from / down, all owned by root, then the file."""
    nodes = tuple(Node(p, DIR | m, 0, 0) for p, m in (("/", 0o755), *dirs))
    file = None if target is None else Node(path, target, 1000, 1000)
    resolved = str(kw.get("resolved", path))
    return PathState(path, resolved, nodes, file, bool(kw.get("is_link", False)))


# --- the rules, over constructed snapshots ---------------------------------------------------


@pytest.mark.parametrize(
    ("path", "sandbox", "hidden"),
    [
        ("/tmp/q.gguf", SYSTEM, ("/tmp", "PrivateTmp=yes gives it an empty one")),
        ("/var/tmp/m/q.gguf", USER_GPU, ("/var/tmp", "PrivateTmp=yes gives it an empty one")),
        ("/dev/shm/q.gguf", SYSTEM, ("/dev/shm", "PrivateDevices=yes gives it its own /dev")),
        ("/dev/shm/q.gguf", USER_GPU, None),  # a GPU user unit keeps the host's /dev
        ("/run/user/1000/q.gguf", SYSTEM, ("/run/user", "ProtectHome=yes hides it")),
        ("/home/ann/q.gguf", SYSTEM, ("/home", "ProtectHome=yes hides it")),
        ("/home/ann/q.gguf", SYSTEM_HOME, None),
        ("/tmpfiles/q.gguf", SYSTEM, None),
        ("/srv/../tmp/q.gguf", SYSTEM, ("/tmp", "PrivateTmp=yes gives it an empty one")),
    ],
)
def test_where_a_unit_does_not_look(
    path: str, sandbox: Sandbox, hidden: tuple[str, str] | None
) -> None:
    assert hidden_by(path, sandbox) == hidden


def test_protect_home_is_read_only_when_a_path_is_in_a_home() -> None:
    assert protect_home(["/srv/q.gguf", "", "/usr/bin/llamanix"]) == "yes"
    assert protect_home(["/srv/q.gguf", "/root/bin/llama-server"]) == "read-only"
    assert protect_home(["/home/ann/q.gguf"]) == "read-only"
    assert protect_home(["/homes/q.gguf"]) == "yes"
    # A user unit's own state and cache directories are in the user's home: "yes" would hide
    # them (its start failed at CHDIR under a real user manager); tmpfs mounts them in.
    assert protect_home(["/srv/q.gguf"], user=True) == "tmpfs"
    assert protect_home(["/home/ann/q.gguf"], user=True) == "read-only"


def test_a_model_under_tmp_is_named_without_reading_anything() -> None:
    assert finding("/tmp/q.gguf", "model", SYSTEM) == (
        "/tmp/q.gguf is under /tmp, which the unit does not see: "
        "PrivateTmp=yes gives it an empty one",
        MOVE_MODEL,
    )


def test_a_symlink_into_a_hidden_directory() -> None:
    snap = state("/srv/q.gguf", ("/srv", 0o755), target=FILE | 0o644, resolved="/tmp/q.gguf")
    assert finding("/srv/q.gguf", "model", SYSTEM, snap, DYNAMIC) == (
        "/srv/q.gguf resolves to /tmp/q.gguf, under /tmp, which the unit does not see: "
        "PrivateTmp=yes gives it an empty one",
        MOVE_MODEL,
    )


def test_a_directory_the_dynamic_user_cannot_search() -> None:
    snap = state("/root/models/q.gguf", ("/root", 0o700), ("/root/models", 0o755), target=None)
    assert finding("/root/models/q.gguf", "model", SYSTEM_HOME, snap, DYNAMIC) == (
        "/root/models/q.gguf is not readable by the service's dynamic user: /root is mode 0700",
        OPEN_MODEL,
    )


def test_the_dynamic_user_gets_only_the_other_bits() -> None:
    # Group-readable and owned by uid 1000: neither helps a dynamic user.
    snap = state("/srv/q.gguf", ("/srv", 0o755), target=FILE | 0o640)
    assert finding("/srv/q.gguf", "model", SYSTEM, snap, DYNAMIC) == (
        "/srv/q.gguf is not readable by the service's dynamic user: it is mode 0640",
        OPEN_MODEL,
    )
    assert finding("/srv/q.gguf", "model", SYSTEM, snap, Reader(1000)) is None
    assert finding("/srv/q.gguf", "model", SYSTEM, snap, Reader(1001, frozenset({1000}))) is None
    assert finding("/srv/q.gguf", "model", SYSTEM, snap, Reader(0)) is None


def test_a_binary_needs_the_execute_bit() -> None:
    snap = state("/opt/llama-server", ("/opt", 0o755), target=FILE | 0o754)
    assert finding("/opt/llama-server", "binary", SYSTEM, snap, DYNAMIC) == (
        "/opt/llama-server cannot be run by the service's dynamic user: it is mode 0754",
        "install it under /opt or /usr/local, or chmod o+x it and each directory above it",
    )
    runnable = state("/opt/llama-server", ("/opt", 0o755), target=FILE | 0o711)
    assert finding("/opt/llama-server", "binary", SYSTEM, runnable, DYNAMIC) is None


def test_root_runs_only_what_someone_may_run() -> None:
    snap = state("/opt/llama-server", ("/opt", 0o700), target=FILE | 0o644)
    assert finding("/opt/llama-server", "binary", USER_GPU, snap, Reader(0)) == (
        "/opt/llama-server cannot be run by the unit's user (uid 0): it is mode 0644",
        "install it under /opt or /usr/local, or give uid 0 access to it and to each directory "
        "above it",
    )


def test_llamanix_itself_needs_read_and_execute() -> None:
    script = state("/opt/ln/bin/llamanix", ("/opt", 0o755), ("/opt/ln", 0o755), target=FILE | 0o711)
    assert finding("/opt/ln/bin/llamanix", "llamanix", SYSTEM, script, DYNAMIC) == (
        "/opt/ln/bin/llamanix cannot be run by the service's dynamic user: it is mode 0711",
        VENV,
    )
    package = state("/opt/ln/llamanix", ("/opt", 0o755), target=DIR | 0o750)
    assert finding("/opt/ln/llamanix", "llamanix", SYSTEM, package, DYNAMIC) == (
        "/opt/ln/llamanix is not readable by the service's dynamic user: it is mode 0750",
        VENV,
    )


def test_a_system_units_key_is_read_by_root_so_its_mode_does_not_matter() -> None:
    snap = state("/root/key", ("/root", 0o700), target=FILE | 0o600)
    assert finding("/root/key", "key", SYSTEM, snap, None) is None
    assert finding("/tmp/key", "key", SYSTEM) == (
        "/tmp/key is under /tmp, which a reboot or systemd-tmpfiles empties: the unit's "
        "LoadCredential= then fails its start",
        "move it where it stays, e.g. /etc/llamanix/ with mode 0600",
    )


def test_a_key_that_resolves_into_tmp() -> None:
    snap = state("/etc/k", ("/etc", 0o755), target=FILE | 0o600, resolved="/tmp/k")
    assert finding("/etc/k", "key", SYSTEM, snap, None) == (
        "/etc/k resolves to /tmp/k, under /tmp, which a reboot or systemd-tmpfiles empties: "
        "the unit's LoadCredential= then fails its start",
        "move it where it stays, e.g. /etc/llamanix/ with mode 0600",
    )


def test_a_user_units_key_must_be_readable_by_that_user() -> None:
    snap = state("/etc/k", ("/etc", 0o755), target=FILE | 0o600)  # owned by 1000
    assert finding("/etc/k", "key", USER_GPU, snap, Reader(1000)) is None
    assert finding("/etc/k", "key", USER_GPU, snap, Reader(1001)) == (
        "/etc/k is not readable by the unit's user (uid 1001): it is mode 0600",
        "give uid 1001 access to it and to each directory above it",
    )


def test_a_missing_file_is_named_and_so_is_a_dangling_symlink() -> None:
    # The file system was read (the units run here): a typo in a model path is found now, not
    # when the server fails its start. Without a snapshot (--remote) nothing is read.
    missing = state("/srv/models/q.gguf", ("/srv", 0o755), target=None)
    assert finding("/srv/models/q.gguf", "model", SYSTEM, missing, DYNAMIC) == (
        "/srv/models/q.gguf does not exist",
        "check the path; a config meant for another machine is checked with validate --remote",
    )
    assert finding("/srv/models/q.gguf", "model", SYSTEM) is None
    dangling = state(
        "/srv/q.gguf", ("/srv", 0o755), target=None, resolved="/data/q.gguf", is_link=True
    )
    assert finding("/srv/q.gguf", "model", SYSTEM, dangling, DYNAMIC) == (
        "/srv/q.gguf is a symlink to /data/q.gguf, which does not exist",
        "point it at the file",
    )


def test_without_a_snapshot_only_the_location_counts() -> None:
    assert finding("/root/q.gguf", "model", SYSTEM_HOME) is None
    assert finding("/tmp/q.gguf", "binary", SYSTEM) is not None


# --- real files with real modes --------------------------------------------------------------

REPO = Path(__file__).resolve().parent.parent


def _visible_to_anyone(directory: Path) -> bool:
    return not any(
        not os.stat(d).st_mode & 0o001
        or any(str(d).startswith(z) for z in ("/tmp", "/var/tmp", "/home", "/root"))
        for d in (directory, *directory.parents)
    )


@pytest.fixture
def base() -> Iterator[Path]:
    """A scratch directory a unit could see: the checkout when it lies in such a place, else
    /srv, /var/lib or /opt (CI clones into /tmp, which no unit sees)."""
    places = [REPO, Path("/srv"), Path("/var/lib"), Path("/opt")]
    usable = [d for d in places if d.is_dir() and os.access(d, os.W_OK) and _visible_to_anyone(d)]
    if not usable:
        pytest.skip("no directory a unit could see is writable here (checkout, /srv, /var/lib)")
    path = Path(tempfile.mkdtemp(prefix=".llamanix-visibility-", dir=usable[0]))
    try:
        path.chmod(0o755)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def make(path: Path, mode: int, text: str = "x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return path


def test_path_state_reads_modes_and_follows_symlinks(base: Path) -> None:
    private = base / "private"
    model = make(private / "q.gguf", 0o644)
    private.chmod(0o700)
    link = base / "q.gguf"
    link.symlink_to(model)
    snap = path_state(str(link))
    assert snap.resolved == str(model)
    assert snap.is_link and snap.target is not None
    assert stat.S_IMODE(snap.target.mode) == 0o644
    assert [d.path for d in snap.dirs][-2:] == [str(base), str(private)]
    assert finding(str(link), "model", SYSTEM, snap, DYNAMIC) == (
        f"{link} is not readable by the service's dynamic user: {private} is mode 0700",
        OPEN_MODEL,
    )


def test_real_files(base: Path) -> None:
    readable = make(base / "ok.gguf", 0o644)
    secret = make(base / "secret.gguf", 0o600)
    server = make(base / "bin" / "llama-server", 0o750)
    dangling = base / "gone.gguf"
    dangling.symlink_to(base / "nowhere.gguf")

    def check(path: Path, role: Role) -> tuple[str, str] | None:
        return finding(str(path), role, SYSTEM, path_state(str(path)), DYNAMIC)

    assert check(readable, "model") is None
    assert check(base / "missing.gguf", "model") == (
        f"{base / 'missing.gguf'} does not exist",
        "check the path; a config meant for another machine is checked with validate --remote",
    )
    assert check(secret, "model") == (
        f"{secret} is not readable by the service's dynamic user: it is mode 0600",
        OPEN_MODEL,
    )
    assert check(server, "binary") == (
        f"{server} cannot be run by the service's dynamic user: it is mode 0750",
        "install it under /opt or /usr/local, or chmod o+x it and each directory above it",
    )
    assert check(dangling, "model") == (
        f"{dangling} is a symlink to {base / 'nowhere.gguf'}, which does not exist",
        "point it at the file",
    )


def test_script_interpreter(base: Path) -> None:
    assert script_interpreter(str(make(base / "a", 0o755, "#!/opt/ln/bin/python3 -E\n"))) == (
        "/opt/ln/bin/python3"
    )
    assert script_interpreter(str(make(base / "b", 0o755, "#!/usr/bin/env python3\n"))) is None
    assert script_interpreter(str(make(base / "c", 0o755, "\x7fELF"))) is None
    assert script_interpreter(str(base / "none")) is None


def test_a_binary_in_a_home_directory_keeps_home_visible(tmp_path: Path) -> None:
    data = {
        "hosts": {"h": {"kind": "systemd"}},
        "instances": {"a": {"model": "/srv/q.gguf", "binary": "/home/ann/llama-server"}},
    }
    render = render_host(parse_config(data, str(tmp_path / "llamanix.toml")), "h")
    assert "ProtectHome=read-only\n" in render.instances[0].unit_text


# --- validate and plan -----------------------------------------------------------------------


@pytest.fixture
def llamanix_ok(base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """llamanix itself where a unit can run it, whatever this machine's install is."""
    command = make(base / "opt" / "bin" / "llamanix", 0o755, "#!/bin/sh\n")
    monkeypatch.setattr(units, "llamanix_paths", lambda: [str(command)])


def write_config(tmp_path: Path, base: Path, host: str = 'kind = "systemd"') -> Path:
    make(base / "models" / "ok.gguf", 0o644)
    make(base / "models" / "secret.gguf", 0o600)
    make(base / "bin" / "llama-server", 0o755)
    cfg = tmp_path / "llamanix.toml"
    cfg.write_text(
        f"[hosts.box]\n{host}\n"
        f'binaries = {{ upstream = "{base}/bin/llama-server" }}\n'
        "[instances.a]\n"
        'model = "/tmp/q.gguf"\n'
        'api_key_file = "/root/key"\n'
        "[instances.b]\n"
        f'model = "{base}/models/secret.gguf"\n'
        "port = 8081\n"
        'binary = "/var/tmp/llama-server"\n'
        "[instances.b.speculative]\n"
        'type = "draft"\n'
        f'draft_model = "{base}/models/ok.gguf"\n'
    )
    return cfg


@pytest.mark.usefixtures("llamanix_ok")
def test_validate_names_each_path_and_exits_2(tmp_path: Path, base: Path) -> None:
    cfg = write_config(tmp_path, base)
    before = sorted(tmp_path.rglob("*"))
    result = CliRunner().invoke(main, ["validate", str(cfg)])
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"{cfg}: instances.a.model: /tmp/q.gguf is under /tmp, which the unit does not see: "
        f"PrivateTmp=yes gives it an empty one ({MOVE_MODEL})",
        f"{cfg}: instances.a.api_key_file: /root/key does not exist (check the path; a config "
        "meant for another machine is checked with validate --remote)",
        f"{cfg}: instances.b.binary: /var/tmp/llama-server is under /var/tmp, which the unit does "
        "not see: PrivateTmp=yes gives it an empty one (install it under /opt or /usr/local)",
        f"{cfg}: instances.b.model: {base}/models/secret.gguf is not readable by the service's "
        f"dynamic user: it is mode 0600 ({OPEN_MODEL})",
    ]
    assert sorted(tmp_path.rglob("*")) == before  # nothing written


def test_llamanix_itself_is_named_once(
    tmp_path: Path, base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hidden = make(base / "private" / "bin" / "llamanix", 0o755)
    (base / "private").chmod(0o700)
    monkeypatch.setattr(units, "llamanix_paths", lambda: [str(hidden), "/tmp/python3"])
    cfg = tmp_path / "llamanix.toml"
    cfg.write_text(
        '[hosts.box]\nkind = "systemd"\n'
        f'binaries = {{ upstream = "{make(base / "bin" / "llama-server", 0o755)}" }}\n'
        f'[instances.a]\nmodel = "{make(base / "a.gguf", 0o644)}"\n'
        f'[instances.b]\nmodel = "{make(base / "b.gguf", 0o644)}"\nport = 9009\n'
    )
    result = CliRunner().invoke(main, ["validate", str(cfg)])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        f"{cfg}: llamanix itself: {hidden} cannot be run by the service's dynamic user: "
        f"{base / 'private'} is mode 0700 ({VENV})"
    ]


@pytest.mark.usefixtures("llamanix_ok")
def test_plan_warns_with_the_same_lines_and_exits_0(tmp_path: Path, base: Path) -> None:
    cfg = write_config(tmp_path, base)
    result = CliRunner().invoke(main, ["plan", "--json", "--no-security", str(cfg)])
    assert result.exit_code == 0, result.output
    lines = json.loads(result.stdout)["hosts"]["box"]["unseen_paths"]
    assert len(lines) == 4 and lines[0].startswith(f"{cfg}: instances.a.model: /tmp/q.gguf ")
    text = CliRunner().invoke(main, ["plan", "--no-security", str(cfg)])
    assert text.exit_code == 0
    assert [f"warning: {line}" for line in lines] == [
        line for line in text.stdout.splitlines() if line.startswith("warning: ")
    ]


@pytest.mark.usefixtures("llamanix_ok")
@pytest.mark.parametrize(
    "host",
    ['kind = "nixos"', 'kind = "systemd"\ntarget = "root@gpu1"'],
    ids=["nixos", "remote"],
)
def test_what_is_not_checked_on_nixos_and_remote_hosts(
    tmp_path: Path, base: Path, host: str
) -> None:
    cfg = write_config(tmp_path, base, host)
    result = CliRunner().invoke(main, ["validate", str(cfg)])
    if "nixos" in host:
        assert result.exit_code == 0, result.output
        return
    # A remote host's files are not here: only the locations count.
    assert result.exit_code == 2
    assert [line.split(": ")[1] for line in result.stderr.splitlines()] == [
        "instances.a.model",
        "instances.b.binary",
    ]


@pytest.mark.usefixtures("llamanix_ok")
def test_a_host_that_llamanix_up_runs_has_no_sandbox(tmp_path: Path, base: Path) -> None:
    cfg = write_config(tmp_path, base)
    state = tmp_path / ".llamanix-state" / "box"
    state.mkdir(parents=True)
    (state / "manager.json").write_text(json.dumps({"manager": "up", "units_dir": "x"}))
    result = CliRunner().invoke(main, ["validate", str(cfg)])
    assert result.exit_code == 0, result.output


@pytest.mark.usefixtures("llamanix_ok")
def test_a_user_units_key_and_home_are_checked_for_the_user(tmp_path: Path, base: Path) -> None:
    cfg = tmp_path / "llamanix.toml"
    cfg.write_text(
        '[hosts.box]\nkind = "systemd-user"\n'
        f'binaries = {{ upstream = "{make(base / "bin" / "llama-server", 0o755)}" }}\n'
        f'[instances.a]\nmodel = "{make(base / "m.gguf", 0o600)}"\n'
        'api_key_file = "/tmp/key"\n'
    )
    result = CliRunner().invoke(main, ["validate", str(cfg)])
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert [line.split(": ")[1] for line in lines] == ["instances.a.api_key_file"]
