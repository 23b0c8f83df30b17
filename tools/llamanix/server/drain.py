"""Draining a server before it restarts, and the gap a restart leaves.

A restart cuts every request the server is answering: a streamed answer that has begun cannot
be retried by anyone, not even a gateway. So before a switch restarts a server it *drains* it:
it asks the server how many requests it has (the ``requests_processing`` and
``requests_deferred`` gauges of ``/metrics``, else its busy ``/slots``) every few
milliseconds, and lets the restart go the moment none is, or when ``--drain-timeout`` has
passed.

The *gap* is what clients of that one server see: from the old server's last answer to the new
server's first. An ``AnswerWatch`` asks ``GET /health`` every ``poll_s`` from before the drain
until the switch is done, and keeps the times of the answers; the new process's start time
(systemd's, on the same monotonic clock) splits them into the old server's and the new one's.
Next to the gap stands the new server's *load time*, from its process start to its first
answer: the part of the gap no switch can avoid with one copy of the model in memory. What is
left (the old server's stop, the manager's start, one poll) is the switch's own cost.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

# Between two looks at the slots: a request that arrives in this window, after the look that
# found the server idle and before the stop, is cut before it has an answer (the gateway then
# sends it again elsewhere), so the window is kept to a few milliseconds.
DRAIN_POLL_S = 0.005
WATCH_POLL_S = 0.02


# After a fence went up on the server's port (``external.nft``), how long a look must come after
# it to count as idle: a request that got in just before the fence reaches the server's task
# queue within this time (it is read and parsed; the look itself is queued behind it).
DRAIN_SETTLE_S = 0.1


@dataclass(frozen=True)
class Endpoint:
    """A server as the switch reaches it. A router (``router``: its kind) is asked about each
    of its ``members`` (the model names it serves) that is loaded."""

    url: str
    api_key: str | None = None
    router: str | None = None
    members: tuple[str, ...] = ()

    def client(self, timeout_s: float) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        return httpx.Client(
            base_url=self.url.rstrip("/"),
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=timeout_s),
        )


@dataclass(frozen=True)
class Drained:
    """How a drain ended."""

    waited_s: float
    # False: --drain-timeout passed with requests in flight (``in_flight`` of them), or the
    # server could not say (``in_flight`` None), and the restart went ahead anyway.
    idle: bool
    in_flight: int | None
    # When the server last answered the drain's question (time.monotonic()); None when it
    # never did.
    last_answer: float | None


def in_flight(
    http: httpx.Client, prefix: str = "", params: dict[str, str] | None = None
) -> int | None:
    """Requests the server has now: those its slots work on and those waiting for a slot
    (``/metrics``' gauges), else its busy slots (``/slots``: a server without metrics); None
    when it answers neither (a variant without them, or not serving). ``prefix`` and
    ``params``: where a router forwards the question to one member."""
    try:
        resp = http.get(f"{prefix}/metrics", params=params)
        if resp.status_code == 200:
            gauges = dict(
                line.split(maxsplit=1)
                for line in resp.text.splitlines()
                if line.startswith(("llamacpp:requests_processing", "llamacpp:requests_deferred"))
            )
            if "llamacpp:requests_processing" in gauges:
                return sum(int(float(v)) for v in gauges.values())
        resp = http.get(f"{prefix}/slots", params=params)
        if resp.status_code == 200:
            slots = resp.json()
            if isinstance(slots, list):
                return sum(1 for s in slots if isinstance(s, dict) and s.get("is_processing"))
    except (httpx.HTTPError, ValueError):
        return None
    return None


_LISTEN = "0A"


def _loopback(address: str) -> bool:
    """A /proc/net/tcp{,6} address (hex, host byte order per 32-bit word) on loopback."""
    host = address.split(":", 1)[0]
    if len(host) == 8:
        return int(host[6:8], 16) == 127
    words = [host[i : i + 8] for i in range(0, 32, 8)]
    if words[:3] == ["00000000"] * 3:
        return words[3] == "01000000"  # ::1
    if words[:2] == ["00000000"] * 2 and words[2] == "FFFF0000":
        return int(words[3][6:8], 16) == 127  # ::ffff:127.x.x.x
    return False


def queued_bytes(port: int) -> int:
    """Bytes on the way on this machine's connections to local ``port`` from other machines:
    an answer not yet acknowledged by its client, or a request not yet read by the server.
    A server whose last answer is still being written has finished its task (its slots are
    idle) and must not be stopped yet."""
    total = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 5 or fields[3] == _LISTEN:
                continue
            local, remote, queues = fields[1], fields[2], fields[4]
            if int(local.rsplit(":", 1)[1], 16) != port or _loopback(remote):
                continue
            tx, rx = queues.split(":")
            total += int(tx, 16) + int(rx, 16)
    return total


def router_in_flight(http: httpx.Client, endpoint: Endpoint) -> int | None:
    """The requests a router's loaded members have (a member that is not loaded has none);
    None when the router answers for none of them."""
    total: int | None = None
    for member in endpoint.members:
        if endpoint.router == "llama-swap":
            # llama-swap would load a member its /upstream/ path names: ask only running ones.
            try:
                running = http.get("/running").json().get("running", [])
            except (httpx.HTTPError, ValueError, AttributeError):
                return None
            if member not in {r.get("model") for r in running if isinstance(r, dict)}:
                total = total or 0
                continue
            busy = in_flight(http, f"/upstream/{member}")
        else:
            # llama-server's router proxies /metrics and /slots to the member named; with
            # autoload=false it answers an error for a member that is not loaded.
            busy = in_flight(http, "", {"model": member, "autoload": "false"})
        total = (total or 0) + (busy or 0)
    return total


def drain(
    endpoint: Endpoint,
    timeout_s: float,
    poll_s: float = DRAIN_POLL_S,
    settle_until: float | None = None,
    port: int | None = None,
) -> Drained:
    """Wait until the server at ``endpoint`` has no request in flight, at most ``timeout_s``.
    ``settle_until`` (time.monotonic()): an idle look counts only from then on (a fence went
    up just before). ``port``: the server's port on this machine, whose connections from other
    machines must have nothing on the way either (``queued_bytes``)."""
    started = time.monotonic()
    last_answer: float | None = None
    busy: int | None = None
    with endpoint.client(timeout_s=2.0) as http:
        while True:
            asked = time.monotonic()
            busy = router_in_flight(http, endpoint) if endpoint.router else in_flight(http)
            if busy == 0 and port is not None and queued_bytes(port):
                busy = 1  # an answer still being written, or a request not yet read
            now = time.monotonic()
            if busy is not None:
                last_answer = now
            if busy == 0 and (settle_until is None or asked >= settle_until):
                return Drained(now - started, True, 0, last_answer)
            if busy is None and last_answer is None:
                # Nothing to wait for: it does not serve, or cannot say what it is doing.
                return Drained(now - started, False, None, None)
            if now - started >= timeout_s:
                return Drained(now - started, False, busy, last_answer)
            time.sleep(poll_s)


class AnswerWatch:
    """Asks ``GET /health`` of some servers every ``poll_s`` in a thread of its own, and keeps
    the time of each answer (HTTP 200) it gets, until ``stop``."""

    def __init__(self, endpoints: Sequence[Endpoint], poll_s: float = WATCH_POLL_S) -> None:
        self._endpoints = list(endpoints)
        self._poll_s = poll_s
        self._answers: list[float] = []
        self._by_endpoint: list[list[float]] = [[] for _ in self._endpoints]
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="answer-watch", daemon=True)

    def __enter__(self) -> AnswerWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)

    def answers(self, endpoint: int | None = None) -> list[float]:
        """The times of the answers: of every endpoint, or of the ``endpoint``-th one."""
        if endpoint is not None:
            return list(self._by_endpoint[endpoint])
        return list(self._answers)

    def _run(self) -> None:
        # One connection per probe: a pooled connection to the old server would only fail
        # once, late, where a fresh one sees at once whether anyone listens.
        clients = [e.client(timeout_s=1.0) for e in self._endpoints]
        try:
            while not self._done.is_set():
                for index, http in enumerate(clients):
                    try:
                        ok = http.get("/health", headers={"Connection": "close"}).status_code
                    except httpx.HTTPError:
                        continue
                    if ok == 200:
                        now = time.monotonic()
                        self._answers.append(now)
                        self._by_endpoint[index].append(now)
                self._done.wait(self._poll_s)
        finally:
            for http in clients:
                http.close()


@dataclass(frozen=True)
class Gap:
    """One restart as its clients saw it (seconds; times are time.monotonic())."""

    last_old: float | None
    first_new: float | None
    started: float

    @property
    def gap_s(self) -> float | None:
        if self.last_old is None or self.first_new is None:
            return None
        return self.first_new - self.last_old

    @property
    def load_s(self) -> float | None:
        return None if self.first_new is None else self.first_new - self.started


def longest_silence(answers: Sequence[float], start: float, end: float) -> float:
    """The longest time between ``start`` and ``end`` in which nothing answered."""
    times = [start, *sorted(t for t in answers if start < t < end), end]
    return max(b - a for a, b in itertools.pairwise(times))


def gap_of(answers: Sequence[float], started: float, drained: Drained | None = None) -> Gap:
    """The gap around a new server process that started at ``started``: the last answer
    before it (the watch's or the drain's) and the first one after."""
    before = [t for t in answers if t < started]
    if drained is not None and drained.last_answer is not None:
        before.append(drained.last_answer)
    after = [t for t in answers if t >= started]
    return Gap(max(before, default=None), min(after, default=None), started)
