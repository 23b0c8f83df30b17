"""Who listens on a TCP port of this machine: /proc/net/tcp{,6} and each process's sockets.

Read without any program (ss would need iproute2), as root sees every process; a process this
user may not look into is still named by its port, with no owner.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

_LISTEN = "0A"


@dataclass(frozen=True)
class Listener:
    address: str  # as an IP address: 0.0.0.0, ::, 127.0.0.1
    port: int
    pid: int | None  # None where no process of this user's view holds the socket
    command: str  # its command line, or "" when unknown
    cgroup: str  # its cgroup path (the unit that runs it: ".../llamanix-chat.service")
    parents: tuple[str, ...]  # its ancestors' command lines, nearest first


def _address(hex_address: str) -> str:
    """A /proc/net/tcp{,6} address (hex, each 32-bit word in host byte order) as text."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


def listening_ports() -> frozenset[int]:
    """Every TCP port something listens on here."""
    return frozenset(port for _, port in _sockets(None).values())


def _sockets(port: int | None) -> dict[int, tuple[str, int]]:
    """inode -> (address, port) of the sockets listening on ``port`` (None: on any)."""
    found: dict[int, tuple[str, int]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _LISTEN:
                continue
            address, _, hex_port = fields[1].rpartition(":")
            number = int(hex_port, 16)
            if port is None or number == port:
                found[int(fields[9])] = (_address(address), number)
    return found


def _read(path: str) -> str:
    try:
        return Path(path).read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _parent(pid: int) -> int | None:
    stat = _read(f"/proc/{pid}/stat")
    # The command name may hold spaces and parentheses: the fields start after the last ")".
    fields = stat.rpartition(")")[2].split()
    return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None


def _owners(inodes: set[int]) -> dict[int, int]:
    """inode -> the pid of a process holding it."""
    owners: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fds = os.scandir(f"/proc/{entry.name}/fd")
        except OSError:
            continue
        with fds:
            for fd in fds:
                try:
                    target = os.readlink(fd.path)
                except OSError:
                    continue
                if target.startswith("socket:["):
                    inode = int(target[8:-1])
                    if inode in inodes:
                        owners.setdefault(inode, int(entry.name))
    return owners


def listeners(port: int) -> list[Listener]:
    """Every socket listening on TCP ``port`` here, with the process that holds it."""
    sockets = _sockets(port)
    if not sockets:
        return []
    owners = _owners(set(sockets))
    out: list[Listener] = []
    for inode, (address, number) in sorted(sockets.items()):
        pid = owners.get(inode)
        parents: list[str] = []
        parent = _parent(pid) if pid is not None else None
        while parent and parent > 1 and len(parents) < 16:
            parents.append(_read(f"/proc/{parent}/cmdline"))
            parent = _parent(parent)
        out.append(
            Listener(
                address=address,
                port=number,
                pid=pid,
                command=_read(f"/proc/{pid}/cmdline") if pid is not None else "",
                cgroup=_read(f"/proc/{pid}/cgroup") if pid is not None else "",
                parents=tuple(parents),
            )
        )
    return out
