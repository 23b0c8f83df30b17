"""One endpoint across hosts, and switches its clients do not notice (issue: a gateway).

A fleet bed of three hosts (llamanix.testbed.fleet): box1 (Debian 12) and box2 (Debian 13)
each serve the tiny model under the alias "chat"; box3 (Debian 12) runs the `[gateway]`, LiteLLM
1.106.12 installed by `llamanix switch` from PyPI's wheels through the host's own pip
configuration. Four clients stream chats through the gateway the whole time while the
controller rolls a switch over both replicas, and then switches one replica to a binary that
cannot start (its gate fails and it rolls back). Each scenario prints what the clients saw:
requests, failed requests, the endpoint's unavailability (the time covered by failed
requests), and each replica's gap and load time as the switch measured them.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cli_run import llamanix_argv
from conftest import HOST_FIGURES, REPO
from hostbed import new_key, tiny_fleet

from llamanix.core.schema import LITELLM_VERSION
from llamanix.testbed import hosts
from llamanix.testbed.fleet import Fleet
from llamanix.testbed.gateway_wheels import litellm_wheels, offer_wheels

pytestmark = [pytest.mark.hosts]

NAMES: tuple[hosts.HostName, ...] = ("debian12", "debian13", "debian12")
CONFIG = "/root/fleet/llamanix.toml"
SERVER = "/usr/local/bin/llama-server"
BROKEN = "/usr/local/bin/llama-server-broken"
MODEL = f"{hosts.MODELS}/tiny.gguf"
REPLICAS = {"box1": 18081, "box2": 18082}
GATEWAY_PORT = 4000
GATEWAY_KEY = "/etc/llamanix/gateway.key"
CLIENTS = 4
# The run's figures: pytest's end-of-run summary prints them (conftest.HOST_FIGURES), also where
# output is captured, as in CI.
FIGURES = HOST_FIGURES
CONTROLLER_ENV = {"PYTHONPATH": str(REPO / "tools")}


def fleet_config(context: int | dict[str, int], broken: str | None = None) -> str:
    """Both replicas and the gateway; ``context``: both replicas', or each one's by host."""
    contexts = context if isinstance(context, dict) else dict.fromkeys(REPLICAS, context)
    text = ""
    for name in (*REPLICAS, "box3"):
        binary = BROKEN if name == broken else SERVER
        text += (
            f'[hosts.{name}]\nkind = "systemd"\ntarget = "admin@{name}"\n'
            f'binaries = {{ upstream = "{binary}" }}\n\n'
        )
    text += (
        f'[gateway]\nkind = "litellm"\nhost = "box3"\nlisten = "0.0.0.0"\n'
        f'port = {GATEWAY_PORT}\napi_key_file = "{GATEWAY_KEY}"\n\n'
    )
    for name, port in REPLICAS.items():
        text += (
            f'[instances.chat-{name}]\nhost = "{name}"\nvariant = "upstream"\nalias = "chat"\n'
            f'model = "{MODEL}"\nlisten = "0.0.0.0"\nport = {port}\ncontext = {contexts[name]}\n'
            # Open on the bed's private network: the gateway in front holds the key clients use.
            "parallel = 2\nkeyless = true\n\n"
        )
    return text


@dataclass(frozen=True)
class Bed:
    fleet: Fleet
    key_file: Path  # the gateway's key, where the clients (in the bed) read it


@pytest.fixture(scope="module")
def bed(
    host_bed: None,
    tmp_path_factory: pytest.TempPathFactory,
    project_wheel: Path,
    llama_server_bin: Path,
) -> Iterator[Bed]:
    work = tmp_path_factory.mktemp("fleet-gateway")
    wheels = litellm_wheels(hosts.SPECS["debian12"].python)
    with tiny_fleet(NAMES, work, project_wheel, llama_server_bin) as (fleet, took):
        FIGURES.append(f"fleet of 3 up and installed in {took:.0f}s")
        fleet.host("box2").write(BROKEN, "#!/bin/sh\nexit 1\n", mode=0o755)
        gateway = fleet.host("box3")
        offer_wheels(gateway, wheels)
        key = new_key()
        gateway.write(GATEWAY_KEY, key + "\n", mode=0o600)
        key_file = fleet.home / "gateway.key"
        key_file.write_text(key + "\n")
        key_file.chmod(0o600)
        yield Bed(fleet, key_file)


def write_config(bed: Bed, text: str) -> None:
    path = bed.fleet.home / "fleet" / "llamanix.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def llamanix(bed: Bed, *args: str, timeout_s: float = 900) -> tuple[int, str, str]:
    done = bed.fleet.controller(llamanix_argv(*args), timeout_s=timeout_s, env=CONTROLLER_ENV)
    return done.returncode, done.stdout, done.stderr


# Runs on the controller (in the bed's network): CLIENTS clients stream chats through the
# gateway until the stop file appears; each request's start, end, whether it succeeded, and why
# not. It first waits for the gateway to answer, then writes the ready file.
_LOAD = """
import json, os, sys, threading, time, httpx
url, key_file, ready, stop, out, clients = sys.argv[1:7]
key = open(key_file).read().strip()
headers = {"Authorization": f"Bearer {key}"}
body = {"model": "chat", "stream": True, "max_tokens": 48,
        "messages": [{"role": "user", "content": "Tell me a story."}]}
