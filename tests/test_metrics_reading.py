"""What the exporter and top read, without a llama-server: [metrics] in the config, one scrape
against HTTP servers that answer each way an instance can (refused, an error, garbage, a router
that has not loaded a member, llama-swap), the rates between two scrapes, the figures of the
generation records, and the refusals of render and top. The real server, exporter and
Prometheus are in tests/test_observability.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from llamanix.config.model import Metrics, load_config
from llamanix.core.errors import UserError
from llamanix.core.json_codec import from_json_or_none
from llamanix.observe.live_figures import Counters, figures
from llamanix.observe.scrape import Endpoint, build_commit, http_client, parse_families, scrape
from llamanix.observe.switch_figures import switch_figures
from llamanix.render.prometheus import prometheus_config
from llamanix.server.metrics import parse_metrics
from llamanix.server.server_process import free_port
from llamanix.state.gap_records import GapRecord
from llamanix.state.gate_records import GateResult
from llamanix.state.generations import GateRecord, GenerationRecord, HostState, RollbackRecord

DATA = Path(__file__).parent / "data"
RECORDED = (DATA / "upstream-metrics-spec.txt").read_text()
Reply = tuple[int, str]


def config_with(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "llamanix.toml"
    path.write_text(text)
    return path


BASE = (
    '[hosts.box]\nkind = "systemd"\nbinaries = { upstream = "/usr/local/bin/llama-server" }\n'
    '[instances.chat]\nmodel = "/srv/m.gguf"\nport = 8080\n'
)


def test_metrics_table_takes_the_schema_defaults(tmp_path: Path) -> None:
    assert load_config(config_with(tmp_path, BASE + "[metrics]\n")).metrics == Metrics()
    assert load_config(config_with(tmp_path, BASE)).metrics is None


@pytest.mark.parametrize(
    ("metrics", "line"),
    [
        (
            "port = 8080",
            "metrics.port: port 8080 on host 'box' is already used by instance 'chat' "
            "(give the exporter its own port)",
        ),
        ("prot = 9000", "metrics.prot: unknown key (did you mean 'port'?)"),
        (
            "min_ceiling_share = 1.5",
            "metrics.min_ceiling_share: 1.5 is above the maximum 1 (use a value from 0 to 1)",
        ),
        ("scrape_interval = 0", "metrics.scrape_interval: 0 is below the minimum 1"),
    ],
)
def test_metrics_mistakes_are_one_line_each(tmp_path: Path, metrics: str, line: str) -> None:
    path = config_with(tmp_path, BASE + f"[metrics]\n{metrics}\n")
    with pytest.raises(UserError) as err:
        load_config(path)
    assert any(line in str(p) for p in err.value.problems), err.value.problems


def test_a_remote_host_needs_an_exporter_beyond_loopback(tmp_path: Path) -> None:
    text = BASE.replace('kind = "systemd"', 'kind = "systemd"\ntarget = "root@gpu1"')
    cfg = load_config(config_with(tmp_path, text + "[metrics]\n"))
    with pytest.raises(UserError) as err:
        prometheus_config(cfg)
    assert "metrics.listen: the exporters listen on 127.0.0.1" in str(err.value.problems[0])
    remote = '[metrics]\nlisten = "0.0.0.0"\nallow_remote = true\n'
    cfg = load_config(config_with(tmp_path, text + remote))
    job = prometheus_config(cfg)["scrape_configs"][0]  # type: ignore[index]
    assert job["static_configs"] == [{"targets": ["gpu1:9465"], "labels": {"host": "box"}}]  # type: ignore[index]


def test_render_and_validate_refuse_it_and_write_nothing(tmp_path: Path) -> None:
    text = BASE.replace('kind = "systemd"', 'kind = "systemd"\ntarget = "root@gpu1"')
    path = config_with(tmp_path, text + "[metrics]\n")
    for args in (["validate", str(path)], ["render", str(path), "--out", str(tmp_path / "o")]):
        proc = subprocess.run(
            [sys.executable, "-m", "llamanix", *args], capture_output=True, text=True
        )
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert "metrics.listen: the exporters listen on 127.0.0.1" in proc.stderr
    assert not (tmp_path / "o").exists()


# --- one scrape ------------------------------------------------------------------------------


@pytest.fixture
def answering() -> Iterator[Callable[[dict[str, Reply]], str]]:
    """``answering({path: (status, body)})``: the URL of an HTTP server that answers so."""
    servers: list[ThreadingHTTPServer] = []

    def start(routes: dict[str, Reply]) -> str:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, body = routes.get(self.path, (404, "not found"))
                self.send_response(status)
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    ("routes", "state", "detail"),
    [
        ({"/metrics": (200, RECORDED)}, "ok", ""),
        ({"/metrics": (401, "Unauthorized")}, "refused", "HTTP 401"),
        ({"/metrics": (501, "metrics are disabled")}, "error", "HTTP 501: metrics are disabled"),
        ({"/metrics": (200, "<html>It works!</html>")}, "garbage", "not Prometheus text"),
        ({"/metrics": (200, "")}, "garbage", "no llamacpp: series"),
        ({"/metrics": (200, "go_goroutines 7\n")}, "garbage", "no llamacpp: series"),
    ],
)
def test_each_answer_is_a_state(
    answering: Callable[[dict[str, Reply]], str], routes: dict[str, Reply], state: str, detail: str
) -> None:
    url = answering(routes)
    with http_client() as client:
        found = scrape(client, Endpoint(url))
    assert found.state == state and detail in found.detail
    assert (found.snapshot is not None) == (state == "ok")


def test_nothing_listening_is_down() -> None:
    with http_client() as client:
        port = free_port()
        found = scrape(client, Endpoint(f"http://127.0.0.1:{port}"))
    assert found.state == "down"
    assert found.detail == (
        f"nothing listens on 127.0.0.1:{port} (connection refused): the server is stopped, "
        "crashed or not started yet"
    )


def test_a_router_member_is_read_through_its_router(
    answering: Callable[[dict[str, Reply]], str],
) -> None:
    url = answering(
        {
            "/metrics?model=big&autoload=false": (200, RECORDED),
            "/metrics?model=small&autoload=false": (
                400,
                '{"error":{"message":"model is not loaded"}}',
            ),
            "/props": (200, json.dumps({"build_info": "b6123-0c1e570"})),
        }
    )
    with http_client() as client:
        big = scrape(client, Endpoint(url, "big", "llama-server"), props=True)
        small = scrape(client, Endpoint(url, "small", "llama-server"))
    assert big.state == "ok" and big.build == "0c1e570"
    assert small.state == "unloaded"


def test_llama_swap_members_are_read_only_while_running(
    answering: Callable[[dict[str, Reply]], str],
) -> None:
    running = json.dumps({"running": [{"model": "big", "state": "ready"}]})
    # /upstream/small/metrics would start small: the scrape must never ask for it.
    url = answering(
        {
            "/running": (200, running),
            "/upstream/big/metrics": (200, RECORDED),
            "/upstream/small/metrics": (500, "asked for a member that was not running"),
        }
    )
    with http_client() as client:
        big = scrape(client, Endpoint(url, "big", "llama-swap"))
        small = scrape(client, Endpoint(url, "small", "llama-swap"))
    assert big.state == "ok"
    assert small.state == "unloaded" and "does not run small" in small.detail


def test_families_keep_the_names_and_types() -> None:
    families = {f.name: f for f in parse_families(RECORDED)}
    assert families["llamacpp:tokens_predicted"].kind == "counter"
    assert families["llamacpp:tokens_predicted"].samples[0].name == (
        "llamacpp:tokens_predicted_total"
    )
    # A running maximum, not a counter: re-exposed as a gauge under its own name.
    assert families["llamacpp:n_tokens_max"].kind == "gauge"
    assert families["llamacpp:n_tokens_max"].samples[0].name == "llamacpp:n_tokens_max"
    per_pos = families["llamacpp:spec_decode_num_accepted_tokens_per_pos"].samples
    assert [s.labels["position"] for s in per_pos] == ["0", "1", "2", "3"]
    assert build_commit("b6123-0c1e570") == "0c1e570" and build_commit(None) is None


# --- rates between two scrapes ---------------------------------------------------------------


def counters(**values: float) -> Counters:
    base = dict.fromkeys(Counters.__dataclass_fields__, 0.0)
    return Counters(**{**base, **values})


def test_rates_over_the_window_else_since_start() -> None:
    first = Counters.of(parse_metrics(RECORDED))
    alone = figures(first)
    assert alone.decode_basis == "since start"
    assert alone.decode_tok_s == pytest.approx(32 / 0.069628)
    assert alone.acceptance == pytest.approx(19 / 45)
    assert alone.ttft_1k_s == pytest.approx(1000 / (29 / 0.002206))
    before = counters(
        predicted_tokens=10, predicted_seconds=1.0, draft_tokens=10, accepted_tokens=5
    )
    after = counters(predicted_tokens=30, predicted_seconds=1.5, draft_tokens=30, accepted_tokens=7)
    windowed = figures(after, before)
    assert (windowed.decode_tok_s, windowed.decode_basis) == (40.0, "window")
    assert windowed.acceptance == pytest.approx(2 / 20)
    # Nothing decoded in the window: the rate since start, not zero or nothing.
    idle = figures(after, after)
    assert idle.decode_basis == "since start" and idle.decode_tok_s == 20.0
    # A restart (a counter went down): the window means nothing.
    restarted = figures(before, after)
    assert restarted.decode_basis == "since start" and restarted.decode_tok_s == 10.0
    assert figures(counters()).decode_tok_s is None
    assert figures(after).ceiling_share(100.0) == pytest.approx(0.2)


# --- the generation records --------------------------------------------------------------------


def test_switch_figures_from_the_records(tmp_path: Path) -> None:
    path = config_with(tmp_path, BASE)
    state = HostState.beside(path, "box")
    assert not switch_figures(state).any
    gate = GateResult("chat", "smoke", True, "ok", acceptance=0.7)
    first = state.create({}, BASE, ".toml", GenerationRecord(gate=GateRecord("unverified")))
    kept = state.create(
        {},
        BASE,
        ".toml",
        GenerationRecord(
            gate=GateRecord("passed", "smoke", {"chat": gate}),
            gaps={"chat": GapRecord(0.3, 2.0)},
        ),
    )
    state.set_current(kept)
    state.create(
        {},
        BASE,
        ".toml",
        GenerationRecord(gate=GateRecord("failed", "smoke"), rollback=RollbackRecord(True)),
    )
    found = switch_figures(state)
    assert (found.serving, found.newest, found.newest_verdict) == (kept.number, 3, "failed")
    assert (found.switches, found.rollbacks) == (2, 1)  # the first was found installed
    assert found.restarts["chat"].generation == kept.number
    assert found.restarts["chat"].gap.gap_s == 0.3
    assert found.gate_acceptance == {"chat": 0.7}
    assert found.newest_time is not None and first.number == 1


def test_the_gate_acceptance_reads_back_and_old_records_read_without_it() -> None:
    result = GateResult("chat", "smoke", True, "draft_n 12", acceptance=0.75)
    assert from_json_or_none(GateResult, result.to_json(), name="chat") == result
    assert "acceptance" not in GateResult("chat", "health", True, "ok").to_json()


# --- top's refusals ------------------------------------------------------------------------------


def test_top_marks_a_host_it_cannot_reach(tmp_path: Path) -> None:
    remote = BASE.replace('kind = "systemd"', 'kind = "systemd"\ntarget = "nobody@127.0.0.1"')
    remote = remote.replace("port = 8080", 'port = 8080\nhost = "box"')
    remote += '[hosts.nix]\nkind = "nixos"\ntarget = "root@127.0.0.1"\n'
    remote += '[instances.other]\nhost = "nix"\nmodel = "/srv/m.gguf"\n'
    path = config_with(tmp_path, remote)
    proc = subprocess.run(
        [sys.executable, "-m", "llamanix", "top", str(path), "--once", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    hosts = {h["host"]: h for h in json.loads(proc.stdout)["hosts"]}
    assert hosts["box"]["state"] == "unreachable" and hosts["box"]["rows"] == []
    assert hosts["nix"]["state"] == "error" and "run llamanix top on nix" in hosts["nix"]["detail"]


def test_top_json_needs_once(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "llamanix", "top", str(config_with(tmp_path, BASE)), "--json"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "llamanix top: --json: needs --once (add --once)"
    )


def test_the_exporter_refuses_a_port_in_use(tmp_path: Path) -> None:
    path = config_with(tmp_path, BASE + "[metrics]\n")
    holder = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    port = holder.server_address[1]
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "llamanix", "metrics", str(path), "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        holder.server_close()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in proc.stderr


def test_a_server_cannot_set_the_exporters_labels(
    tmp_path: Path, answering: Callable[[dict[str, Reply]], str]
) -> None:
    """Whatever answers on an instance's port (a server of another version, or any process
    that took the port) cannot pose as another host or instance: the exporter's labels win,
    and the server's own are kept as exported_NAME, as Prometheus keeps a target's."""
    posing = RECORDED.replace(
        "llamacpp:tokens_predicted_total 32",
        'llamacpp:tokens_predicted_total{host="other",instance="x",exported_host="y"} 32',
    )
    assert posing != RECORDED
    url = answering({"/metrics": (200, posing)})
    port = int(url.rsplit(":", 1)[1])
    path = config_with(tmp_path, BASE.replace("port = 8080", f"port = {port}") + "[metrics]\n")
    proc = subprocess.run(
        [sys.executable, "-m", "llamanix", "metrics", str(path), "--once"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    [line] = [
        x for x in proc.stdout.splitlines() if x.startswith("llamacpp:tokens_predicted_total")
    ]
    labels = dict(
        pair.split("=", 1) for pair in line[line.index("{") + 1 : line.index("}")].split(",")
    )
    assert labels["host"] == '"box"' and labels["instance"] == '"chat"', line
    assert labels["exported_host"] == '"other"' and labels["exported_instance"] == '"x"', line
    assert labels["exported_exported_host"] == '"y"', line
    # No series of the scrape names another host.
    assert not re.search(r'[{,]host="(?!box")', proc.stdout)


@pytest.mark.parametrize("listen", ["0.0.0.0", "::", "192.168.1.20", "gpu1.lan"])
def test_an_exporter_beyond_loopback_must_be_asked_for(tmp_path: Path, listen: str) -> None:
    """It serves keyed instances' metrics without a key: a listen address other than loopback
    is refused unless [metrics] allow_remote says so, in the config and on the command line."""
    path = config_with(tmp_path, BASE + f'[metrics]\nlisten = "{listen}"\n')
    for args in (
        ["validate", str(path)],
        ["render", str(path), "--out", str(tmp_path / "o")],
        ["metrics", str(path)],
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "llamanix", *args], capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.strip().splitlines() == [
            f"{path}: metrics.listen: the exporter would serve every instance's metrics, keyed "
            f"ones included, on {listen} to whoever reaches it, without a key (keep listen = "
            '"127.0.0.1" for a Prometheus on the same machine, or add allow_remote = true to '
            "[metrics] to mean it)"
        ]
    assert not (tmp_path / "o").exists()
    allowed = config_with(tmp_path, BASE + f'[metrics]\nlisten = "{listen}"\nallow_remote = true\n')
    assert load_config(allowed).metrics == Metrics(listen=listen, allow_remote=True)
    # --listen on the command line is the same choice.
    plain = tmp_path / "plain" / "llamanix.toml"
    plain.parent.mkdir()
    plain.write_text(BASE + "[metrics]\n")
    proc = subprocess.run(
        [sys.executable, "-m", "llamanix", "metrics", str(plain), "--listen", listen],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and proc.stderr.startswith(
        "llamanix metrics: --listen: the exporter would serve every instance's metrics"
    ), proc.stderr


# --- docs/observability.md ------------------------------------------------------------------


def _between(text: str, name: str) -> str:
    begin, end = f"<!-- {name}:begin -->\n", f"<!-- {name}:end -->"
    return text[text.index(begin) + len(begin) : text.index(end)]


def test_the_docs_tables_are_the_code_s() -> None:
    """The series and alerts tables of docs/observability.md are what the code serves and
    renders (with the default thresholds)."""
    from llamanix.core.observability import series_markdown
    from llamanix.render.prometheus import alerts_markdown

    text = (Path(__file__).resolve().parent.parent / "docs/observability.md").read_text()
    assert _between(text, "series") == series_markdown()
    assert _between(text, "alerts") == alerts_markdown(Metrics())


def test_top_reads_the_fleet_agents_copy_as_a_remote_host_does(tmp_path: Path) -> None:
    """What `ssh TARGET -- sudo -n llamanix fleet-agent top` runs there (a command the host's
    sudoers line allows, its request on stdin): the fleet agent's copy of the config
    (LLAMANIX_FLEET_DIR stands for /var/lib/llamanix/fleet), read back by the controller's
    parser; without a copy, one line."""
    import os

    from llamanix.fleet.protocol import HELLO, PROTOCOL, AgentRequest
    from llamanix.observe.top_rows import parse_top_json

    fleet = tmp_path / "fleet"
    fleet.mkdir(mode=0o700)
    argv = [sys.executable, "-m", "llamanix", "fleet-agent", "top"]
    request = AgentRequest(PROTOCOL, "box").text()
    env = {**os.environ, "LLAMANIX_FLEET_DIR": str(fleet)}
    missing = subprocess.run(argv, capture_output=True, text=True, env=env, input=request)
    assert missing.returncode == 2
    assert missing.stderr.strip() == (
        f"{fleet}: no fleet copy of the config on this host (switch this host once from the "
        "controller with llamanix switch)"
    )
    (fleet / "llamanix.toml").write_text(BASE)
    done = subprocess.run(argv, capture_output=True, text=True, env=env, input=request)
    assert done.returncode == 0, done.stderr
    hello, *rest = done.stdout.splitlines()
    assert hello.startswith(HELLO)
    [host] = parse_top_json("\n".join(rest))
    assert host.host == "box" and [r.instance for r in host.rows] == ["chat"]
    assert host.rows[0].state == "down"
