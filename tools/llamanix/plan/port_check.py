"""A port another program holds on this machine: the unit would fail to bind it.

Checked by validate for the hosts of this machine (no target). The host's own servers hold
their ports while they run, and a switch restarts them: a port held by a llamanix unit (an
instance, router, gateway or exporter) or by a ``llamanix up`` is not in the way.
"""

from __future__ import annotations

import ipaddress
import re

from llamanix.config.model import Config, listening_ports
from llamanix.core.errors import Problem
from llamanix.external.listeners import Listener, listeners

_OUR_UNIT = re.compile(r"/llamanix-[^/]+\.service(/|$)", re.MULTILINE)
_UP = re.compile(r"(^|[/ ])llamanix up( |$)")


def _ours(listener: Listener) -> bool:
    if _OUR_UNIT.search(listener.cgroup):
        return True
    return any(
        _UP.search(command.replace("-m llamanix", "llamanix")) for command in listener.parents
    )


def _overlaps(listen: str, address: str) -> bool:
    """Whether a bind of ``listen`` fails where ``address`` already listens on the port: the
    same address, or either one a wildcard of its family (``::`` takes IPv4 too)."""
    try:
        ours, theirs = ipaddress.ip_address(listen), ipaddress.ip_address(address)
    except ValueError:
        return True  # a name: where it resolves is not known here, so assume the worst
    if ours == theirs:
        return True
    for wild, other in ((ours, theirs), (theirs, ours)):
        if wild.is_unspecified and (wild.version == other.version or wild.version == 6):
            return True
    return False


def taken_ports(config: Config, host: str) -> list[Problem]:
    """One problem per listener of ``host`` (on this machine) whose port another program
    holds."""
    problems: list[Problem] = []
    for field, listen, port in listening_ports(
        config.raw,
        {host: config.hosts[host]},
        {i.name: i for i in config.instances_on(host)},
        config.gateway,
        config.metrics,
    ):
        for holder in listeners(port):
            if _ours(holder) or not _overlaps(listen, holder.address):
                continue
            who = (
                f"{holder.command or '?'} (pid {holder.pid})"
                if holder.pid is not None
                else "a process this user cannot see"
            )
            problems.append(
                Problem(
                    config.source,
                    field,
                    f"port {port} is already taken on this machine: {who} listens on "
                    f"{holder.address}:{port}",
                    "choose a free port, or stop that program first",
                )
            )
            break
    return problems