deadline = time.monotonic() + 300
while True:
    try:
        r = httpx.post(url + "/v1/chat/completions", headers=headers, timeout=30,
                       json={**body, "stream": False, "max_tokens": 2})
        if r.status_code == 200:
            break
    except httpx.HTTPError:
        pass
    if time.monotonic() > deadline:
        sys.exit("the gateway did not answer within 300 s")
    time.sleep(0.5)
results = []
# Ten minutes at most: a test killed before it made the stop file leaves no client behind.
give_up = time.monotonic() + 600
def client():
    with httpx.Client(timeout=120, headers=headers) as c:
        while not os.path.exists(stop) and time.monotonic() < give_up:
            began, ok, why = time.monotonic(), False, ""
            try:
                with c.stream("POST", url + "/v1/chat/completions", json=body) as r:
                    if r.status_code != 200:
                        why = f"HTTP {r.status_code}: {r.read()[:300]!r}"
                    else:
                        lines = [line for line in r.iter_lines() if line]
                        ok = lines[-1:] == ["data: [DONE]"] and not any(
                            '"error"' in line for line in lines)
                        why = "" if ok else "stream: " + " | ".join(lines[-2:])[:300]
            except httpx.HTTPError as err:
                why = repr(err)[:300]
            results.append([began, time.monotonic(), ok, why])
threads = [threading.Thread(target=client) for _ in range(int(clients))]
for t in threads:
    t.start()
open(ready, "w").close()
for t in threads:
    t.join()
with open(out, "w") as f:
    json.dump(results, f)
"""


def covered(spans: list[tuple[float, float]]) -> tuple[float, float]:
    """The time the union of ``spans`` covers, and where the first began (0 for none)."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(spans):
        total += max(0.0, stop - max(start, end))
        end = max(end, stop)
    return total, min((s for s, _ in spans), default=0.0)


@dataclass(frozen=True)
class Seen:
    requests: int
    failed: list[str]
    unavailable_s: float


class Load:
    """CLIENTS streaming clients through the gateway, on the controller, while a block runs."""

    def __init__(self, bed: Bed, name: str) -> None:
        self.dir = bed.fleet.home / f"load-{name}"
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir()
        url = f"http://{bed.fleet.address('box3')}:{GATEWAY_PORT}"
        self.files = {n: self.dir / n for n in ("ready", "stop", "out.json", "log")}
        self.log = self.files["log"].open("w")
        argv = [sys.executable, "-c", _LOAD, url, str(bed.key_file)]
        argv += [str(self.files[n]) for n in ("ready", "stop", "out.json")] + [str(CLIENTS)]
        self.child = bed.fleet.controller_popen(argv, stdout=self.log)
        deadline = time.monotonic() + 330
        while not self.files["ready"].exists():
            assert self.child.poll() is None, self.files["log"].read_text()[-2000:]
            assert time.monotonic() < deadline, "the load never started"
            time.sleep(0.2)

    def end(self) -> Seen:
        # Some more seconds of load after the switch: the replicas serve again.
        time.sleep(3)
        self.files["stop"].touch()
        self.child.wait(timeout=180)
        self.log.close()
        assert self.files["out.json"].exists(), self.files["log"].read_text()[-2000:]
        results = json.loads(self.files["out.json"].read_text())
        failed = [r for r in results if not r[2]]
        # The time covered by failed requests: what a client of the endpoint could not use.
        unavailable, _ = covered([(r[0], r[1]) for r in failed])
        return Seen(len(results), [r[3] for r in failed], unavailable)


