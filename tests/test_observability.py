"""The exporter, Prometheus and top, for real: one llama-server (the CPU build, speculating with
a synthetic draft), the exporter as its own process, Debian's Prometheus scraping it every
second with the rendered config and rules, and ``llamanix top`` against the same server.

Beside the server the config has two instances that cannot be read: ``gone`` (nothing listens)
and ``junk`` (an HTTP server whose /metrics answers HTML). The generation records are written
through ``state.generations`` as a switch writes them: a kept generation, gated by a real bench
gate against the server, and a newer one that failed its gate and was rolled back.

Everything is started once, by one module-scoped fixture; the tests read what it left.
"""

from __future__ import annotations

import json
import re
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from cli_run import llamanix_argv

from llamanix.bench.bench import run_bench
from llamanix.bench.bench_results import BenchResult, BenchSettings
from llamanix.bench.prompts import load_prompts
from llamanix.config.argv import instance_argv
from llamanix.config.model import load_config
from llamanix.core.gpus import load_gpus
from llamanix.core.observability import LLAMACPP_SERIES, SERIES
from llamanix.external import prometheus
from llamanix.external.process import Child, run_captured, spawn
from llamanix.external.signals import signal_group
from llamanix.model.gguf_info import read_gguf
from llamanix.observe.scrape import build_commit
from llamanix.render import dashboards
from llamanix.render.host_render import render_host
from llamanix.render.prometheus import alert_rules
from llamanix.server.server_process import LlamaServer, free_port
from llamanix.state.gap_records import GapRecord
from llamanix.state.gate_records import GateResult
from llamanix.state.generations import GateRecord, GenerationRecord, HostState, RollbackRecord
from llamanix.switch.gate import GateTarget, run_gate

pytestmark = pytest.mark.server

HOST = "bed"
SERIES_NAME = re.compile(r"\b(?:llamanix_|llamacpp:)[a-z_]+")
DEADLINE_S = 60.0
# What the junk instance's /metrics answers: a page, not Prometheus text.
JUNK = b"<html><body>It works!</body></html>\n"


def llamanix(*args: str, timeout_s: float = 120) -> tuple[int, str, str]:
    done = run_captured(llamanix_argv(*args), timeout_s=timeout_s)
    return done.returncode, done.stdout, done.stderr


