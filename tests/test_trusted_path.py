"""Root acts only on what root alone can change: the binaries it runs to ask for --help, the
directory it keeps generations in, the key files whose first line it sends, the environment its
readiness check runs under, and the unit names the fleet agent owns (the red-team's findings
on the trust boundary, each as the attacker tried it)."""

from __future__ import annotations

import os
import stat
import subprocess
from functools import partial
from pathlib import Path

import pytest
from cli_run import run_llamanix

from llamanix.core.trusted_path import untrusted

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="root's view: run as root (CI does)")

USER = 1000


llamanix = partial(run_llamanix, timeout=60)


def evil_binary(path: Path, marker: Path) -> Path:
    """A 'llama-server' that leaves a marker when anyone runs it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\nid > {marker}\n")
    path.chmod(0o755)
    return path


def config(folder: Path, binary: Path, name: str = "chat") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "llamanix.toml"
    path.write_text(
        f'[hosts.box]\nkind = "systemd"\nbinaries = {{ upstream = "{binary}" }}\n\n'
        f'[instances.{name}]\nhost = "box"\nmodel = "/srv/models/m.gguf"\n'
    )
    return path


def refused(done: subprocess.CompletedProcess[str], *words: str) -> str:
    err = done.stderr.strip()
    assert done.returncode == 2, (done.returncode, done.stdout, err)
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, err
    return err


@pytest.mark.parametrize("command", ["switch", "probe"])
def test_a_binary_another_user_owns_is_never_run(tmp_path: Path, command: str) -> None:
    marker = tmp_path / "pwned"
    binary = evil_binary(tmp_path / "bin" / "llama-server", marker)
    os.chown(binary, USER, USER)
    cfg = config(tmp_path / "etc", binary)
    args = (
        ["switch", "--dry-run", str(cfg)]
        if command == "switch"
        else ["variant", "probe", str(binary)]
    )
    done = llamanix(*args, cwd=tmp_path)
    refused(done, f"{binary} belongs to uid {USER}", "root", "chown root")
    assert not marker.exists()


def test_a_directory_others_may_write_above_the_binary_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    shared = tmp_path / "shared"
    binary = evil_binary(shared / "llama-server", marker)
    shared.chmod(0o777)  # anyone could swap the file
    cfg = config(tmp_path / "etc", binary)
    refused(llamanix("switch", "--dry-run", str(cfg), cwd=tmp_path), "writable by its group")
    assert not marker.exists()


def test_a_link_in_a_user_directory_is_refused_though_its_target_is_roots(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    os.chown(home, USER, USER)
    real = evil_binary(tmp_path / "opt" / "llama-server", tmp_path / "pwned")
    link = home / "llama-server"
    link.symlink_to(real)
    assert untrusted(link) == f"{home} belongs to uid {USER}"
    assert untrusted(real) is None


def test_a_sticky_directory_is_trusted_for_roots_own_files(tmp_path: Path) -> None:
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    mine = sticky / "root-owned"
    mine.mkdir(mode=0o755)
    assert untrusted(mine) is None
    assert stat.S_IMODE(sticky.stat().st_mode) == 0o1777


def test_a_config_in_a_users_directory_keeps_no_generations(tmp_path: Path) -> None:
    """rollback installs the unit files kept beside the config: as root, that directory must be
    root's alone."""
    binary = evil_binary(tmp_path / "opt" / "llama-server", tmp_path / "pwned")
    home = tmp_path / "home"
    cfg = config(home, binary)
    os.chown(home, USER, USER)
    refused(
        llamanix("switch", "--dry-run", str(cfg), cwd=tmp_path),
        f"{home} belongs to uid {USER}",
        "generations",
    )
    assert not (home / ".llamanix-state").exists()


@pytest.mark.parametrize("name", ["LD_PRELOAD", "PYTHONPATH", "GCONV_PATH", "GLIBC_TUNABLES"])
def test_variables_a_root_helper_would_obey_are_refused(tmp_path: Path, name: str) -> None:
    binary = evil_binary(tmp_path / "opt" / "llama-server", tmp_path / "pwned")
    cfg = config(tmp_path / "etc", binary)
    cfg.write_text(cfg.read_text() + f'environment = {{ {name} = "/srv/models/x" }}\n')
    refused(
        llamanix("validate", "--remote", str(cfg), cwd=tmp_path),
        f"instances.chat.environment.{name}",
        "a variable that changes what a root process loads or runs",
    )


@pytest.mark.parametrize("name", ["fleet", "gateway-keys"])
def test_the_fleet_agents_and_the_key_units_names_are_reserved(tmp_path: Path, name: str) -> None:
    binary = evil_binary(tmp_path / "opt" / "llama-server", tmp_path / "pwned")
    cfg = config(tmp_path / "etc", binary, name)
    refused(llamanix("validate", "--remote", str(cfg), cwd=tmp_path), f"instances.{name}")


@pytest.mark.parametrize(
    "first_line",
    [
        "root:$y$j9T$FAKEHASH$abc:19000:0:99999:7:::",
        "-----BEGIN OPENSSH PRIVATE KEY-----",
        "sk live 123",
    ],
)
def test_a_key_files_first_line_is_sent_only_if_it_is_a_token(
    tmp_path: Path, first_line: str
) -> None:
    key = tmp_path / "key"
    key.write_text(first_line + "\n")
    key.chmod(0o600)
    done = llamanix(
        "readiness",
        "--url",
        "http://127.0.0.1:9",
        "--api-key-file",
        str(key),
        "--timeout",
        "1",
        cwd=tmp_path,
    )
    err = done.stderr.strip()
    assert done.returncode != 0 and len(err.splitlines()) == 1, err
    assert "line 1 is not a bearer token" in err and first_line not in err, err
    assert first_line.split()[0] not in done.stdout + err