def _s(value: object) -> str:
    """Seconds, or "none" where the switch measured nothing (a server that never answered)."""
    return f"{value:.3f} s" if isinstance(value, float | int) else "none"


def report(label: str, seen: Seen, rows: dict[str, dict[str, object]]) -> None:
    gaps = []
    for host, row in sorted(rows.items()):
        for name, gap in row.get("gaps", {}).items():  # type: ignore[union-attr]
            gaps.append(
                f"{host}/{name}: gap {_s(gap['gap_s'])}, load {_s(gap['load_s'])}, "
                f"drain {_s(gap['drain_s'])}, out of rotation {_s(gap.get('fenced_s'))}"
            )
    FIGURES.append(
        f"{label}: {seen.requests} streamed requests through the gateway by {CLIENTS} clients, "
        f"{len(seen.failed)} failed, endpoint unavailable {seen.unavailable_s:.3f} s; "
        + "; ".join(gaps)
    )


def test_the_fleet_and_its_gateway_come_up(bed: Bed) -> None:
    write_config(bed, fleet_config(1024))
    started = time.monotonic()
    code, out, err = llamanix(bed, "switch", CONFIG, "--all-hosts", "--json")
    assert code == 0, err[-4000:]
    verdicts = {r["host"]: r["verdict"] for r in json.loads(out)}
    assert verdicts == {"box1": "passed", "box2": "passed", "box3": "passed"}, err[-4000:]
    FIGURES.append(
        f"first rollout (replicas, then the gateway with LiteLLM {LITELLM_VERSION} installed): "
        f"{time.monotonic() - started:.0f}s"
    )


# Runs on the controller: a client of one replica directly (not through the gateway), as
# another machine is. Every 20 ms a GET /health on a new connection, and two clients streaming
# chats, each request on a new connection, until the stop file appears; the times of the
# answers, and each chat's start, end, whether it got its whole answer, and why not.
_DIRECT = """
import json, os, sys, threading, time, httpx
url, ready, stop, out = sys.argv[1:5]
health, chats = [], []
# Ten minutes at most: a test killed before it made the stop file leaves no client behind.
give_up = time.monotonic() + 600
def going():
    return not os.path.exists(stop) and time.monotonic() < give_up
def watch():
    while going():
        began, ok = time.monotonic(), False
        try:
            r = httpx.get(url + "/health", headers={"Connection": "close"}, timeout=2)
            ok = r.status_code == 200
        except httpx.HTTPError:
            pass
        health.append([began, time.monotonic(), ok])
        time.sleep(0.02)
body = {"stream": True, "max_tokens": 24, "messages": [{"role": "user", "content": "Hi."}]}
def chat():
    while going():
        began, ok, why = time.monotonic(), False, ""
        try:
            with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60,
                              headers={"Connection": "close"}) as r:
                lines = [line for line in r.iter_lines() if line]
                ok = r.status_code == 200 and lines[-1:] == ["data: [DONE]"]
                why = "" if ok else f"HTTP {r.status_code}: " + " | ".join(lines[-2:])[:200]
        except httpx.HTTPError as err:
            why = repr(err)[:200]
        chats.append([began, time.monotonic(), ok, why])
threads = [threading.Thread(target=f) for f in (watch, chat, chat)]
for t in threads:
    t.start()
open(ready, "w").close()
for t in threads:
    t.join()
with open(out, "w") as f:
    json.dump({"health": health, "chats": chats}, f)
"""


@dataclass(frozen=True)
class Direct:
    requests: int
    refused: list[str]
    silence_s: float  # the time covered by failed /health probes
    silence_at: float  # when the first of them began, from the switch's start


