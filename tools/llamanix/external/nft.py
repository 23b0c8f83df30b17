"""nftables: a server's port refuses new requests from other machines while it restarts.

A restart cuts whatever the server is answering, and a response cut in mid-body cannot be
retried by anyone, a gateway included. Draining alone leaves a window: the drain finds the
server idle, and a request that arrives before the stop is begun and then cut. So before the
drain, a *fence* is put on the port: one nftables table per port (``inet llamanix-fence-PORT``)
whose input chain, for packets from any interface but loopback,

- drops a new connection's SYN: the client's TCP sends it again (after 1 s, then 2 s more, ...)
  and is answered once the fence is lifted, by the new server. A refused connection would be
  retried by a gateway on a replica picked at random, maybe this one again: LiteLLM, whose
  retries do not leave out the replica that failed, used up its eight retries on the fenced
  replica now and then (one request in about a thousand that met a fence);
- answers a segment that carries data on a connection already open (a new request on a
  kept-alive connection) with a TCP reset: the request never reaches the server, and the
  client, which got no byte of an answer, sends it again on a new connection;

while the acknowledgements of the answers in flight (segments without data) pass, so the
requests the server already has finish. Loopback passes untouched: the drain, the readiness
check and the gate talk to the server from its own machine.

"Carries data" is decided exactly from the headers: a TCP segment has data when the IP length
exceeds the IP header plus the TCP header (``tcp doff`` 32-bit words), one rule per header
length (IPv4 with a plain 20-byte header; IPv6 with TCP as the next header).

The fence lives in the kernel, not in a file: a reboot lifts it, and so does ``unfence``. A
switch that was killed with a fence up leaves it; the next switch lifts every fence it finds
(``fenced_ports``) before it starts.
"""

from __future__ import annotations

import os
import re
import shutil

from llamanix.core.errors import ExternalCommandError
from llamanix.external.process import run_captured

TABLE_PREFIX = "llamanix-fence-"
_TABLE = re.compile(rf"^table inet {re.escape(TABLE_PREFIX)}(\d+)$", re.MULTILINE)
# TCP header lengths in 32-bit words (5: no options, 15: the most options).
_DOFF = range(5, 16)


def table_of(port: int) -> str:
    return f"{TABLE_PREFIX}{port}"


def fence_script(port: int) -> str:
    """The nft script that puts the fence on ``port`` (one table, made in one transaction)."""
    rules = [
        'iifname "lo" accept',
        f"tcp dport {port} ct state new drop",
    ]
    for doff in _DOFF:
        header = 4 * doff
        rules.append(
            f"ip hdrlength 5 tcp dport {port} tcp doff {doff} ip length > {20 + header} "
            "reject with tcp reset"
        )
        rules.append(
            f"ip6 nexthdr tcp tcp dport {port} tcp doff {doff} ip6 length > {header} "
            "reject with tcp reset"
        )
    body = "\n".join(f"    {r}" for r in rules)
    return (
        f"table inet {table_of(port)} {{\n"
        "  chain input {\n"
        "    type filter hook input priority -10; policy accept;\n"
        f"{body}\n"
        "  }\n"
        "}\n"
    )


def unavailable() -> str | None:
    """Why no fence can be put up here (no nft, not root), or None."""
    if shutil.which("nft") is None:
        return "nft is not installed (apt-get install nftables)"
    if os.geteuid() != 0:
        return "nft needs root"
    return None


def fence(port: int) -> None:
    """Put the fence on ``port`` (an existing one is replaced)."""
    unfence(port)
    done = run_captured(["nft", "-f", "-"], input_text=fence_script(port), timeout_s=30)
    if done.returncode != 0:
        raise ExternalCommandError(f"nft: fence on port {port}: {done.stderr.strip()[:300]}")


def unfence(port: int) -> None:
    """Lift the fence from ``port``; none there is no error."""
    if port not in fenced_ports():
        return
    done = run_captured(["nft", "delete", "table", "inet", table_of(port)], timeout_s=30)
    if done.returncode != 0:
        raise ExternalCommandError(f"nft: lift the fence on port {port}: {done.stderr.strip()}")


REDIRECT_PREFIX = "llamanix-redirect-"
_REDIRECT = re.compile(rf"^table inet {re.escape(REDIRECT_PREFIX)}(\d+)$", re.MULTILINE)


def redirect_script(port: int, to_port: int) -> str:
    """New connections from other machines to ``port`` go to ``to_port`` on this machine (a
    blue-green switch's bridge); connections already open stay where they are (conntrack)."""
    return (
        f"table inet {REDIRECT_PREFIX}{port} {{\n"
        "  chain prerouting {\n"
        "    type nat hook prerouting priority dstnat; policy accept;\n"
        f'    iifname != "lo" tcp dport {port} redirect to :{to_port}\n'
        "  }\n"
        "}\n"
    )


def redirect(port: int, to_port: int) -> None:
    unredirect(port)
    done = run_captured(["nft", "-f", "-"], input_text=redirect_script(port, to_port), timeout_s=30)
    if done.returncode != 0:
        raise ExternalCommandError(f"nft: redirect port {port}: {done.stderr.strip()[:300]}")


def unredirect(port: int) -> None:
    if port not in redirected_ports():
        return
    table = f"{REDIRECT_PREFIX}{port}"
    done = run_captured(["nft", "delete", "table", "inet", table], timeout_s=30)
    if done.returncode != 0:
        raise ExternalCommandError(f"nft: end the redirect of port {port}: {done.stderr.strip()}")


def redirected_ports() -> list[int]:
    done = run_captured(["nft", "list", "tables", "inet"], timeout_s=30)
    if done.returncode != 0:
        return []
    return sorted(int(m.group(1)) for m in _REDIRECT.finditer(done.stdout))


def fenced_ports() -> list[int]:
    """The ports a fence is up on now."""
    done = run_captured(["nft", "list", "tables", "inet"], timeout_s=30)
    if done.returncode != 0:
        return []
    return sorted(int(m.group(1)) for m in _TABLE.finditer(done.stdout))
