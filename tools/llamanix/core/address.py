"""Listen addresses and the addresses a client on the same machine reaches them at.

A server listening on a wildcard is reached over the loopback of the same family: ``0.0.0.0``
at ``127.0.0.1``, ``::`` at ``::1`` (a server bound to ``::`` with IPV6_V6ONLY would not answer
on 127.0.0.1). Host names are passed through, except ``localhost``, which is pinned to
``127.0.0.1`` so that a client does not try ``::1`` first where the server bound only IPv4.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

LOCALHOST = "localhost"
LOOPBACK_V4 = "127.0.0.1"
LOOPBACK_V6 = "::1"


def bare(host: str) -> str:
    """``host`` without the brackets a URL puts around an IPv6 address."""
    if host.startswith("[") and host.endswith("]"):
        return host[1:-1]
    return host


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(bare(host))
    except ValueError:
        return None


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address, bracketed or not, or a name) is this machine's loopback."""
    if bare(host).lower().rstrip(".") == LOCALHOST:
        return True
    ip = _ip(host)
    return ip is not None and ip.is_loopback


def is_wildcard(host: str) -> bool:
    """Whether a server listening on ``host`` listens on every address (``0.0.0.0``, ``::``)."""
    ip = _ip(host)
    return ip is not None and ip.is_unspecified


def connect_host(listen_host: str) -> str:
    """The address a client on the same machine uses for a server listening on
    ``listen_host``: a wildcard becomes the loopback of its family, ``localhost`` becomes
    ``127.0.0.1``; anything else is itself (without brackets)."""
    host = bare(listen_host)
    ip = _ip(host)
    if ip is not None and ip.is_unspecified:
        return LOOPBACK_V6 if ip.version == 6 else LOOPBACK_V4
    if host.lower().rstrip(".") == LOCALHOST:
        return LOOPBACK_V4
    return host


def url_host(host: str) -> str:
    """``host`` as the host part of a URL: an IPv6 address in brackets."""
    host = bare(host)
    return f"[{host}]" if ":" in host else host


def connect_url(listen_host: str, port: int) -> str:
    """``http://HOST:PORT`` for a server listening on ``listen_host``, from the same machine."""
    return f"http://{url_host(connect_host(listen_host))}:{port}"


@dataclass(frozen=True)
class SshTarget:
    """An ssh target as the config names it: the user (None: ssh's own choice, from the ssh
    config), the machine (a name, an ssh config ``Host``, or an address; an IPv6 address
    without brackets) and the port (None: ssh's own choice). ``text`` is how it was written."""

    user: str | None
    host: str
    port: int | None
    text: str

    def __str__(self) -> str:
        return self.text

    @property
    def destination(self) -> str:
        """What ssh takes as its destination: ``[USER@]HOST`` (the port goes in ``-p``)."""
        return f"{self.user}@{self.host}" if self.user else self.host

    def ssh_args(self) -> list[str]:
        """ssh's arguments that name it: ``-p PORT`` where a port is given, then the
        destination."""
        return [*(["-p", str(self.port)] if self.port else []), self.destination]


# What a user name and a host name may hold: nothing ssh or a shell would read otherwise.
_USER = re.compile(r"[A-Za-z0-9._][A-Za-z0-9._-]*\$?")
_NAME = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9._-]*[A-Za-z0-9_])?")
SSH_SCHEME = "ssh://"


def parse_target(text: str) -> SshTarget:
    """``host``, ``user@host``, ``user@host:port``, ``ssh://user@host:port``, ``[v6]:port``
    (the user and the port optional in each); ValueError saying what ssh could not read."""
    rest = text.removeprefix(SSH_SCHEME)
    if not rest or rest != rest.strip() or any(ch.isspace() for ch in rest):
        raise ValueError("is empty or holds a space")
    if rest.startswith("-"):
        raise ValueError("starts with '-', which ssh would take for an option")
    user, at, machine = rest.rpartition("@")
    if at and not _USER.fullmatch(user):
        raise ValueError(f"'{user}' is not a user name ssh accepts")
    host, port = _host_and_port(machine)
    if _ip(host) is None and not _NAME.fullmatch(host):
        raise ValueError(f"'{host}' is neither a host name nor an address")
    return SshTarget(user if at else None, host, port, text)


def _host_and_port(machine: str) -> tuple[str, int | None]:
    port_text: str | None = None
    if machine.startswith("["):
        inside, close, after = machine[1:].partition("]")
        if not close or _ip(inside) is None or (after and not after.startswith(":")):
            raise ValueError(f"'{machine}' is not [IPv6 address] or [IPv6 address]:port")
        host, port_text = inside, after[1:] if after else None
    elif machine.count(":") == 1:
        host, port_text = machine.split(":")
    else:
        host = machine  # a name, an IPv4 address, or an IPv6 address without a port
    if port_text is None:
        return host, None
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"port '{port_text}' is not a number from 1 to 65535")
    return host, int(port_text)


def target_host(target: str) -> str:
    """The machine an ssh target names: ``root@gpu1:2222`` is ``gpu1``, ``[fd00::1]:22`` is
    ``fd00::1``."""
    return parse_target(target).host


def remote_host(listen: str, target: SshTarget | str | None, host_name: str) -> str:
    """The address another machine reaches a server at: its listen address where that is one
    address; for a wildcard the host's ssh target (its machine alone: no user, no port), else
    the host's name."""
    if not is_wildcard(listen):
        return connect_host(listen)
    if isinstance(target, str):
        target = parse_target(target)
    if target is not None:
        return target.host
    return host_name
