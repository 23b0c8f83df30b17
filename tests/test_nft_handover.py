"""A blue-green handover's nftables steps (``llamanix.external.nft``), run for real: two
network namespaces joined by a veth pair, an "old" server and a "bridge" on one side, clients
on the other, and the redirect table taken through what ``hosts.restarts`` does with it
(follow, redirect, end the redirect, remove) while the clients stream.

What broke before: conntrack runs in a namespace only while a rule needs it. The redirect's
table was the first such rule and its removal the last, so (1) the connections open when the
redirect came were taken by conntrack for new ones, and those whose next packet came from the
client were sent to the bridge mid-stream ("Server disconnected without sending a response"),
and (2) the connections sent to the bridge lost their translation when the table went. Both
are covered: clients that open a connection per request, as a gateway's retries and a curl
do, and clients that keep one open from before the handover, as an agent's HTTP pool does.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from llamanix.external import netns

SERVER_ADDRESS, CLIENT_ADDRESS = "198.19.254.1", "198.19.254.2"
OLD_PORT, BRIDGE_PORT = 18480, 18481
ROUNDS = 3

# Answers POST with a chunked body written over about 0.2 s, its name in each chunk; keeps
# connections open (HTTP/1.1).
_SERVER = """
import http.server, socketserver, sys, time
port, name = int(sys.argv[1]), sys.argv[2].encode()
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for _ in range(6):
            self.wfile.write(b"%x\\r\\n%s\\r\\n" % (len(name), name))
            self.wfile.flush()
            time.sleep(0.03)
        self.wfile.write(b"0\\r\\n\\r\\n")
    def log_message(self, *args):
        pass
class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
Server(("0.0.0.0", port), Handler).serve_forever()
"""

# Two clients that open a connection per request, two that keep theirs, and one that keeps
# its connection idle for a while between requests (its next packet may be the first that
# conntrack sees of it, with the redirect on), until the stop file appears; each request's
# outcome and who answered it, as JSON.
_CLIENTS = """
import json, os, sys, threading, time, httpx
url, stop, out = sys.argv[1:4]
seen = []
def ask(client, kind):
    try:
        r = client.post(url, content=b"x" * 300, headers=headers[kind])
        by = {"old" * 6: "old", "bridge" * 6: "bridge"}.get(r.text, "")
        ok = r.status_code == 200 and by != ""
        return ok, by, "" if ok else f"HTTP {r.status_code}: {r.text[:60]!r}"
    except httpx.HTTPError as err:
        return False, "", repr(err)[:160]
headers = {"new": {"Connection": "close"}, "kept": {}, "idle": {}}
pause = {"new": 0.01, "kept": 0.01, "idle": 1.3}
def run(kind):
    with httpx.Client(timeout=10) as client:
        while not os.path.exists(stop):
            began = time.monotonic()
            ok, by, why = ask(client, kind)
            seen.append({"kind": kind, "began": began, "ok": ok, "by": by, "why": why})
            time.sleep(pause[kind])
kinds = ("new", "new", "kept", "kept", "idle")
threads = [threading.Thread(target=run, args=(k,)) for k in kinds]
for t in threads:
    t.start()
for t in threads:
    t.join()
with open(out, "w") as f:
    json.dump(seen, f)
"""

# One step of the handover, in the server's namespace, through llamanix's own functions.
_STEP = """
import sys
from llamanix.external import nft
step, port, to = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
{"track": lambda: nft.track(port), "redirect": lambda: nft.redirect(port, to),
 "end": lambda: nft.end_redirect(port), "untrack": lambda: nft.untrack(port)}[step]()
