"""Rendered system units score what docs/units.md says with ``systemd-analyze security
--offline=yes`` (at most 1.0 for a CPU unit on loopback), their IP filter follows the listen
address, and the real llama-server still serves under the unit's system call filter.

systemd is not PID 1 here, so a unit cannot be started: the start test applies the parts of the
sandbox a plain process can apply to itself (the unit's SystemCallFilter= and
RestrictAddressFamilies= as a seccomp filter through libseccomp, NoNewPrivileges=, an empty
capability bounding set, UMask=, the unit's environment) and runs the rendered command line.
The IP filter (a cgroup BPF program), the mount namespace options and DynamicUser= need systemd
and are not exercised.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import json
import os
import re
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import pytest

import llamanix.render.units as units
from llamanix.config.model import parse_config
from llamanix.external import systemd_analyze
from llamanix.hosts.supervisor import load_specs
from llamanix.render.units import LOCAL_NETWORKS, ip_allow_list, render_host, write_render
from llamanix.server.server_process import free_port

needs_systemd = pytest.mark.skipif(
    not systemd_analyze.available(), reason="systemd-analyze is not installed"
)
# What the NixOS module renders: every program in the store, none in a home directory.
STORE_LLAMANIX = "/nix/store/00000000000000000000000000000000-llamanix/bin/llamanix"
STORE_SERVER = "/nix/store/00000000000000000000000000000000-llama-cpp/bin/llama-server"


def config(
    gpu: bool, listen: str, kind: str = "nixos", sandbox: str | None = None, **inst: Any
) -> dict[str, Any]:
    host: dict[str, Any] = {"kind": kind}
    if gpu:
        host.update(gpu="rtx3090", cuda_archs=["8.6"])
    if sandbox is not None:
        host["gpu_sandbox"] = sandbox
    # Keyless on purpose: the exposure tests are about the sandbox, not keys.
    base = {"model": "/srv/models/t.gguf", "binary": STORE_SERVER, "listen": listen}
    base["keyless"] = True
    return {"hosts": {"h": host}, "instances": {"a": base | inst}}


def render(tmp_path: Path, data: dict[str, Any], user: bool | None = None) -> Path:
    out = tmp_path / "out"
    write_render(
        render_host(parse_config(data, str(tmp_path / "llamanix.toml")), "h", user=user), out
    )
    return out / "llamanix-a.service"


def settings(unit: Path) -> list[str]:
    return [line for line in unit.read_text().splitlines() if line and line[0] not in "#["]


@needs_systemd
@pytest.mark.parametrize(
    ("gpu", "sandbox", "listen", "ceiling"),
    [
        (False, None, "127.0.0.1", 1.0),
        (False, None, "0.0.0.0", 1.0),
        # The default GPU shape keeps the host's /dev (PrivateDevices=no, as nixpkgs' ollama and
        # llama-cpp modules do): the offline scorer charges it two tenths, although
        # DevicePolicy=closed still lets only the NVIDIA devices open.
        (True, None, "127.0.0.1", 1.2),
        # Listening for the local networks costs a GPU unit a tenth more than loopback: its IP
        # allow list has non-localhost entries and it keeps AF_UNIX and ProcSubset=all.
        (True, None, "0.0.0.0", 1.3),
        (True, "private-dev", "127.0.0.1", 1.0),
        (True, "private-dev", "0.0.0.0", 1.1),
    ],
    ids=[
        "cpu-loopback",
        "cpu-any",
        "gpu-loopback",
        "gpu-any",
        "gpu-private-dev-loopback",
        "gpu-private-dev-any",
    ],
)
def test_system_unit_exposure(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    gpu: bool,
    sandbox: str | None,
    listen: str,
    ceiling: float,
) -> None:
    monkeypatch.setattr(units, "llamanix_command", lambda: [STORE_LLAMANIX])
    unit = render(tmp_path, config(gpu, listen, sandbox=sandbox))
    proc = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
        check=False,
    )
    found = re.search(r"Overall exposure level for llamanix-a\.service: (\d+\.\d)", proc.stdout)
    assert found, proc.stdout + proc.stderr
    assert float(found.group(1)) <= ceiling, proc.stdout


@pytest.mark.parametrize(
    ("listen", "allowed"),
    [
        ("127.0.0.1", "localhost"),
        ("127.0.0.2", "localhost"),
        ("::1", "localhost"),
        ("localhost", "localhost"),
        ("0.0.0.0", " ".join(LOCAL_NETWORKS)),
        ("::", " ".join(LOCAL_NETWORKS)),
        ("192.168.1.5", " ".join(LOCAL_NETWORKS)),
        ("100.101.102.103", " ".join(LOCAL_NETWORKS)),
        ("fd12:3456::1", " ".join(LOCAL_NETWORKS)),
        ("203.0.113.7", None),
        ("2001:db8::7", None),
        ("llm.example.org", None),
    ],
)
@pytest.mark.parametrize("gpu", [False, True], ids=["cpu", "gpu"])
def test_ip_filter_follows_the_listen_address(
    tmp_path: Path, gpu: bool, listen: str, allowed: str | None
) -> None:
    lines = settings(render(tmp_path, config(gpu, listen)))
    ip_lines = [line for line in lines if line.startswith("IPAddress")]
    if allowed is None:
        assert ip_lines == [] and ip_allow_list(listen) is None
    else:
        assert ip_lines == ["IPAddressDeny=any", f"IPAddressAllow={allowed}"]


def test_an_instance_that_downloads_its_model_has_no_ip_filter(tmp_path: Path) -> None:
    data = config(False, "127.0.0.1", extra_args=["-hf", "ggml-org/gemma-3-1b-it-GGUF"])
    assert not any(line.startswith("IPAddress") for line in settings(render(tmp_path, data)))


@pytest.mark.parametrize(
    ("extra", "environment", "resources"),
    [
        ([], {}, False),
        (["--prio", "2"], {}, True),
        (["--cpu-mask=0x3"], {}, True),
        (["--numa", "distribute"], {}, True),
        ([], {"OMP_PROC_BIND": "true"}, True),
    ],
)
def test_cpu_units_drop_resource_syscalls_unless_asked(
    tmp_path: Path, extra: list[str], environment: dict[str, str], resources: bool
) -> None:
    data = config(False, "127.0.0.1", extra_args=extra, environment=environment)
    lines = settings(render(tmp_path, data))
    filters = [line for line in lines if line.startswith("SystemCallFilter=")]
    if resources:
        assert filters == [
            "SystemCallFilter=@system-service @resources",
            "SystemCallFilter=~@privileged",
        ]
    else:
        assert filters == [
            "SystemCallFilter=@system-service",
            "SystemCallFilter=~@resources",
            "SystemCallFilter=~@privileged",
        ]


@pytest.mark.parametrize("sandbox", [None, "private-dev"], ids=["default", "private-dev"])
def test_user_gpu_units_keep_the_host_dev(tmp_path: Path, sandbox: str | None) -> None:
    # gpu_sandbox only shapes system units: a user manager cannot give a private /dev that opens.
    data = config(True, "127.0.0.1", kind="systemd-user", sandbox=sandbox)
    lines = settings(render(tmp_path, data))
    assert "PrivateDevices=no" in lines
    assert not any(line.startswith("BindPaths=") for line in lines)


# --- the real server under the unit's system call filter --------------------------------------

SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_CMP_EQ = 4
PR_SET_NO_NEW_PRIVS = 38
PR_CAPBSET_DROP = 24
AF_NUMBERS = {"AF_UNIX": 1, "AF_INET": 2, "AF_INET6": 10}


class ArgCmp(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


@cache
def syscall_group(name: str) -> frozenset[str]:
    """A systemd system call group, nested groups expanded, as systemd-analyze lists it."""
    out = subprocess.run(
        ["systemd-analyze", "syscall-filter", "--no-pager", name],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    calls: set[str] = set()
    for line in out.splitlines()[1:]:
        word = line.strip()
        if not word or word.startswith("#"):
            continue
        calls |= syscall_group(word) if word.startswith("@") else {word}
    return frozenset(calls)


def allowed_syscalls(lines: list[str]) -> set[str]:
    """SystemCallFilter= lines in order: the first is an allow list, ~ lines take away."""
    allowed: set[str] = set()
    for line in lines:
        if not line.startswith("SystemCallFilter="):
            continue
        value = line.split("=", 1)[1]
        deny = value.startswith("~")
        calls = set().union(
            *(syscall_group(w) if w[0] == "@" else {w} for w in value.lstrip("~").split())
        )
        allowed = allowed - calls if deny else allowed | calls
    return allowed


def sandbox(lines: list[str]) -> Any:
    """A preexec function applying the unit's filter the way systemd does before exec."""
    libseccomp = ctypes.CDLL(ctypes.util.find_library("seccomp") or "libseccomp.so.2")
    libc = ctypes.CDLL(None, use_errno=True)
    libseccomp.seccomp_init.restype = ctypes.c_void_p
    libseccomp.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(ArgCmp),
    ]
    libseccomp.seccomp_load.argtypes = [ctypes.c_void_p]
    families = next(
        line.split("=", 1)[1].split()
        for line in lines
        if line.startswith("RestrictAddressFamilies=")
    )
    allowed = allowed_syscalls(lines) - {"socket"}
    umask = int(next(line for line in lines if line.startswith("UMask=")).split("=")[1], 8)
    # systemd answers a refused call with SystemCallErrorNumber= (EPERM in these units).
    ctx = libseccomp.seccomp_init(0x00050000 | errno.EPERM)
    for call in sorted(allowed):
        nr = libseccomp.seccomp_syscall_resolve_name(call.encode())
        if nr >= 0:
            libseccomp.seccomp_rule_add_array(ctx, SCMP_ACT_ALLOW, nr, 0, None)
    socket_nr = libseccomp.seccomp_syscall_resolve_name(b"socket")
    for family in families:
        cmp = ArgCmp(0, SCMP_CMP_EQ, AF_NUMBERS[family], 0)
        libseccomp.seccomp_rule_add_array(ctx, SCMP_ACT_ALLOW, socket_nr, 1, ctypes.byref(cmp))

    def apply() -> None:
        os.umask(umask)
        for cap in range(64):  # CapabilityBoundingSet=: even root execs with no capabilities
            libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
        if libseccomp.seccomp_load(ctx) != 0:
            raise OSError("seccomp_load failed")

    return apply


