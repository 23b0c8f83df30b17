"""Rendered units: systemd accepts them, they are hardened, secrets stay out, renders roll."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from llamanix.cli import main
from llamanix.core.config import parse_config
from llamanix.external import systemd_analyze
from llamanix.render.units import render_host, systemd_escape_arg, write_render

needs_systemd = pytest.mark.skipif(
    not systemd_analyze.available(), reason="systemd-analyze is not installed"
)
# The exposure score of the unit nixpkgs' llama-cpp module renders (verified-upstream.md).
NIXPKGS_LLAMA_CPP_EXPOSURE = 1.5
SECRET = "sk-do-not-leak-4242"


def host_config(kind: str, gpu: bool, **inst: Any) -> dict[str, Any]:
    host: dict[str, Any] = {"kind": kind}
    if gpu:
        host.update(gpu="rtx3090", cuda_archs=["8.6"])
    base = {
        "model": "/srv/models/t.gguf",
        # systemd-analyze verify wants an executable; the program itself is never started.
        "binary": sys.executable,
        "flash_attn": "on",
        "cache_type_k": "q8_0",
        "cache_type_v": "q8_0",
    }
    return {"hosts": {"h": host}, "instances": {"a": {**base, **inst}}}


def render_to(tmp_path: Path, data: dict[str, Any], user: bool | None = None) -> Path:
    cfg = parse_config(data, str(tmp_path / "llamanix.toml"))
    out = tmp_path / "out"
    write_render(render_host(cfg, "h", user=user), out)
    return out


@needs_systemd
@pytest.mark.parametrize("gpu", [False, True], ids=["cpu", "gpu"])
@pytest.mark.parametrize("kind", ["nixos", "systemd"])
def test_system_units_verify_and_score(tmp_path: Path, kind: str, gpu: bool) -> None:
    out = render_to(tmp_path, host_config(kind, gpu))
    unit = out / "llamanix-a.service"
    proc = systemd_analyze.verify(unit)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    exposure = systemd_analyze.security_exposure(unit)
    assert exposure is not None and exposure <= NIXPKGS_LLAMA_CPP_EXPOSURE


@needs_systemd
def test_user_unit_verifies(tmp_path: Path) -> None:
    out = render_to(tmp_path, host_config("systemd-user", False))
    text = (out / "llamanix-a.service").read_text()
    assert "WantedBy=default.target" in text
    assert "DynamicUser" not in text and "SupplementaryGroups" not in text
    proc = systemd_analyze.verify(out / "llamanix-a.service")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def directives(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith(("#", "["))]


def test_gpu_unit_opens_only_the_nvidia_devices(tmp_path: Path) -> None:
    text = (render_to(tmp_path, host_config("nixos", True)) / "llamanix-a.service").read_text()
    lines = directives(text)
    for expected in (
        "DevicePolicy=closed",
        "DeviceAllow=char-nvidiactl rw",
        "DeviceAllow=char-nvidia-frontend rw",
        "DeviceAllow=char-nvidia-uvm rw",
        "DeviceAllow=char-nvidia-caps rw",
        "PrivateDevices=yes",
        "BindPaths=/dev/nvidiactl",
        "BindPaths=/dev/nvidia-uvm",
        "BindPaths=-/dev/nvidia0",
        "SystemCallFilter=@system-service @resources",
        "SystemCallFilter=~@privileged",
        "ProcSubset=all",
    ):
        assert expected in lines
    assert not any(line.startswith("SupplementaryGroups") for line in lines)


def test_cpu_unit_hardening(tmp_path: Path) -> None:
    text = (render_to(tmp_path, host_config("systemd", False)) / "llamanix-a.service").read_text()
    lines = directives(text)
    for expected in (
        "DynamicUser=yes",
        "ProtectSystem=strict",
        "PrivateTmp=yes",
        "NoNewPrivileges=yes",
        "CapabilityBoundingSet=",
        "SystemCallFilter=@system-service",
        "SystemCallFilter=~@privileged",
        "UMask=0077",
        "RestrictAddressFamilies=AF_INET AF_INET6",
        "SystemCallFilter=~@resources",
        "IPAddressDeny=any",
        "IPAddressAllow=localhost",
        "StateDirectory=llamanix-a",
        "CacheDirectory=llamanix-a",
        'Environment="HOME=%C/llamanix-a"',
        'Environment="LLAMA_CACHE=%C/llamanix-a"',
        "Restart=on-failure",
        "RestartSec=10s",
        "StartLimitBurst=5",
        "PrivateDevices=yes",
        "ProcSubset=pid",
    ):
        assert expected in lines
    assert not any(line.startswith("DeviceAllow") for line in lines)


def test_api_key_only_through_a_credential(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text(SECRET)
    out = render_to(tmp_path, host_config("nixos", True, api_key_file=str(key)))
    unit = (out / "llamanix-a.service").read_text()
    assert f"LoadCredential=api-key:{key}" in unit
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    assert "--api-key-file %d/api-key" in exec_start and str(key) not in exec_start
    for path in out.iterdir():
        if path.is_file():
            assert SECRET not in path.read_text()


def test_exec_start_escaping() -> None:
    assert systemd_escape_arg("/m/model.gguf") == "/m/model.gguf"
    assert systemd_escape_arg("100%") == '"100%%"'
    assert systemd_escape_arg("$HOME") == '"$$HOME"'
    assert systemd_escape_arg('a "b"') == '"a \\"b\\""'


def test_previous_render_is_kept_and_stale_files_removed(tmp_path: Path) -> None:
    data = host_config("systemd", False)
    data["instances"]["b"] = {"model": "/srv/models/b.gguf", "port": 8081}
    out = render_to(tmp_path, data)
    first = json.loads((out / "manifest.json").read_text())
    del data["instances"]["b"]
    data["instances"]["a"]["context"] = 4096
    cfg = parse_config(data, "llamanix.toml")
    write_render(render_host(cfg, "h"), out)
    second = json.loads((out / "manifest.json").read_text())
    assert sorted(second["instances"]) == ["a"]
    assert not (out / "llamanix-b.service").exists()
    assert json.loads((out / ".previous" / "manifest.json").read_text()) == first
    assert (out / ".previous" / "llamanix-b.service").exists()
    assert first["config_hash"] != second["config_hash"]
    assert not list(out.glob(".*.tmp"))


def test_manifest_and_argv_files(tmp_path: Path) -> None:
    out = render_to(tmp_path, host_config("systemd", False, alias="tiny", port=9000))
    manifest = json.loads((out / "manifest.json").read_text())
    entry = manifest["instances"]["a"]
    argv = json.loads((out / "a.argv.json").read_text())
    assert entry["argv"] == argv and argv[0] == sys.executable
    assert entry | {"argv": None} == {
        "unit": "llamanix-a.service",
        "variant": "upstream",
        "source_revision": None,
        "version": None,
        "argv": None,
        "environment": {},
        "listen": "127.0.0.1",
        "port": 9000,
        "alias": "tiny",
        "gpu": False,
    }
    assert manifest["host"] == "h" and manifest["kind"] == "systemd"
    assert manifest["config_hash"].startswith("sha256:")


def test_render_cli_single_host_needs_no_host_flag(tmp_path: Path) -> None:
    cfg = tmp_path / "llamanix.toml"
    cfg.write_text('[instances.a]\nmodel = "/m/t.gguf"\n')
    out = tmp_path / "units"
    result = CliRunner().invoke(main, ["render", str(cfg), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == [
        "a.argv.json",
        "llamanix-a.service",
        "manifest.json",
    ]


def test_user_flag_renders_user_units(tmp_path: Path) -> None:
    cfg = tmp_path / "llamanix.toml"
    cfg.write_text('[hosts.h]\nkind = "systemd"\n[instances.a]\nmodel = "/m/t.gguf"\n')
    out = tmp_path / "units"
    result = CliRunner().invoke(main, ["render", str(cfg), "--out", str(out), "--user"])
    assert result.exit_code == 0, result.output
    assert "WantedBy=default.target" in (out / "llamanix-a.service").read_text()
    assert json.loads((out / "manifest.json").read_text())["kind"] == "systemd-user"
