"""The fleet bed itself (llamanix.testbed.fleet): Debian 12 and 13 hosts on a bridge in a
network namespace of their own, reached from the controller over ssh with known keys, and
nothing of it on this machine's own interfaces, before, during or after.

One fleet for the module (box1 and box3 Debian 12, box2 Debian 13); the tests that stop and
reboot hosts come last and leave them running.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hostbed import tiny_fleet

from llamanix.external import netns
from llamanix.fleet.protocol import HELLO, PROTOCOL, AgentRequest
from llamanix.testbed import hosts
from llamanix.testbed.fleet import BRIDGE, CONNECT_TIMEOUT_S, CONTROLLER_ADDRESS, Fleet

pytestmark = [pytest.mark.hosts]

NAMES: tuple[hosts.HostName, ...] = ("debian12", "debian13", "debian12")
# Fields of `ip -j` that change on their own (a DHCP lease counting down).
VOLATILE = {"valid_life_time", "preferred_life_time", "expires"}


def _strip(value: object) -> object:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def machine_network() -> dict[str, object]:
    """This machine's own (root) namespace: its interfaces, addresses and routes."""
    views = {
        "addr": ["addr", "show"],
        "route": ["route", "show"],
        "route6": ["-6", "route", "show"],
        "link": ["link", "show"],
    }
    return {name: _strip(netns.ip_json(args)) for name, args in views.items()}


@pytest.fixture(scope="module")
def network_before(host_bed: None) -> dict[str, object]:
    for program, package in (("ssh", "openssh-client"), ("ip", "iproute2")):
        if shutil.which(program) is None:
            pytest.fail(f"{program} is missing: apt-get install {package} (.ci/run does)")
    return machine_network()


@pytest.fixture(scope="module")
def bed(
    network_before: dict[str, object],
    tmp_path_factory: pytest.TempPathFactory,
    project_wheel: Path,
    llama_server_bin: Path,
) -> Iterator[Fleet]:
    work = tmp_path_factory.mktemp("fleet")
    with tiny_fleet(NAMES, work, project_wheel, llama_server_bin) as (up, took):
        print(f"fleet of {len(NAMES)} up in {took:.1f}s")
        yield up
    assert not Path(f"/run/netns/{up.netns}").exists()
    assert machine_network() == network_before


def one_link(text: str) -> dict[str, Any]:
    """The one interface of an ``ip -j`` answer read inside a host."""
    value = json.loads(text)
    assert isinstance(value, list) and len(value) == 1 and isinstance(value[0], dict)
    return value[0]


def ssh(bed: Fleet, name: str, command: str, timeout_s: float = 60) -> tuple[int, str]:
    done = bed.controller(["ssh", name, "--", command], timeout_s=timeout_s)
    return done.returncode, done.stdout + done.stderr


def agent_through_sudo(bed: Fleet, name: str) -> tuple[int, str]:
    """The fleet agent's status through sudo, as a controller runs it (the one thing admin's
    sudoers line lets it run as root, with the rest of the agent's commands)."""
    request = AgentRequest(PROTOCOL, name).text()
    done = bed.controller(
        ["ssh", name, "--", "sudo -n llamanix fleet-agent status"], input_text=request, timeout_s=60
    )
    return done.returncode, done.stdout + done.stderr