@pytest.mark.server
@needs_systemd
def test_cpu_unit_filter_lets_the_real_server_serve(
    tmp_path: Path, llama_server_bin: Path, synth_models: Any
) -> None:
    port = free_port()
    data = {
        "hosts": {"h": {"kind": "systemd"}},
        "instances": {
            "a": {
                "binary": str(llama_server_bin),
                "model": str(synth_models.target),
                "port": port,
                "context": 512,
                "threads": 1,
            }
        },
    }
    unit = render(tmp_path, data)
    lines = settings(unit)
    assert (
        "SystemCallFilter=~@resources" in lines
        and "RestrictAddressFamilies=AF_INET AF_INET6" in lines
    )
    # The filter is in effect: a local socket and a priority change are refused in it.
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, socket\n"
            "for f in (lambda: socket.socket(socket.AF_UNIX), lambda: os.setpriority(0, 0, 5)):\n"
            "    try:\n        f(); print('allowed')\n"
            "    except OSError as e:\n        print(e.errno)\n",
        ],
        capture_output=True,
        text=True,
        preexec_fn=sandbox(lines),
        check=False,
    )
    assert probe.stdout.split() == [str(errno.EPERM)] * 2, probe.stdout + probe.stderr
    argv = json.loads((unit.parent / "a.argv.json").read_text())
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(cache_dir)}
    env["LLAMA_CACHE"] = str(cache_dir)
    env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
    log = (tmp_path / "server.log").open("w")
    server = subprocess.Popen(
        argv,
        cwd=cache_dir,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=sandbox(lines),
    )
    try:
        # The unit's own readiness check (ExecStartPost=) runs in the same sandbox.
        spec = load_specs(unit.parent)["a"]
        for post in spec.start_post_argv(server.pid):
            check = subprocess.run(
                post,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
                preexec_fn=sandbox(lines),
                check=False,
            )
            assert check.returncode == 0, check.stdout + check.stderr + log_text(tmp_path)
        url = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
        reply = httpx.post(
            f"{url}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
            timeout=60,
        )
        assert reply.status_code == 200 and reply.json()["choices"], log_text(tmp_path)
        assert server.poll() is None
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


def log_text(tmp_path: Path) -> str:
    return (tmp_path / "server.log").read_text()[-3000:]
