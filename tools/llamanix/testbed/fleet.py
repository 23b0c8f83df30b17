"""A fleet of real hosts on one private network, and a controller that reaches them with ssh.

The host bed (``llamanix.testbed.hosts``) boots one Debian host with loopback only. A fleet is
several such hosts, Debian 12 and 13 mixed, that a controller deploys to over ssh as an
operator would. This module

- makes a network namespace of its own (``llamanix-fleet-PID``) holding a bridge, ``br0``, with
  the controller's address 198.18.0.1/24. Every address is in 198.18.0.0/15, the block set
  aside for benchmarking networks (RFC 2544), which no real network routes: a packet that
  leaked could reach nobody. Nothing is added to this machine's own namespace: no veth into
  it, no route, no address;
- boots each host with ``systemd-nspawn --network-bridge=br0`` run inside that namespace, so
  the host's veth joins the bridge there. ``boxN`` has 198.18.0.(10+N)/24 on its ``host0``,
  set at every boot by a oneshot unit in its root, so a reboot keeps it, and /etc/hosts names
  the controller and every box;
- gives each host fresh ssh host keys (made here, so the controller's known_hosts holds the
  real public keys before any connection: no trust on first use), a user ``admin`` with the
  run's client key and the sudoers line docs/fleet.md gives (the fleet agent's commands
  without a password, nothing else as root), llamanix installed as a user installs it (plus
  /usr/local/bin/llamanix, which sudo's secure_path finds), llama-server and the models;
- runs the controller's commands in the bed's namespace with a home of its own: /root there is
  an overlay whose upper directory (``Fleet.home``) holds ~/.ssh (config, known_hosts, the
  client key), and takes whatever the commands write under their home;
- always tears down: hosts powered off (or killed), the controller's processes killed, the
  namespace deleted, the roots and the home removed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from llamanix.core.errors import ExternalCommandError
from llamanix.external import cgroups, container, netns, ssh_keys
from llamanix.external.process import Finished, TextChild, wait_exit
from llamanix.external.signals import signal_group
from llamanix.fleet.remote import sudoers_line
from llamanix.testbed import hosts
from llamanix.testbed.hosts import Host, HostName

BRIDGE = "br0"
PREFIX_LEN = 24
CONTROLLER_ADDRESS = "198.18.0.1"
CONTROLLER_NAME = "controller"
ADMIN = "admin"
# Not 1000: the host bed's normal user (hosts.add_user) takes that one.
ADMIN_UID = 1001
# Not named llamanix-*: a switch takes every llamanix-*.service in /etc/systemd/system for
# its own, and the first one disabled this unit (the host then lost its address at its next
# boot).
ADDRESS_UNIT = "fleet-bed-address.service"
# The controller's PATH: the programs of this machine an operator's shell finds.
CONTROLLER_PATH = hosts.ROOT_PATH
# How long the controller's ssh waits for a host that does not answer (a stopped one).
CONNECT_TIMEOUT_S = 5
HOST_KEY = "/etc/ssh/ssh_host_ed25519_key"


def member_name(index: int) -> str:
    """The ``index``-th host's name (from 1): box1, box2, ..."""
    return f"box{index}"


def member_address(index: int) -> str:
    """The ``index``-th host's address (from 1): 198.18.0.11, 198.18.0.12, ..."""
    if not 1 <= index <= 200:
        raise ValueError(f"a fleet holds 1 to 200 hosts, not {index}")
    return f"198.18.0.{10 + index}"


@dataclass
class Member:
    """One host of the fleet: its name and address on the bed, and the booted host."""

    name: str
    address: str
    host: Host
    # Its ssh host key's public half, as known_hosts holds it ("ssh-ed25519 AAAA...").
    host_key: str