def test_nothing_of_the_bed_is_on_this_machines_interfaces(
    bed: Fleet, network_before: dict[str, object]
) -> None:
    """While the fleet is up, this machine's namespace is as it was; the bed's namespace holds
    loopback, the bridge and one veth per host, each the peer of that host's host0."""
    assert machine_network() == network_before
    links = netns.ip_json(["-d", "link", "show"], bed.netns)
    assert isinstance(links, list)
    by_name = {link["ifname"]: link for link in links}
    veths = {n: link for n, link in by_name.items() if n not in ("lo", BRIDGE)}
    assert set(by_name) >= {"lo", BRIDGE}
    assert len(veths) == len(NAMES), sorted(by_name)
    addresses = netns.ip_json(["-4", "addr", "show", BRIDGE], bed.netns)
    assert isinstance(addresses, list)
    assert [a["local"] for a in addresses[0]["addr_info"]] == [CONTROLLER_ADDRESS]
    for name in bed.names:
        inside = bed.host(name).run(["ip", "-j", "-d", "link", "show", "host0"]).stdout
        host0 = one_link(inside)
        peer = next(v for v in veths.values() if v["ifindex"] == host0["link_index"])
        # Each end names the other: the bed's end is the host's host0's peer, on the bridge.
        assert peer["link_index"] == host0["ifindex"]
        assert peer.get("master") == BRIDGE
        assert peer["linkinfo"]["info_kind"] == "veth"


def test_the_controller_runs_llamanix_through_sudo_on_every_host(bed: Fleet) -> None:
    for name in bed.names:
        code, out = ssh(bed, name, "hostname; llamanix --version")
        assert code == 0, out
        assert out.splitlines()[0] == name, out
        assert "llamanix" in out.lower(), out
        code, out = agent_through_sudo(bed, name)
        assert code == 0 and out.startswith(HELLO), out


def test_host_keys_are_checked_not_learned(bed: Fleet) -> None:
    """Every host has its own key, and known_hosts holds them: box2 taken for box1 (its key
    checked against box1's) is refused, and nothing is added to known_hosts."""
    known = (bed.home / ".ssh/known_hosts").read_text()
    keys = {line.split()[2] for line in known.splitlines()}
    assert len(keys) == len(NAMES)
    done = bed.controller(["ssh", "-o", "HostKeyAlias=box1", "box2", "--", "true"], timeout_s=60)
    assert done.returncode == 255
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in done.stderr, done.stderr
    assert (bed.home / ".ssh/known_hosts").read_text() == known


def test_hosts_reach_each_other_by_name_and_address(bed: Fleet) -> None:
    probe = (
        "import socket, sys\n"
        "for target in sys.argv[1:]:\n"
        "    with socket.create_connection((target, 22), timeout=5) as s:\n"
        "        print(target, s.recv(64).split(b'-')[0].decode())\n"
    )
    done = bed.host("box1").run(["python3", "-c", probe, "box2", bed.address("box3")])
    assert done.stdout.split() == ["box2", "SSH", bed.address("box3"), "SSH"]
    done = bed.host("box3").run(["python3", "-c", probe, "box1", "controller"], check=False)
    # The controller runs no sshd: refused, which is an answer from its address.
    assert "ConnectionRefusedError" in done.stderr, done.stderr


def test_a_controller_process_can_be_killed_midway(bed: Fleet) -> None:
    child = bed.controller_popen(["ssh", "box1", "--", "sleep", "60"], stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        # The wrappers exec: the child's pid is the program's own.
        assert Path(f"/proc/{child.pid}/comm").read_text().strip() == "ssh"
    finally:
        child.kill()
        child.wait(10)


def test_a_reboot_keeps_the_address_and_sshd(bed: Fleet) -> None:
    bed.reboot("box2")
    inside = bed.host("box2").run(["ip", "-j", "-4", "addr", "show", "host0"]).stdout
    assert [a["local"] for a in one_link(inside)["addr_info"]] == [bed.address("box2")]
    code, out = agent_through_sudo(bed, "box2")
    assert code == 0, out


def test_a_stopped_host_answers_ssh_with_255_quickly(bed: Fleet) -> None:
    bed.stop("box3")
    started = time.monotonic()
    code, out = ssh(bed, "box3", "true")
    took = time.monotonic() - started
    assert code == 255, out
    assert took < CONNECT_TIMEOUT_S + 3, (took, out)
    assert ssh(bed, "box1", "true")[0] == 0
    bed.start("box3")
    code, out = agent_through_sudo(bed, "box3")
    assert code == 0, out
