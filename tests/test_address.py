"""Listen and connect addresses (llamanix.core.address), and the process liveness check."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from llamanix.config.model import parse_config
from llamanix.core.address import (
    SshTarget,
    connect_host,
    connect_url,
    is_loopback,
    is_wildcard,
    parse_target,
    url_host,
)
from llamanix.core.errors import UserError
from llamanix.external.process import alive
from llamanix.external.ssh import ssh_argv
from llamanix.render.units import ip_allow_list
from llamanix.switch.serving import gate_url


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("127.0.0.1", True),
        ("127.0.0.53", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("LOCALHOST", True),
        ("0.0.0.0", False),
        ("::", False),
        ("[::]", False),
        ("192.168.1.5", False),
        ("fe80::1", False),
        ("gpu1.lan", False),
        ("localhost.example.org", False),
        ("", False),
    ],
)
def test_is_loopback(host: str, expected: bool) -> None:
    assert is_loopback(host) is expected


@pytest.mark.parametrize(
    ("host", "expected"),
    [("0.0.0.0", True), ("::", True), ("[::]", True), ("127.0.0.1", False), ("gpu1", False)],
)
def test_is_wildcard(host: str, expected: bool) -> None:
    assert is_wildcard(host) is expected


@pytest.mark.parametrize(
    ("listen", "host", "url"),
    [
        # A wildcard is reached over the loopback of the family the server listens on.
        ("0.0.0.0", "127.0.0.1", "http://127.0.0.1:8080"),
        ("::", "::1", "http://[::1]:8080"),
        ("[::]", "::1", "http://[::1]:8080"),
        ("localhost", "127.0.0.1", "http://127.0.0.1:8080"),
        ("127.0.0.1", "127.0.0.1", "http://127.0.0.1:8080"),
        ("::1", "::1", "http://[::1]:8080"),
        ("[::1]", "::1", "http://[::1]:8080"),
        ("192.168.1.5", "192.168.1.5", "http://192.168.1.5:8080"),
        ("fd00::5", "fd00::5", "http://[fd00::5]:8080"),
        ("gpu1.lan", "gpu1.lan", "http://gpu1.lan:8080"),
    ],
)
def test_connect_host_and_url(listen: str, host: str, url: str) -> None:
    assert connect_host(listen) == host
    assert connect_url(listen, 8080) == url


def test_url_host_brackets_only_ipv6() -> None:
    assert url_host("::1") == "[::1]"
    assert url_host("[::1]") == "[::1]"
    assert url_host("10.0.0.1") == "10.0.0.1"
    assert url_host("gpu1") == "gpu1"


def _config(listen: str, target: str | None = None) -> dict[str, object]:
    host: dict[str, object] = {
        "kind": "systemd",
        "binaries": {"upstream": "/usr/local/bin/llama-server"},
    }
    if target is not None:
        host["target"] = target
    return {
        "hosts": {"h": host},
        "instances": {
            # Keyless on purpose: these tests are about addresses, not keys.
            "a": {
                "model": "/m/t.gguf",
                "variant": "upstream",
                "listen": listen,
                "host": "h",
                "keyless": True,
            }
        },
    }


@pytest.mark.parametrize(
    ("listen", "target", "url"),
    [
        ("0.0.0.0", None, "http://127.0.0.1:8080"),
        # Before the address module the gate asked 127.0.0.1 for a server on "::" or "::1".
        ("::", None, "http://[::1]:8080"),
        ("::1", None, "http://[::1]:8080"),
        ("192.168.1.5", None, "http://192.168.1.5:8080"),
        ("0.0.0.0", "root@gpu1", "http://gpu1:8080"),
        ("::1", "gpu1", "http://gpu1:8080"),
        ("192.168.1.5", "gpu1", "http://192.168.1.5:8080"),
        # The ssh port is ssh's: the gate asks the machine alone.
        ("0.0.0.0", "root@10.0.0.12:2222", "http://10.0.0.12:8080"),
        ("0.0.0.0", "ssh://admin@gpu1.lan:2222", "http://gpu1.lan:8080"),
        ("0.0.0.0", "admin@[fd00::1]:2222", "http://[fd00::1]:8080"),
        ("0.0.0.0", "fd00::1", "http://[fd00::1]:8080"),
    ],
)
def test_the_gate_reaches_the_instance(listen: str, target: str | None, url: str) -> None:
    config = parse_config(_config(listen, target), "t.toml")
    assert gate_url(config, "a") == url


def test_loopback_listeners_are_filtered_to_localhost() -> None:
    for listen in ("127.0.0.1", "::1", "localhost", "127.0.0.2"):
        assert ip_allow_list(listen) == ("localhost",)
    assert ip_allow_list("gpu1.lan") is None


def test_alive_sees_a_running_process_and_not_a_zombie() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        assert alive(proc.pid)
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
    # Exited but not reaped yet (WNOWAIT leaves it unreaped): a zombie, which is not alive.
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
    assert not alive(proc.pid)
    proc.wait()
    assert not alive(proc.pid)


def test_alive_refuses_what_is_not_a_process_number() -> None:
    assert not alive(0)
    assert not alive(-1)


@pytest.mark.parametrize(
    ("text", "user", "host", "port"),
    [
        ("box1", None, "box1", None),
        ("admin@box1", "admin", "box1", None),
        ("root@10.0.0.12:2222", "root", "10.0.0.12", 2222),
        ("ssh://admin@box1.lan:2222", "admin", "box1.lan", 2222),
        ("ssh://box1", None, "box1", None),
        ("[fd00::1]:22", None, "fd00::1", 22),
        ("admin@[fd00::1]:2222", "admin", "fd00::1", 2222),
        ("root@fd00::1", "root", "fd00::1", None),  # no brackets: no port
        ("[fd00::1]", None, "fd00::1", None),
    ],
)
def test_an_ssh_target_is_read_once_into_user_host_and_port(
    text: str, user: str | None, host: str, port: int | None
) -> None:
    target = parse_target(text)
    assert target == SshTarget(user, host, port, text)
    assert str(target) == text  # messages name it as the config wrote it
    argv = ssh_argv(target, ["true"])
    # ssh gets the port as -p and the machine without it (ssh -G read "host:2222" as a name).
    where = argv.index("--") - 1
    assert argv[where] == (f"{user}@{host}" if user else host)
    assert argv[where - 2 : where] == (["-p", str(port)] if port else argv[where - 2 : where])
    assert ("-p" in argv) is (port is not None)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("-oProxyCommand=evil", "starts with '-', which ssh would take for an option"),
        ("admin@box1:99999", "port '99999' is not a number from 1 to 65535"),
        ("admin@box1:ssh", "port 'ssh' is not a number from 1 to 65535"),
        ("admin@box 1", "is empty or holds a space"),
        ("root@host:22:33", "'host:22:33' is neither a host name nor an address"),
        ("[fd00::1", "'[fd00::1' is not [IPv6 address] or [IPv6 address]:port"),
        ("admin@", "'' is neither a host name nor an address"),
        ("ssh://box1/path", "'box1/path' is neither a host name nor an address"),
        ("x;reboot", "'x;reboot' is neither a host name nor an address"),
    ],
)
def test_validate_refuses_a_target_ssh_could_not_read(text: str, why: str) -> None:
    with pytest.raises(UserError) as err:
        parse_config(_config("0.0.0.0", text), "t.toml")
    assert str(err.value) == (
        f"t.toml: hosts.h.target: '{text}' {why} (write USER@HOST, USER@HOST:PORT, "
        "ssh://USER@HOST:PORT, [IPv6]:PORT or a Host of your ssh config)"
    )


def test_a_nixos_target_with_a_port_is_refused_with_the_ssh_config_fix() -> None:
    data = _config("0.0.0.0", "root@gpu1:2222")
    data["hosts"] = {"h": {"kind": "nixos", "target": "root@gpu1:2222"}}
    with pytest.raises(UserError) as err:
        parse_config(data, "t.toml")
    assert str(err.value) == (
        "t.toml: hosts.h.target: 'root@gpu1:2222' names a port, which nixos-rebuild "
        "--target-host does not take (put the port in a Host entry of ~/.ssh/config (Port) and "
        "name that Host here)"
    )