class _Junk(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(JUNK)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@dataclass
class Bed:
    config: Path
    out: Path
    server: LlamaServer
    prometheus_url: str
    exporter_url: str
    bench: BenchResult
    top_once: dict[str, Any]
    top_stderr: str
    top_code: int
    gate: GateResult
    build: str | None
    seconds: dict[str, float]

    def query(self, expr: str) -> list[dict[str, Any]]:
        resp = httpx.get(f"{self.prometheus_url}/api/v1/query", params={"query": expr})
        body = resp.json()
        assert body.get("status") == "success", f"{expr}: {body}"
        result: list[dict[str, Any]] = body["data"]["result"]
        return result


def _config_text(llama_server: Path, model: Path, ports: dict[str, int]) -> str:
    return f"""
[hosts.{HOST}]
kind = "systemd"
gpu = "rtx3090"
binaries = {{ upstream = "{llama_server}" }}

[defaults]
model = "{model}"
context = 1024
parallel = 1
threads = 1

[instances.chat]
port = {ports["chat"]}
[instances.chat.speculative]
type = "draft"
draft_model = "{model}"
n_max = 4

[instances.gone]
port = {ports["gone"]}

[instances.junk]
port = {ports["junk"]}

[metrics]
port = {ports["exporter"]}
scrape_interval = 1
"""


def _wait(what: str, check: Any, deadline_s: float = DEADLINE_S) -> Any:
    """Poll ``check`` until it returns something truthy; fail naming ``what``."""
    end = time.monotonic() + deadline_s
    last: Any = None
    while time.monotonic() < end:
        try:
            last = check()
        except httpx.HTTPError as err:
            last = err
        else:
            if last:
                return last
        time.sleep(0.2)
    pytest.fail(f"{what}: not within {deadline_s:g}s (last: {last!r})")


def _stop(child: Child) -> None:
    if child.poll() is None:
        signal_group(child.pid, 15)
        try:
            child.wait(timeout=10)
        except Exception:
            signal_group(child.pid, 9)
            child.wait()


def _write_records(config: Path, gate: GateResult) -> None:
    """A kept generation with the real gate's result and a restart's gap, then a newer one
    whose gate failed and was rolled back (the first serves again)."""
    cfg = load_config(config)
    files = render_host(cfg, HOST).files()
    state = HostState.beside(config, HOST)
    kept = state.create(
        files,
        config.read_text(),
        ".toml",
        GenerationRecord(
            gate=GateRecord("passed", "bench", {"chat": gate}),
            changed=("chat",),
            gaps={"chat": GapRecord(gap_s=0.42, load_s=1.7, drain_s=0.05, drained=True)},
        ),
    )
    state.set_current(kept)
    state.create(
        files,
        config.read_text(),
        ".toml",
        GenerationRecord(
            gate=GateRecord(
                "failed", "smoke", {"chat": GateResult("chat", "smoke", False, "too slow")}
            ),
            changed=("chat",),
            rollback=RollbackRecord(serving_again=True),
        ),
    )


@pytest.fixture(scope="module")
def bed(
    tmp_path_factory: pytest.TempPathFactory, llama_server_bin: Path, synth_models: Any
) -> Iterator[Bed]:
    for program in (prometheus.PROMETHEUS, prometheus.PROMTOOL):
        if shutil.which(program) is None:
            pytest.fail(f"{program} is missing: apt-get install prometheus (.ci/run does)")
    tmp = tmp_path_factory.mktemp("observe")
    ports = {name: free_port() for name in ("chat", "gone", "junk", "exporter", "prometheus")}
    config = tmp / "llamanix.toml"
    config.write_text(_config_text(llama_server_bin, synth_models.target, ports))
    seconds: dict[str, float] = {}
    started = time.monotonic()

    junk = ThreadingHTTPServer(("127.0.0.1", ports["junk"]), _Junk)
    threading.Thread(target=junk.serve_forever, daemon=True).start()
    server = LlamaServer(instance_argv(load_config(config), "chat"), tmp / "chat.log")
    children: list[Child] = []
    try:
        server.start()
        seconds["server"] = time.monotonic() - started

        # bench first, then top: the server's counters since its start are bench's requests.
        bench = run_bench(
            # Sampled (seeded), so that the draft is not always right: acceptance is partial.
            BenchSettings(
                url=server.url,
                max_tokens=(48,),
                runs=5,
                warmup=0,
                temperature=1.0,
                label="observe",
            ),
            load_prompts("builtin:fibonacci"),
        )
        code, out, err = llamanix("top", str(config), "--host", HOST, "--once", "--json")
        top_once = json.loads(out) if code == 0 else {}
        seconds["bench+top"] = time.monotonic() - started - seconds["server"]

        gate = run_gate("bench", GateTarget("chat", server.url, speculative=True), 60)
        assert gate.passed, gate.detail
        _write_records(config, gate)
        props = httpx.get(f"{server.url}/props").json()

        out_dir = tmp / "render"
        code_r, _, err_r = llamanix("render", str(config), "--host", HOST, "--out", str(out_dir))
        assert code_r == 0, err_r

        log = (tmp / "exporter.log").open("wb")
        children.append(
            spawn(
                [sys.executable, "-m", "llamanix", "metrics", str(config), "--host", HOST],
                stdout=log,
            )
        )
        exporter_url = f"http://127.0.0.1:{ports['exporter']}"
        _wait("the exporter answers", lambda: httpx.get(f"{exporter_url}/metrics").is_success)

        prom_log = (tmp / "prometheus.log").open("wb")
        children.append(
            prometheus.start_prometheus(
                out_dir / "prometheus" / "prometheus.yml",
                tmp / "tsdb",
                f"127.0.0.1:{ports['prometheus']}",
                prom_log,
            )
        )
        prometheus_url = f"http://127.0.0.1:{ports['prometheus']}"
        result = Bed(
            config,
            out_dir,
            server,
            prometheus_url,
            exporter_url,
            bench,
            top_once,
            err,
            code,
            gate,
            build_commit(props.get("build_info")),
            seconds,
        )
        _wait("Prometheus is ready", lambda: httpx.get(f"{prometheus_url}/-/ready").is_success)
        _wait("Prometheus has scraped the exporter", lambda: result.query("llamanix_up"))

        # Traffic between two scrapes, so that rates are not zero.
        def busy() -> list[dict[str, Any]]:
            httpx.post(
                f"{server.url}/v1/chat/completions",
                json={"messages": [{"role": "user", "content": "count"}], "max_tokens": 16},
                timeout=60,
            )
            return result.query('rate(llamacpp:tokens_predicted_total{instance="chat"}[1m]) > 0')

        _wait("a rate of generated tokens", busy)
        seconds["total"] = time.monotonic() - started
        yield result
    finally:
        for child in reversed(children):
            _stop(child)
        server.stop()
        junk.shutdown()
        junk.server_close()


def test_promtool_passes_the_rendered_config_and_rules(bed: Bed) -> None:
    config = prometheus.check_config(bed.out / "prometheus" / "prometheus.yml")
    assert config.ok, config.output
    rules = prometheus.check_rules(bed.out / "prometheus" / "llamanix.rules.yml")
    assert rules.ok, rules.output
    metrics = load_config(bed.config).metrics
    assert metrics is not None
    assert f"SUCCESS: {len(alert_rules(metrics))} rules found" in rules.output


def test_prometheus_holds_the_labelled_series(bed: Bed) -> None:
    [series] = bed.query(f'llamacpp:tokens_predicted_total{{host="{HOST}", instance="chat"}}')
    labels = series["metric"]
    assert bed.build is not None
    assert {k: labels.get(k) for k in ("variant", "build", "model", "spec_type")} == {
        "variant": "upstream",
        "build": bed.build,
        "model": "target",
        "spec_type": "draft",
    }
    assert float(series["value"][1]) > 0
    # The exporter's own figures, with the same labels.
    [decode] = bed.query('llamanix_decode_tokens_per_second{instance="chat"}')
    assert decode["metric"]["build"] == bed.build and float(decode["value"][1]) > 0
    # The ceiling from the header alone (model.gguf_weights) is the gguf library's figure.
    [ceiling] = bed.query('llamanix_decode_ceiling_tokens_per_second{instance="chat"}')
    model = read_gguf(Path(load_config(bed.config).instances["chat"].model))
    expected = load_gpus()["rtx3090"].bandwidth_gb_s * 1e9 / model.weight_bytes_per_token()
    assert float(ceiling["value"][1]) == pytest.approx(expected, rel=1e-9)


def _filled(expr: str) -> str:
    for name, value in dashboards.VARIABLES.items():
        expr = expr.replace(name, value)
    return expr


def test_every_rule_and_panel_query_returns_data(bed: Bed) -> None:
    metrics = load_config(bed.config).metrics
    assert metrics is not None
    queries: list[tuple[str, str]] = [(f"rule {r.alert}", r.probe) for r in alert_rules(metrics)]
    boards = dashboards.dashboards(metrics)
    for board in boards:
        for panel in board.panels:
            queries += [(f"{board.uid}: {panel.title}", _filled(q.expr)) for q in panel.queries]
    queries += [(f"annotation {a.name}", _filled(a.probe)) for a in dashboards.event_annotations()]
    empty = [f"{where}: {expr}" for where, expr in queries if not bed.query(expr)]
    assert not empty, "queries that return nothing:\n" + "\n".join(empty)
    # The host and instance variables' values (label_values(llamanix_up, ...)).
    found = httpx.get(
        f"{bed.prometheus_url}/api/v1/series", params={"match[]": "llamanix_up"}
    ).json()["data"]
    assert {s["host"] for s in found} == {HOST}
    assert {s["instance"] for s in found} == {"chat", "gone", "junk"}
    # The dashboards on disk are these, and every series they name is one the exporter or
    # llama-server serves.
    for board in boards:
        on_disk = json.loads((bed.out / "grafana" / board.file_name).read_text())
        assert [t["expr"] for p in on_disk["panels"] for t in p["targets"]] == board.queries()
    known = {s.exposed for s in SERIES} | set(LLAMACPP_SERIES)
    named = {name for _, expr in queries for name in SERIES_NAME.findall(expr)}
    assert named <= known, named - known


def test_rules_load_and_only_the_unreadable_instances_alert(bed: Bed) -> None:
    def loaded() -> list[dict[str, Any]]:
        groups = httpx.get(f"{bed.prometheus_url}/api/v1/rules").json()["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        evaluated = [r for r in rules if r.get("lastEvaluation", "").startswith("20")]
        return rules if rules and len(evaluated) == len(rules) else []

    rules = _wait("every rule evaluated once", loaded)
    metrics = load_config(bed.config).metrics
    assert metrics is not None
    assert {r["name"]: r["health"] for r in rules} == {r.alert: "ok" for r in alert_rules(metrics)}

    def down() -> set[tuple[str, str]]:
        alerts = httpx.get(f"{bed.prometheus_url}/api/v1/alerts").json()["data"]["alerts"]
        return {
            (a["labels"]["alertname"], a["labels"].get("instance", ""))
            for a in alerts
            if a["labels"]["alertname"] == "LlamanixInstanceDown"
        }

    assert _wait("the down instances' alerts", down) == {
        ("LlamanixInstanceDown", "gone"),
        ("LlamanixInstanceDown", "junk"),
    }


def test_exporter_serves_the_switch_records(bed: Bed) -> None:
    def one(expr: str) -> float:
        [sample] = bed.query(expr)
        return float(sample["value"][1])

    assert one(f'llamanix_switches_total{{host="{HOST}"}}') == 2
    assert one(f'llamanix_rollbacks_total{{host="{HOST}"}}') == 1
    assert one(f'llamanix_generation{{host="{HOST}"}}') == 1
    assert one(f'llamanix_last_switch_verdict{{host="{HOST}", verdict="failed"}}') == 1
    assert one('llamanix_last_switch_gap_seconds{instance="chat"}') == pytest.approx(0.42)
    assert bed.gate.acceptance is not None and 0 < bed.gate.acceptance <= 1
    assert one('llamanix_gate_acceptance_ratio{instance="chat"}') == pytest.approx(
        bed.gate.acceptance
    )


def test_top_once_json_matches_bench_on_the_same_run(bed: Bed) -> None:
    """top read the server right after bench's runs, and nothing else had asked it for a
    token: its since-start figures cover exactly bench's requests."""
    assert bed.top_code == 0, bed.top_stderr
    [host] = bed.top_once["hosts"]
    rows = {r["instance"]: r for r in host["rows"]}
    chat = rows["chat"]
    assert chat["state"] == "ok" and chat["decode_basis"] == "since start"
    requests = [q for run in bed.bench.runs for q in run.requests]
    tokens = sum(q.predicted_n or 0 for q in requests)
    predicting_s = sum(q.server_predicted_ms or 0 for q in requests) / 1000
    bench_decode = tokens / predicting_s
    median_decode = statistics.median(q.server_decode_tok_s or 0 for q in requests)
    drafted = sum(q.draft_n or 0 for q in requests)
    accepted = sum(q.draft_n_accepted or 0 for q in requests)
    prompt_tokens = sum(q.prompt_n or 0 for q in requests)
    bench_prefill = prompt_tokens / (sum(q.server_prompt_ms or 0 for q in requests) / 1000)
    print(
        f"\ntop decode {chat['decode_tok_s']:.1f} tok/s; bench: {bench_decode:.1f} over its "
        f"requests, median {median_decode:.1f}; acceptance top {chat['acceptance']:.3f}, "
        f"bench {accepted / drafted:.3f}; prefill top {chat['prefill_tok_s']:.0f}, bench "
        f"{bench_prefill:.0f} tok/s; fixture {bed.seconds}"
    )
    assert 0 < accepted < drafted  # a partial acceptance: the comparison means something
    assert chat["decode_tok_s"] == pytest.approx(bench_decode, rel=0.05)
    assert chat["acceptance"] == pytest.approx(accepted / drafted, rel=0.05)
    # Prefill is printed, not compared: llama-server's prompt_seconds_total counts the target's
    # prompt batches, a request's timings.prompt_ms (what bench reports) the draft's prompt too.


def test_unreadable_instances_are_marked_rows(bed: Bed) -> None:
    [host] = bed.top_once["hosts"]
    rows = {r["instance"]: r for r in host["rows"]}
    assert rows["gone"]["state"] == "down" and "refused" in rows["gone"]["detail"]
    assert rows["junk"]["state"] == "garbage"
    assert rows["junk"]["decode_tok_s"] is None
    assert "Traceback" not in bed.top_stderr
    # The table, too.
    code, out, err = llamanix("top", str(bed.config), "--once")
    assert code == 0 and "Traceback" not in err, err
    assert "garbage" in out and "down" in out, out
    text = httpx.get(f"{bed.exporter_url}/metrics").text
    assert 'instance="junk"' in text and 'reason="garbage"' in text
    assert 'instance="gone"' in text and 'reason="down"' in text