"""


@dataclass(frozen=True)
class Pair:
    server_ns: str
    client_ns: str


@pytest.fixture
def pair() -> Iterator[Pair]:
    if os.geteuid() != 0:
        pytest.skip("network namespaces and nftables need root")
    for program, package in (("ip", "iproute2"), ("nft", "nftables")):
        if shutil.which(program) is None:
            pytest.fail(f"{program} is missing: apt-get install {package} (.ci/run does)")
    p = Pair(f"llamanix-nft-{os.getpid()}-s", f"llamanix-nft-{os.getpid()}-c")
    veth = f"lnft{os.getpid() % 100000}"
    try:
        for name in (p.server_ns, p.client_ns):
            netns.ip(["netns", "add", name])
            netns.ip(["link", "set", "lo", "up"], name)
        netns.ip(["link", "add", f"{veth}s", "netns", p.server_ns, "type", "veth", "peer", "name",
                  f"{veth}c", "netns", p.client_ns])  # fmt: skip
        for name, dev, address in (
            (p.server_ns, f"{veth}s", SERVER_ADDRESS),
            (p.client_ns, f"{veth}c", CLIENT_ADDRESS),
        ):
            netns.ip(["address", "add", f"{address}/30", "dev", dev], name)
            netns.ip(["link", "set", dev, "up"], name)
        yield p
    finally:
        for name in (p.server_ns, p.client_ns):
            subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)


def _in(ns: str, *argv: str) -> list[str]:
    return netns.exec_argv(ns, [sys.executable, *argv])


def _step(pair: Pair, step: str) -> None:
    argv = _in(pair.server_ns, "-c", _STEP, step, str(OLD_PORT), str(BRIDGE_PORT))
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr


def _wait_listening(ns: str, port: int) -> None:
    deadline = time.monotonic() + 30
    while (
        f":{port} "
        not in subprocess.run(
            netns.exec_argv(ns, ["ss", "-Hltn"]), capture_output=True, text=True, check=False
        ).stdout
    ):
        assert time.monotonic() < deadline, f"nothing listens on {port} in {ns}"
        time.sleep(0.05)


def test_a_handover_breaks_no_connection(pair: Pair, tmp_path: Path) -> None:
    """ROUNDS handovers under load: no request fails; the bridge answers new connections
    while the redirect is on; a connection kept open from before stays with the old server."""
    servers = [
        subprocess.Popen(
            _in(pair.server_ns, "-c", _SERVER, str(port), name), start_new_session=True
        )
        for port, name in ((OLD_PORT, "old"), (BRIDGE_PORT, "bridge"))
    ]
    stop, out = tmp_path / "stop", tmp_path / "out.json"
    clients: subprocess.Popen[bytes] | None = None
    try:
        for port in (OLD_PORT, BRIDGE_PORT):
            _wait_listening(pair.server_ns, port)
        url = f"http://{SERVER_ADDRESS}:{OLD_PORT}/"
        clients = subprocess.Popen(_in(pair.client_ns, "-c", _CLIENTS, url, str(stop), str(out)))
        # The kept connections are open before the first handover starts.
        time.sleep(1.0)
        windows: list[tuple[float, float]] = []
        for _ in range(ROUNDS):
            _step(pair, "track")  # before the bridge starts
            time.sleep(0.5)  # the bridge loads
            _step(pair, "redirect")
            on = time.monotonic()
            time.sleep(1.5)  # the old server drains and stops, the unit starts
            _step(pair, "end")
            windows.append((on, time.monotonic()))
            time.sleep(1.0)  # the bridge drains and stops
            _step(pair, "untrack")
            time.sleep(0.5)
        stop.touch()
        assert clients.wait(timeout=60) == 0
        seen = json.loads(out.read_text())
    finally:
        # The clients end on the stop file, whatever failed above.
        stop.touch()
        if clients is not None and clients.poll() is None:
            try:
                clients.wait(timeout=60)
            except subprocess.TimeoutExpired:
                clients.kill()
                clients.wait()
        for server in servers:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=10)
    failed = [s for s in seen if not s["ok"]]
    new = [s for s in seen if s["kind"] == "new"]
    kept = [s for s in seen if s["kind"] in ("kept", "idle")]
    print(f"{len(seen)} requests ({len(new)} on new connections, {len(kept)} on kept ones), "
          f"{len(failed)} failed: {[f['why'] for f in failed[:3]]}")  # fmt: skip
    assert failed == [], failed[:3]
    # The redirect did its work: a new connection made well inside a window (past the step's
    # own startup) went to the bridge, one made outside the windows to the old server.
    inside = [s for s in new if any(a + 0.3 < s["began"] < b - 0.3 for a, b in windows)]
    outside = [s for s in new if all(not a - 0.3 < s["began"] < b + 0.3 for a, b in windows)]
    assert inside and {s["by"] for s in inside} == {"bridge"}, inside[:3]
    assert outside and {s["by"] for s in outside} == {"old"}, outside[:3]
    # A connection open from before stays where it is, the redirect on or not.
    assert kept and {s["by"] for s in kept} == {"old"}, kept[:3]
    # Nothing is left behind.
    tables = subprocess.run(netns.exec_argv(pair.server_ns, ["nft", "list", "tables"]),
                            capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert "llamanix" not in tables, tables
