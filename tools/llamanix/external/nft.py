"""nftables: a server's port refuses new requests from other machines while it restarts.

A restart cuts whatever the server is answering, and a response cut in mid-body cannot be
retried by anyone, a gateway included. Draining alone leaves a window: the drain finds the
server idle, and a request that arrives before the stop is begun and then cut. So before the
drain, a *fence* is put on the port: one nftables table per port (``inet llamanix-fence-PORT``)
whose input chain, for packets from any interface but loopback,

- drops a new connection's SYN: the client's TCP sends it again (after 1 s, then 2 s more, ...)
  and is answered once the fence is lifted, by the new server. The SYN is told by its flags
  (SYN without ACK), not by conntrack's state: conntrack runs in a network namespace only while
  a rule needs it, and when it starts it takes the next packet of a connection already open for
  a new connection's. A refused connection would be retried by a gateway on a replica picked
  at random, maybe this one again: LiteLLM, whose retries do not leave out the replica that
  failed, used up its eight retries on the fenced replica now and then (one request in about a
  thousand that met a fence);
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
switch that was killed with a fence up leaves it; ``llamanix doctor`` names it, and the next
switch, rollback or ``llamanix tidy`` lifts every fence it finds (``fenced_ports``).
"""

from __future__ import annotations

import os
import re
import shutil

from llamanix.core.errors import ExternalCommandError
from llamanix.external.process import run_captured

TABLE_PREFIX = "llamanix-fence-"
_TABLE = re.compile(rf"^table inet {re.escape(TABLE_PREFIX)}(\d+)$", re.MULTILINE)
# A connection's first segment: SYN set, ACK not.
_SYN = "tcp flags & (syn | ack) == syn"
# TCP header lengths in 32-bit words (5: no options, 15: the most options).
_DOFF = range(5, 16)


def table_of(port: int) -> str:
    return f"{TABLE_PREFIX}{port}"


def fence_script(port: int) -> str:
    """The nft script that puts the fence on ``port`` (one table, made in one transaction)."""
    rules = [
        'iifname "lo" accept',
        f"tcp dport {port} {_SYN} drop",
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
    if port in fenced_ports():
        _delete_table(table_of(port), f"lift the fence on port {port}")


def _delete_table(table: str, what: str) -> None:
    done = run_captured(["nft", "delete", "table", "inet", table], timeout_s=30)
    if done.returncode != 0:
        raise ExternalCommandError(f"nft: {what}: {done.stderr.strip()}")


def _ports(tables: re.Pattern[str], what: str) -> list[int]:
    """The ports of the inet tables whose names ``tables`` matches. An nft that fails says
    nothing of what is there: that is an error, never "none"."""
    done = run_captured(["nft", "list", "tables", "inet"], timeout_s=30)
    if done.returncode != 0:
        why = done.stderr.strip()[:300] or f"exit code {done.returncode}"
        raise ExternalCommandError(f"nft list tables inet (looking for {what}) failed: {why}")
    return sorted(int(m.group(1)) for m in tables.finditer(done.stdout))


REDIRECT_PREFIX = "llamanix-redirect-"
_REDIRECT = re.compile(rf"^table inet {re.escape(REDIRECT_PREFIX)}(\d+)$", re.MULTILINE)


def redirect_table(port: int) -> str:
    return f"{REDIRECT_PREFIX}{port}"


def redirect_script(port: int, to_port: int | None) -> str:
    """The nft script that makes ``port``'s redirect table what a blue-green switch needs now:
    new connections from other machines to ``port`` go to ``to_port`` on this machine (its
    bridge), or stay on ``port`` (None); in one transaction, so the table is never empty.

    Its first rule follows every new connection to ``port`` (``ct state new``): a rule that
    reads conntrack is what keeps conntrack running in this network namespace, and it must run
    from before the redirect (so that each connection is known from its SYN) until the bridge
    has stopped: without conntrack the redirect of a connection already made is forgotten, and
    its next packets go to the old port, which resets them. The redirect itself takes SYNs only
    (``_SYN``): conntrack takes the first packet it sees of a connection opened before it ran
    for a new connection's, and such a connection stays where it is."""
    table = redirect_table(port)
    rules = [f'iifname != "lo" tcp dport {port} ct state new counter']
    if to_port is not None:
        rules.append(f'iifname != "lo" tcp dport {port} {_SYN} redirect to :{to_port}')
    body = "\n".join(f"    {r}" for r in rules)
    return (
        # Made if it is not there, then emptied and filled again: one transaction.
        f"table inet {table} {{}}\n"
        f"flush table inet {table}\n"
        f"table inet {table} {{\n"
        "  chain prerouting {\n"
        "    type nat hook prerouting priority dstnat; policy accept;\n"
        f"{body}\n"
        "  }\n"
        "}\n"
    )


def _apply_redirect(port: int, to_port: int | None, what: str) -> None:
    script = redirect_script(port, to_port)
    done = run_captured(["nft", "-f", "-"], input_text=script, timeout_s=30)
    if done.returncode != 0:
        raise ExternalCommandError(f"nft: {what} port {port}: {done.stderr.strip()[:300]}")


def track(port: int) -> None:
    """Start following the connections to ``port`` (its redirect table, with no redirect yet):
    before a bridge starts, so that the connections made while it loads are known from their
    SYN."""
    _apply_redirect(port, None, "follow the connections to")


def redirect(port: int, to_port: int) -> None:
    """New connections from other machines to ``port`` go to ``to_port``; those already open
    stay where they are."""
    _apply_redirect(port, to_port, "redirect")


def end_redirect(port: int) -> None:
    """New connections to ``port`` stay on it again; those redirected before keep going to
    where they were sent until ``untrack``."""
    _apply_redirect(port, None, "end the redirect of")


def untrack(port: int) -> None:
    """Remove ``port``'s redirect table (once its bridge has stopped); none there is no
    error."""
    if port in redirected_ports():
        _delete_table(redirect_table(port), f"remove the redirect of port {port}")


def redirected_ports() -> list[int]:
    """The ports a redirect table is up on now (``ExternalCommandError`` when nft fails)."""
    return _ports(_REDIRECT, "redirects")


def fenced_ports() -> list[int]:
    """The ports a fence is up on now (``ExternalCommandError`` when nft fails)."""
    return _ports(_TABLE, "fences")
