"""Listen addresses and the addresses a client on the same machine reaches them at.

A server listening on a wildcard is reached over the loopback of the same family: ``0.0.0.0``
at ``127.0.0.1``, ``::`` at ``::1`` (a server bound to ``::`` with IPV6_V6ONLY would not answer
on 127.0.0.1). Host names are passed through, except ``localhost``, which is pinned to
``127.0.0.1`` so that a client does not try ``::1`` first where the server bound only IPv4.
"""

from __future__ import annotations

import ipaddress

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


def target_host(target: str) -> str:
    """The machine an ssh target names: ``root@gpu1:2222`` is ``gpu1``, ``[fd00::1]:22`` is
    ``fd00::1``."""
    host = target.rsplit("@", 1)[-1]
    if host.startswith("["):
        return bare(host.split("]", 1)[0] + "]")
    if host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host


def remote_host(listen: str, target: str | None, host_name: str) -> str:
    """The address another machine reaches a server at: its listen address where that is one
    address; for a wildcard the host's ssh target (its machine part), else the host's name."""
    if not is_wildcard(listen):
        return connect_host(listen)
    if target:
        return target_host(target)
    return host_name