def direct_load(bed: Bed, name: str, host: str) -> Callable[[float, float], Direct]:
    """Start ``_DIRECT`` against ``host``'s replica; the function ends it and says what it saw
    between two times (the controller's monotonic clock is this machine's)."""
    d = bed.fleet.home / f"direct-{name}"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    files = {n: d / n for n in ("ready", "stop", "out.json", "log")}
    log = files["log"].open("w")
    url = f"http://{bed.fleet.address(host)}:{REPLICAS[host]}"
    argv = [sys.executable, "-c", _DIRECT, url, *(str(files[n]) for n in ("ready", "stop"))]
    child = bed.fleet.controller_popen([*argv, str(files["out.json"])], stdout=log)
    deadline = time.monotonic() + 60
    while not files["ready"].exists():
        assert child.poll() is None and time.monotonic() < deadline, files["log"].read_text()
        time.sleep(0.1)

    def end(start: float, stop: float) -> Direct:
        time.sleep(2)
        files["stop"].touch()
        child.wait(timeout=120)
        log.close()
        data = json.loads(files["out.json"].read_text())
        # The time covered by failed /health probes (refused, reset, or not answered), and
        # where the first of them began: a slow answer on a loaded machine is no gap.
        silence, at = covered([(h[0], h[1]) for h in data["health"] if not h[2]])
        at -= start
        # Each refusal with when it began and ended, from the switch's start.
        refused = [
            f"{c[0] - start:+.2f}..{c[1] - start:+.2f} s: {c[3]}" for c in data["chats"] if not c[2]
        ]
        return Direct(len(data["chats"]), refused, silence, at)

    return end


# Consecutive rolling switches under load: a request that lands in a restart's window fails only
# now and then, so one passing run proves little.
ROLLING_RUNS = 10


def test_rolling_switches_behind_the_gateway_fail_no_request(bed: Bed) -> None:
    """ROLLING_RUNS rolling switches of both replicas, each under its own four streaming
    clients: every run's count is printed, and every one must be 0. Each replica's port is
    fenced (refusing new requests from other machines) before its drain, and opened after the
    new server serves, so no request can arrive between the drain's last look and the stop."""
    seen_runs: list[Seen] = []
    for run in range(1, ROLLING_RUNS + 1):
        context = 2048 if run % 2 else 1024
        # The last run also has a client of box1 on another machine, talking to it directly:
        # what a restart costs a replica's own clients, for the blue-green test to compare.
        end_direct = direct_load(bed, "restart", "box1") if run == ROLLING_RUNS else None
        load = Load(bed, f"rolling-{run}")
        started = time.monotonic()
        sets = [a for n in REPLICAS for a in ("--set", f"instances.chat-{n}.context={context}")]
        code, out, err = llamanix(bed, "switch", CONFIG, *sets, "--hosts", "box1,box2", "--json")
        stopped = time.monotonic()
        seen = load.end()
        seen_runs.append(seen)
        if end_direct is not None:
            direct = end_direct(started, stopped)
            FIGURES.append(
                f"restart of box1 (rolling switch {run}): a direct client on another machine: "
                f"{direct.requests} streamed chats, {len(direct.refused)} refused, /health "
                f"failing {direct.silence_s:.3f} s"
            )
        rows = {r["host"]: r for r in json.loads(out)} if out else {}
        report(f"rolling switch {run}/{ROLLING_RUNS} of both replicas", seen, rows)
        assert code == 0, err[-4000:]
        assert {h: r["verdict"] for h, r in rows.items()} == {"box1": "passed", "box2": "passed"}
        for host in REPLICAS:
            gap = rows[host]["gaps"][f"chat-{host}"]  # type: ignore[index]
            # Each replica was fenced and drained (no answer cut), and its own gap measured.
            assert gap["drained"] is True, gap
            assert gap.get("fenced_s") is not None, gap
            assert gap["gap_s"] is not None and gap["load_s"] is not None, gap
            # The goal on the CPU bed: the gap is at most the load time plus 0.5 s.
            assert gap["gap_s"] <= gap["load_s"] + 0.5, gap
        assert "restart chat-box1: gap " in err
    failed = [len(s.failed) for s in seen_runs]
    for run, s in enumerate(seen_runs, start=1):
        FIGURES.extend(f"  run {run} failed: {why[:300]}" for why in s.failed[:3])
    FIGURES.append(
        f"{ROLLING_RUNS} rolling switches behind the gateway: failed requests per run {failed}, "
        f"of {[s.requests for s in seen_runs]} streamed"
    )
    assert failed == [0] * ROLLING_RUNS, [s.failed[:3] for s in seen_runs]
    assert all(s.unavailable_s == 0.0 for s in seen_runs)


