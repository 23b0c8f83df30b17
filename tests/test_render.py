"""Rendered units: systemd accepts them, they are hardened, secrets stay out, renders roll."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from llamanix.cli import main
from llamanix.config.model import parse_config
from llamanix.core.errors import UserError
from llamanix.external import systemd_analyze
from llamanix.render.units import llamanix_command, render_host, systemd_escape_arg, write_render

needs_systemd = pytest.mark.skipif(
    not systemd_analyze.available(), reason="systemd-analyze is not installed"
)
# The exposure score of the unit nixpkgs' llama-cpp module renders (verified-upstream.md).
NIXPKGS_LLAMA_CPP_EXPOSURE = 1.5
SECRET = "sk-do-not-leak-4242"


def host_config(kind: str, gpu: bool, sandbox: str | None = None, **inst: Any) -> dict[str, Any]:
    host: dict[str, Any] = {"kind": kind}
    if gpu:
        host.update(gpu="rtx3090", cuda_archs=["8.6"])
    if sandbox is not None:
        host["gpu_sandbox"] = sandbox
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
@pytest.mark.parametrize(
    ("gpu", "sandbox"),
    [(False, None), (True, "device-allow"), (True, "private-dev")],
    ids=["cpu", "gpu-device-allow", "gpu-private-dev"],
)
@pytest.mark.parametrize("kind", ["nixos", "systemd"])
def test_system_units_verify_and_score(
    tmp_path: Path, kind: str, gpu: bool, sandbox: str | None
) -> None:
    out = render_to(tmp_path, host_config(kind, gpu, sandbox))
    unit = out / "llamanix-a.service"
    proc = systemd_analyze.verify(unit)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    exposure = systemd_analyze.security_exposure(unit)
    assert exposure is not None and exposure <= NIXPKGS_LLAMA_CPP_EXPOSURE
    # plan scores every unit of a host in one run; it must read the same figure per unit.
    other = tmp_path / "llamanix-b.service"
    other.write_text(unit.read_text())
    assert systemd_analyze.security_exposures_argv([unit, other]) == [
        "systemd-analyze", "security", "--offline=yes", "--no-pager", str(unit), str(other)
    ]  # fmt: skip
    both = systemd_analyze.security_exposures([unit, other])
    assert both == {"llamanix-a.service": exposure, "llamanix-b.service": exposure}


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


# A GPU system unit's device lines (ProcSubset= onwards), in order, per gpu_sandbox.
GPU_DEVICE_LINES = [
    "ProcSubset=all",
    "DevicePolicy=closed",
    "DeviceAllow=char-nvidiactl rw",
    "DeviceAllow=char-nvidia-frontend rw",
    "DeviceAllow=char-nvidia-uvm rw",
    "DeviceAllow=char-nvidia-caps rw",
]
DEVICE_ALLOW_SHAPE = [*GPU_DEVICE_LINES, "PrivateDevices=no"]
PRIVATE_DEV_SHAPE = [
    *GPU_DEVICE_LINES,
    "PrivateDevices=yes",
    "BindPaths=/dev/nvidiactl",
    "BindPaths=/dev/nvidia-uvm",
    "BindPaths=-/dev/nvidia-uvm-tools",
    "BindPaths=-/dev/nvidia-caps",
    *(f"BindPaths=-/dev/nvidia{i}" for i in range(16)),
]


def device_lines(lines: list[str]) -> list[str]:
    """The [Service] section from ProcSubset= on: where the GPU and CPU shapes differ."""
    start = next(i for i, line in enumerate(lines) if line.startswith("ProcSubset="))
    return lines[start : lines.index("WantedBy=multi-user.target")]


@pytest.mark.parametrize(
    ("sandbox", "shape"),
    [
        (None, DEVICE_ALLOW_SHAPE),
        ("device-allow", DEVICE_ALLOW_SHAPE),
        ("private-dev", PRIVATE_DEV_SHAPE),
    ],
    ids=["default", "device-allow", "private-dev"],
)
@pytest.mark.parametrize("kind", ["nixos", "systemd"])
def test_gpu_unit_opens_only_the_nvidia_devices(
    tmp_path: Path, kind: str, sandbox: str | None, shape: list[str]
) -> None:
    # The default follows nixpkgs' ollama and llama-cpp modules; the private /dev is opt-in.
    text = (
        render_to(tmp_path, host_config(kind, True, sandbox)) / "llamanix-a.service"
    ).read_text()
    lines = directives(text)
    assert device_lines(lines) == shape
    for expected in (
        "SystemCallFilter=@system-service @resources",
        "SystemCallFilter=~@privileged",
    ):
        assert expected in lines
    assert not any(line.startswith("SupplementaryGroups") for line in lines)


@pytest.mark.parametrize("sandbox", [None, "private-dev"], ids=["default", "private-dev"])
def test_gpu_sandbox_leaves_cpu_units_alone(tmp_path: Path, sandbox: str | None) -> None:
    # gpu_layers = 0 keeps an instance on the CPU on a GPU host: the CPU shape, whatever the host's
    # GPU sandbox.
    data = host_config("nixos", True, sandbox, gpu_layers=0)
    lines = directives((render_to(tmp_path, data) / "llamanix-a.service").read_text())
    assert device_lines(lines) == ["ProcSubset=pid", "PrivateDevices=yes"]


def test_gpu_sandbox_must_be_a_known_shape(tmp_path: Path) -> None:
    with pytest.raises(UserError) as err:
        parse_config(host_config("nixos", True, "none"), str(tmp_path / "llamanix.toml"))
    assert "hosts.h.gpu_sandbox" in str(err.value)


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
    data["instances"]["b"] = {"model": "/srv/models/b.gguf", "port": 8081, "binary": "/usr/bin/b"}
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
    cfg.write_text('[hosts.gpu1]\nkind = "nixos"\n[instances.a]\nmodel = "/m/t.gguf"\n')
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
    cfg.write_text(
        '[hosts.h]\nkind = "systemd"\nbinaries = { upstream = "/usr/bin/llama-server" }\n'
        '[instances.a]\nmodel = "/m/t.gguf"\n'
    )
    out = tmp_path / "units"
    result = CliRunner().invoke(main, ["render", str(cfg), "--out", str(out), "--user"])
    assert result.exit_code == 0, result.output
    assert "WantedBy=default.target" in (out / "llamanix-a.service").read_text()
    assert json.loads((out / "manifest.json").read_text())["kind"] == "systemd-user"


@pytest.mark.parametrize(
    ("kind", "key", "prefix", "flags"),
    [
        ("systemd", True, "+", " --api-key-file %d/api-key --as-server-user --pid $MAINPID"),
        ("nixos", True, "+", " --api-key-file %d/api-key --as-server-user --pid $MAINPID"),
        ("systemd", False, "", " --pid $MAINPID"),
        ("systemd-user", True, "+", " --api-key-file %d/api-key --as-server-user --pid $MAINPID"),
    ],
    ids=["system-keyed", "nixos-keyed", "system-unkeyed", "user-keyed"],
)
def test_readiness_line_per_unit_kind(
    tmp_path: Path, kind: str, key: bool, prefix: str, flags: str
) -> None:
    """A keyed unit's check starts outside the sandbox ("+"), reads the credential as the
    server sees it and becomes the server's user: before systemd 256 a unit's control process
    cannot read its credentials (system and user units alike, on systemd 252). An unkeyed
    check stays in the unit's sandbox."""
    extra = {"api_key_file": "/etc/llamanix/api-key"} if key else {}
    out = render_to(tmp_path, host_config(kind, False, **extra))
    text = (out / "llamanix-a.service").read_text()
    post = [line for line in text.splitlines() if line.startswith("ExecStartPost=")]
    command = " ".join(systemd_escape_arg(w) for w in llamanix_command())
    assert post == [
        f"ExecStartPost={prefix}{command} readiness --url http://127.0.0.1:8080 "
        f"--model /srv/models/t.gguf{flags}"
    ]
    assert SECRET not in text