@dataclass
class Fleet:
    """The booted fleet: its hosts by name, and the controller that reaches them."""

    netns: str
    # The controller's home as this process sees it: the upper directory of its /root.
    home: Path
    members: dict[str, Member]
    _holder: TextChild | None = field(default=None, repr=False)
    _children: list[TextChild] = field(default_factory=list, repr=False)

    @property
    def names(self) -> list[str]:
        return list(self.members)

    def host(self, name: str) -> Host:
        return self.members[name].host

    def address(self, name: str) -> str:
        return self.members[name].address

    # --- the controller ----------------------------------------------------------------------

    def controller_argv(
        self, argv: Sequence[str], env: Mapping[str, str] | None = None
    ) -> list[str]:
        """``argv`` as the controller runs it: in the bed's namespace, HOME=/root (its own),
        PATH the usual one, plus ``env``; nothing else of this process's environment."""
        assert self._holder is not None, "the fleet is down"
        full_env = {"HOME": "/root", "USER": "root", "LOGNAME": "root", "PATH": CONTROLLER_PATH}
        full_env.update(env or {})
        return netns.enter_argv(self._holder.pid, full_env, argv)

    def controller(
        self,
        argv: Sequence[str],
        *,
        timeout_s: float,
        input_text: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Finished:
        """Run ``argv`` on the controller to its end; output captured, any exit code
        returned (``CommandTimedOut`` past ``timeout_s``)."""
        return netns.run_in(
            self.controller_argv(argv, env), input_text=input_text, timeout_s=timeout_s
        )

    def controller_popen(
        self,
        argv: Sequence[str],
        *,
        stdout: IO[Any] | int,
        stdin_pipe: bool = False,
        env: Mapping[str, str] | None = None,
    ) -> TextChild:
        """Start ``argv`` on the controller, in a session of its own (its pid is ``argv``'s own
        program: every wrapper execs), stderr with ``stdout``. The caller may kill it mid-way;
        the fleet kills what is left of its group at teardown."""
        child = netns.spawn_in(
            self.controller_argv(argv, env), stdout=stdout, stdin_pipe=stdin_pipe
        )
        self._children.append(child)
        return child

    # --- the hosts ---------------------------------------------------------------------------

    def stop(self, name: str) -> None:
        """Power ``name`` off (killed if it does not go within a minute): its veth goes with
        it, so it answers nothing until ``start``."""
        self.host(name).poweroff()

    def kill(self, name: str) -> None:
        """End ``name`` at once, as a power cut does: no shutdown runs inside."""
        self.host(name).kill()

    def start(self, name: str) -> None:
        """Boot ``name`` again: the same root, so the same address, keys and installs."""
        host = self.host(name)
        if not host.running:
            host.boot()

    def reboot(self, name: str) -> None:
        self.host(name).reboot()


# --- making the root file systems ----------------------------------------------------------


def hosts_file(own: str, table: Sequence[tuple[str, str]]) -> str:
    """/etc/hosts of the host named ``own``: loopback, then the controller and every box."""
    lines = ["127.0.0.1\tlocalhost", f"127.0.1.1\t{own}", "::1\tlocalhost ip6-localhost"]
    lines += [f"{address}\t{name}" for name, address in table]
    return "\n".join(lines) + "\n"


def address_unit(address: str) -> str:
    """The oneshot that puts the host's address on host0 at every boot. A unit of the root (no
    networkd: Debian does not enable it), ordered before the network is up."""
    return (
        "[Unit]\n"
        "Description=The fleet bed's address on host0\n"
        "DefaultDependencies=no\n"
        "Before=network-pre.target\n"
        "Wants=network-pre.target\n\n"
        "[Service]\n"
        "Type=oneshot\n"
        "RemainAfterExit=yes\n"
        "ExecStart=ip link set host0 up\n"
        f"ExecStart=ip address replace {address}/{PREFIX_LEN} dev host0\n\n"
        "[Install]\n"
        "WantedBy=sysinit.target\n"
    )


def prepare_root(root: Path, name: str, address: str, table: Sequence[tuple[str, str]]) -> str:
    """Name, address and host keys in an unpacked root, before its first boot; the public host
    key. The tarball's keys are removed: every host of every run has its own."""
    (root / "etc/hostname").write_text(f"{name}\n")
    (root / "etc/hosts").write_text(hosts_file(name, table))
    for old in (root / "etc/ssh").glob("ssh_host_*"):
        old.unlink()
    pub = ssh_keys.keygen(root / HOST_KEY.lstrip("/"), f"root@{name}")
    # Only the key made here: sshd's default list names RSA and ECDSA keys too.
    (root / "etc/ssh/sshd_config.d").mkdir(exist_ok=True)
    (root / "etc/ssh/sshd_config.d/llamanix-fleet.conf").write_text(
        f"HostKey {HOST_KEY}\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
    )
    units = root / "etc/systemd/system"
    (units / ADDRESS_UNIT).write_text(address_unit(address))
    wants = units / "sysinit.target.wants"
    wants.mkdir(exist_ok=True)
    (wants / ADDRESS_UNIT).symlink_to(f"/etc/systemd/system/{ADDRESS_UNIT}")
    return " ".join(pub.read_text().split()[:2])


def ssh_config(members: Sequence[tuple[str, str]]) -> str:
    """The controller's ~/.ssh/config: each box by name, as user admin with the run's key, and
    only the known_hosts written from the hosts' own keys."""
    lines = ["# The fleet bed's hosts (llamanix.testbed.fleet)."]
    for name, address in members:
        lines += [f"Host {name}", f"    HostName {address}"]
    lines += [
        "Host *",
        f"    User {ADMIN}",
        "    IdentityFile ~/.ssh/id_ed25519",
        "    IdentitiesOnly yes",
        "    UserKnownHostsFile ~/.ssh/known_hosts",
        "    GlobalKnownHostsFile /dev/null",
        "    StrictHostKeyChecking yes",
        "    BatchMode yes",
        f"    ConnectTimeout {CONNECT_TIMEOUT_S}",
    ]
    return "\n".join(lines) + "\n"


def write_controller_home(home: Path, members: Sequence[Member]) -> None:
    ssh = home / ".ssh"
    ssh.mkdir(mode=0o700)
    ssh_keys.keygen(ssh / "id_ed25519", "admin@controller")
    (ssh / "config").write_text(ssh_config([(m.name, m.address) for m in members]))
    (ssh / "known_hosts").write_text(
        "".join(f"{m.name},{m.address} {m.host_key}\n" for m in members)
    )


# --- setting up each host -------------------------------------------------------------------


@dataclass(frozen=True)
class Installs:
    """What every host gets: this checkout's wheel and its dependencies (per Python), the
    llama-server binary and the models."""

    project_wheel: Path
    dependencies: Mapping[str, Path]
    binary: Path
    models: Sequence[Path]


def set_up_host(member: Member, client_key: str, installs: Installs) -> None:
    """In the booted host: the admin user with the client key and the documented sudoers
    line, and what a user installs."""
    host = member.host
    host.run(["useradd", "--create-home", "--uid", str(ADMIN_UID), "--shell", "/bin/sh", ADMIN])
    host.write(f"/home/{ADMIN}/.ssh/authorized_keys", client_key, mode=0o600, owner=ADMIN_UID)
    os.chmod(host.path(f"/home/{ADMIN}/.ssh"), 0o700)
    host.write(f"/etc/sudoers.d/{ADMIN}", sudoers_line(ADMIN) + "\n", mode=0o440)
    hosts.install_llamanix(host, installs.project_wheel, installs.dependencies[host.spec.python])
    host.run(["ln", "-sfn", hosts.LLAMANIX, "/usr/local/bin/llamanix"])
    hosts.install_llama_server(host, installs.binary)
    for model in installs.models:
        host.write(f"{hosts.MODELS}/{model.name}", model.read_bytes())


def _make_network(name: str) -> None:
    netns.ip(["netns", "add", name])
    netns.ip(["link", "set", "lo", "up"], name)
    netns.ip(["link", "add", BRIDGE, "type", "bridge"], name)
    netns.ip(["address", "add", f"{CONTROLLER_ADDRESS}/{PREFIX_LEN}", "dev", BRIDGE], name)
    netns.ip(["link", "set", BRIDGE, "up"], name)


def _start_holder(bed: Fleet, work: Path) -> None:
    """The process that holds the controller's namespaces; up once its overlay is mounted."""
    holder = netns.spawn_in(
        netns.home_holder_argv(bed.netns, bed.home, work), stdout=None, stdin_pipe=False
    )
    bed._holder = holder
    deadline = time.monotonic() + 30
    # Its last exec is `sleep`, after the mount: the wrappers before it exec too.
    while Path(f"/proc/{holder.pid}/comm").read_text().strip() != "sleep":
        if holder.poll() is not None:
            raise ExternalCommandError(f"the fleet's controller home: exit {holder.returncode}")
        if time.monotonic() > deadline:
            raise ExternalCommandError("the fleet's controller home was not mounted in 30s")
        time.sleep(0.05)


def _end(child: TextChild) -> None:
    if child.poll() is None:
        signal_group(child.pid, signal.SIGKILL)
    wait_exit(child, 10.0)


@contextlib.contextmanager
def fleet(
    names: Sequence[HostName],
    workdir: Path,
    *,
    project_wheel: Path,
    dependencies: Mapping[str, Path],
    binary: Path,
    models: Sequence[Path] = (),
) -> Iterator[Fleet]:
    """Boot a fleet of ``names`` (box1 is ``names[0]``, ...), set up as the module says, on a
    bed of its own. ``dependencies`` maps each Python version of those hosts to its wheels
    (``hosts.dependency_wheels``). Everything is torn down on the way out."""
    specs = [hosts.spec_of(n) for n in names]
    table = [(CONTROLLER_NAME, CONTROLLER_ADDRESS)]
    table += [(member_name(i), member_address(i)) for i in range(1, len(specs) + 1)]
    workdir.mkdir(parents=True, exist_ok=True)
    bed = Fleet(
        netns=f"llamanix-fleet-{os.getpid()}",
        home=Path(tempfile.mkdtemp(prefix="llamanix-fleet-home.")),
        members={},
    )
    # The overlay's work directory: on the home's file system, outside the home itself.
    overlay_work = Path(tempfile.mkdtemp(prefix="llamanix-fleet-work."))
    bridge = container.Bridge(bed.netns, BRIDGE)
    made_network = False
    try:
        _make_network(bed.netns)
        made_network = True
        for index, spec in enumerate(specs, start=1):
            name, address = member_name(index), member_address(index)
            root = hosts.unpack(spec, workdir / name)
            key = prepare_root(root, name, address, table)
            machine = f"{name}-{os.getpid()}"
            log = workdir / name / "console.log"
            own = cgroups.make_own(f"llamanix-{machine}")
            host = Host(spec, root, machine, log, bridge=bridge, cgroups=own)
            bed.members[name] = Member(name, address, host, key)
        write_controller_home(bed.home, list(bed.members.values()))
        client_key = (bed.home / ".ssh/id_ed25519.pub").read_text()
        _start_holder(bed, overlay_work)
        installs = Installs(project_wheel, dependencies, binary, models)

        def bring_up(member: Member) -> None:
            member.host.boot()
            set_up_host(member, client_key, installs)

        # Booting and installing wait on the hosts' own systemd and pip, mostly: side by side.
        with ThreadPoolExecutor(max_workers=len(specs)) as pool:
            for done in [pool.submit(bring_up, m) for m in bed.members.values()]:
                done.result()
        yield bed
    finally:
        for child in bed._children:
            _end(child)
        # Side by side: each shutdown is mostly waiting for the host's own systemd. A poweroff
        # ends in a kill when it must, and the rest of the teardown runs whatever it met.
        with ThreadPoolExecutor(max_workers=max(1, len(bed.members))) as pool:
            for member in bed.members.values():
                pool.submit(member.host.poweroff, 30.0)
        if bed._holder is not None:
            _end(bed._holder)
            bed._holder = None
        for member in bed.members.values():
            cgroups.remove(member.host.cgroups)
        if made_network:
            netns.ip(["netns", "delete", bed.netns])
        for member in bed.members.values():
            shutil.rmtree(member.host.root, ignore_errors=True)
        shutil.rmtree(bed.home, ignore_errors=True)
        shutil.rmtree(overlay_work, ignore_errors=True)