def test_a_blue_green_switch_leaves_no_gap_for_other_machines(bed: Bed) -> None:
    """box1 switched blue-green while a client on another machine (the controller) talks to
    box1's replica directly, each request on a new connection, and four clients stream through
    the gateway. A restart refuses that client's requests while the port is fenced (the rolling
    runs above print how many); blue-green hands the port to a bridge first: no request
    refused, and no /health probe failing."""
    end = direct_load(bed, "blue-green", "box1")
    load = Load(bed, "blue-green")
    started = time.monotonic()
    code, out, err = llamanix(
        bed, "switch", CONFIG, "--set", "instances.chat-box1.context=2048", "--hosts", "box1",
        "--json", "--blue-green",
    )  # fmt: skip
    stopped = time.monotonic()
    gateway = load.end()
    direct = end(started, stopped)
    assert code == 0, err[-4000:]
    (row,) = json.loads(out)
    gap = row["gaps"]["chat-box1"]
    FIGURES.append(
        f"blue-green of box1: a direct client on another machine: {direct.requests} streamed "
        f"chats, {len(direct.refused)} refused, /health failing {direct.silence_s:.3f} s"
        # When no probe failed there is no start to show.
        + (f" (from {direct.silence_at:+.2f} s)" if direct.silence_s else "")
        + "; "
        f"through the gateway {gateway.requests} requests, {len(gateway.failed)} failed; the "
        f"switch ({stopped - started:.1f} s): {gap}"
        + "".join(f"\n  refused {r}" for r in direct.refused[:6])
        + "".join(f"\n  {k} at {v - started:+.2f} s" for k, v in (gap.get("steps") or {}).items())
    )
    assert gap.get("bridge_port"), gap
    assert "blue-green through port" in err
    assert gateway.failed == [], gateway.failed[:3]
    assert direct.refused == [], direct.refused[:3]
    # No /health probe failed either.
    assert direct.silence_s == 0.0, direct
    # The bridge and its unit are gone.
    units = bed.fleet.host("box1").run(["systemctl", "list-units", "--all", "llamanix-*"]).stdout
    assert "bridge" not in units, units


def test_a_bad_replica_is_rolled_back_while_the_other_serves(bed: Bed) -> None:
    # box1 as the blue-green test left it.
    write_config(bed, fleet_config({"box1": 2048, "box2": 1024}, broken="box2"))
    load = Load(bed, "bad")
    code, out, err = llamanix(bed, "switch", CONFIG, "--hosts", "box2", "--json")
    seen = load.end()
    rows = {r["host"]: r for r in json.loads(out)} if out else {}
    report("bad replica rolled back", seen, rows)
    assert code == 1, err[-4000:]
    assert rows["box2"]["verdict"] == "rolled back", rows
    assert seen.failed == [], seen.failed[:5]
    assert seen.unavailable_s == 0.0


# Runs on the controller: CONVERSATIONS conversations through the gateway, turn after turn, a
# round a second (each turn is the whole conversation so far plus a short question; each
# conversation's first message is longer, so that a cache shows against the new tokens), until
# the stop file appears (then one more round). Each
# turn's replica (the deployment LiteLLM names) and the server's own timings: tokens taken from
# the cache and tokens processed. The ready file appears once every conversation had two turns.
_TURNS = """
import json, os, sys, time, httpx
url, key_file, ready, stop, out, count = sys.argv[1:7]
key = open(key_file).read().strip()
headers = {"Authorization": f"Bearer {key}"}
MAX_TURNS = 60
words = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do".split()
convs = [[{"role": "user", "content": f"Conversation {n}. " + " ".join(
    words[(n + i) % len(words)] for i in range(50))}] for n in range(int(count))]
turns, give_up, last = [], time.monotonic() + 600, False
while not last and time.monotonic() < give_up:
    # Once the stop file is there, one more round at once (each conversation's turn after the
    # switch), then the end.
    last = os.path.exists(stop)
    # Else one round a second (the load's pace, not a wait of the test's), and no conversation
    # past its slot's context: about 15 tokens a turn.
    if not last:
        time.sleep(1)
    for n, messages in enumerate(convs):
        if len(messages) > 2 * MAX_TURNS:
            continue
        began = time.monotonic()
        try:
            r = httpx.post(url + "/v1/chat/completions", headers=headers, timeout=120,
                           json={"model": "chat", "messages": messages, "max_tokens": 4,
                                 "temperature": 0})
        except httpx.HTTPError as err:
            turns.append({"conv": n, "ok": False, "why": repr(err)[:200], "t": began})
            continue
        if r.status_code != 200:
            turns.append({"conv": n, "ok": False, "why": r.text[:200], "t": began})
            print(turns[-1], flush=True)
            continue
        data = r.json()
        timings = data.get("timings") or {}
        turns.append({"conv": n, "ok": True, "t": began,
                      "replica": r.headers.get("x-litellm-model-id"),
                      "cache_n": timings.get("cache_n"), "prompt_n": timings.get("prompt_n")})
        messages += [{"role": "assistant", "content": data["choices"][0]["message"]["content"]},
                     {"role": "user", "content": f"More, turn {len(messages)}?"}]
    if not os.path.exists(ready) and all(
            sum(1 for t in turns if t["conv"] == n and t["ok"]) >= 2 for n in range(len(convs))):
        open(ready, "w").close()
with open(out, "w") as f:
    json.dump(turns, f)
"""
# Three: whatever conversations the earlier tests left, new ones land on both replicas.
CONVERSATIONS = 3