@pytest.mark.parametrize(
    ("listen", "extra", "online"),
    [
        ("127.0.0.1", [], False),
        ("::1", [], False),
        ("localhost", [], False),
        ("0.0.0.0", [], True),
        ("192.168.1.5", [], True),
        ("llm.example.org", [], True),
        # Downloads its model at start: it needs the network even on loopback.
        ("127.0.0.1", ["-hf", "ggml-org/gemma-3-1b-it-GGUF"], True),
    ],
)
@pytest.mark.parametrize("routed", [False, True], ids=["instance", "router"])
def test_only_units_reachable_beyond_loopback_or_downloading_wait_for_the_network(
    tmp_path: Path, listen: str, extra: list[str], online: bool, routed: bool
) -> None:
    """As nixpkgs' llama-cpp and llama-swap modules: after network.target; only a server others
    reach (or one that downloads) wants network-online.target, so boot does not wait for the
    network for a loopback listener."""
    data = host_config("systemd", False, listen=listen, extra_args=extra, keyless=True)
    unit = "llamanix-a.service"
    if routed:
        data["instances"]["a"]["listen"] = "127.0.0.1"
        data["hosts"]["h"]["router"] = {"kind": "llama-server", "members": ["a"], "port": 8090}
        data["hosts"]["h"]["router"]["listen"] = listen
        data["hosts"]["h"]["router"]["keyless"] = True
        unit = "llamanix-router.service"
    out = render_to(tmp_path, data)
    text = (out / unit).read_text()
    unit_section = text.split("[Service]", 1)[0].splitlines()
    network = [line for line in unit_section if line.startswith(("After=", "Wants="))]
    if online:
        assert network == ["After=network-online.target", "Wants=network-online.target"]
    else:
        assert network == ["After=network.target"]
    if systemd_analyze.available():
        proc = systemd_analyze.verify(out / unit)
        assert proc.returncode == 0, proc.stdout + proc.stderr