def test_conversations_keep_their_cache_across_a_rolling_switch(bed: Bed) -> None:
    """Affinity and caches that move with a drain, read from the servers' own timings: after
    its first turn, every turn of a conversation takes most of its prompt from the cache of the
    replica it lands on (``cache_n`` against ``prompt_n`` processed), before, during and after
    a rolling switch of both replicas, which moves each drained replica's caches to the other
    one before it restarts; and the rollout's record says what moved where."""
    # Three slots of 2,048 tokens each: room for every turn of a conversation, and for every
    # conversation on one replica while the other is drained (with fewer slots than
    # conversations, one waits in the server's RAM cache, which no move carries: it goes cold).
    text = fleet_config(6144).replace("parallel = 2\n", "parallel = 3\nwarm_switch = true\n")
    write_config(bed, text)
    # Turning warm_switch on restarts both replicas: their caches go cold, saying why.
    code, out, err = llamanix(bed, "switch", CONFIG, "--hosts", "box1,box2", "--json")
    assert code == 0, err[-4000:]
    first = {r["host"]: r for r in json.loads(out)}
    assert "runs without warm_switch" in first["box1"]["caches"]["chat-box1"]["cold"], first

    d = bed.fleet.home / "turns"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    files = {n: d / n for n in ("ready", "stop", "out.json", "log")}
    url = f"http://{bed.fleet.address('box3')}:{GATEWAY_PORT}"
    argv = [sys.executable, "-c", _TURNS, url, str(bed.key_file)]
    argv += [str(files[n]) for n in ("ready", "stop", "out.json")] + [str(CONVERSATIONS)]
    with files["log"].open("w") as log:
        child = bed.fleet.controller_popen(argv, stdout=log)
        deadline = time.monotonic() + 300
        while not files["ready"].exists():
            assert child.poll() is None, files["log"].read_text()[-2000:]
            assert time.monotonic() < deadline, files["log"].read_text()[-2000:]
            time.sleep(0.2)
        started = time.monotonic()
        sets = [a for n in REPLICAS for a in ("--set", f"instances.chat-{n}.threads=1")]
        code, out, err = llamanix(bed, "switch", CONFIG, *sets, "--hosts", "box1,box2", "--json")
        switched = time.monotonic()
        # One more round after the switch, and the client ends.
        files["stop"].touch()
        child.wait(timeout=180)
    assert code == 0, err[-4000:]
    rows = {r["host"]: r for r in json.loads(out)}
    turns = json.loads(files["out.json"].read_text())
    moved = {host: rows[host]["caches"][f"chat-{host}"] for host in REPLICAS}
    during = [t for t in turns if started <= t["t"] <= switched]
    FIGURES.append(
        f"conversations across a rolling switch: {len(turns)} turns of {CONVERSATIONS} "
        f"conversations, {len(during)} during the switch; "
        + "; ".join(f"{h}: {m}" for h, m in moved.items())
    )
    assert [t for t in turns if not t["ok"]] == [], [t for t in turns if not t["ok"]][:3]
    for host, other in (("box1", "box2"), ("box2", "box1")):
        move = moved[host]
        assert move.get("cold") is None and move["to"] == f"chat-{other}", move
        assert any(s["outcome"] == "restored" for s in move["slots"]), move
        assert move["routed"] is True, move
        assert f"{host}:   chat-{host}: caches moved to chat-{other}: slot" in err
    assert during, "no turn ran during the switch"
    for n in range(CONVERSATIONS):
        mine = [t for t in turns if t["conv"] == n]
        for t in mine[1:]:
            # Most of the prompt came from the cache on the replica the turn landed on.
            assert t["cache_n"] > t["prompt_n"], (n, t, mine)
    # Both replicas served conversations (a new one goes to the least loaded).
    assert {t["replica"] for t in turns if t["t"] < started} == {"chat-box1", "chat-box2"}
