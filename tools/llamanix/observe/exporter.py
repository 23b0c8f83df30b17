"""The host's exporter: every local llama-server's /metrics, labelled, plus what llama-server
does not count (core/observability.py lists each series), served for Prometheus with
prometheus-client.

Each scrape of the exporter reads every instance once (``observe.host_reading``); llama-server's
own series keep their names and gain the target labels. What the exporter serves is computed
at the scrape, never in the background, so an exporter nobody scrapes costs the servers
nothing.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

from llamanix.core import observability as obs
from llamanix.core.address import bare
from llamanix.core.observability import Series
from llamanix.observe.host_reading import HostReader, HostReading, InstanceReading
from llamanix.state.generations import GATE_OUTCOMES

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import CollectorRegistry


def _family(series: Series) -> Metric:
    from prometheus_client.metrics_core import Metric

    return Metric(series.name, series.doc, series.kind)


def _add(metric: Metric, series: Series, labels: Mapping[str, str], value: float) -> None:
    metric.add_sample(series.exposed, {k: labels[k] for k in series.labels}, value)


def _target_labels(reading: InstanceReading) -> dict[str, str]:
    return {**reading.target.labels, "build": reading.build}


def upstream_labels(theirs: Mapping[str, str], ours: Mapping[str, str]) -> dict[str, str]:
    """A server's sample labels under the exporter's: ours (``host``, ``instance`` ...) always
    win, so whatever answers on an instance's port cannot pose as another host or instance. A
    label of theirs that ours replace is kept as ``exported_NAME``, as Prometheus itself keeps
    a scraped label that a target label replaces."""
    out = dict(ours)
    for name, value in theirs.items():
        while name in out:
            name = f"exported_{name}"
        out[name] = value
    return out


def reading_families(reading: HostReading) -> list[Metric]:
    """Everything one reading of a host says, as Prometheus families."""
    from prometheus_client.metrics_core import Metric

    ours = {s.name: _family(s) for s in obs.SERIES}
    theirs: dict[str, Metric] = {}
    host = {"host": reading.host}
    for inst in reading.instances:
        labels = _target_labels(inst)
        found = inst.scrape
        _add(ours[obs.UP.name], obs.UP, {**labels, "reason": found.state}, 1.0 if _up(inst) else 0)
        _add(ours[obs.SCRAPE_SECONDS.name], obs.SCRAPE_SECONDS, labels, found.seconds)
        if found.state in ("ok", "unloaded"):
            _add(ours[obs.LOADED.name], obs.LOADED, labels, 1.0 if found.ok else 0.0)
        if inst.target.ceiling_tok_s is not None:
            _add(ours[obs.CEILING.name], obs.CEILING, labels, inst.target.ceiling_tok_s)
        fig = inst.figures
        if fig is not None:
            for series, value in (
                (obs.DECODE, fig.decode_tok_s),
                (obs.PREFILL, fig.prefill_tok_s),
                (obs.ACCEPTANCE, fig.acceptance),
                (obs.CEILING_SHARE, inst.ceiling_share),
            ):
                if value is not None:
                    _add(ours[series.name], series, labels, value)
        for family in found.families:
            metric = theirs.get(family.name)
            if metric is None:
                metric = theirs[family.name] = Metric(family.name, family.doc, family.kind)
            for sample in family.samples:
                metric.add_sample(sample.name, upstream_labels(sample.labels, labels), sample.value)
    sw = reading.switches
    for name, restart in sw.restarts.items():
        labels = {**host, "instance": name}
        if restart.gap.gap_s is not None:
            _add(ours[obs.SWITCH_GAP.name], obs.SWITCH_GAP, labels, restart.gap.gap_s)
        if restart.gap.load_s is not None:
            _add(ours[obs.SWITCH_LOAD.name], obs.SWITCH_LOAD, labels, restart.gap.load_s)
    for name, value in sw.gate_acceptance.items():
        _add(ours[obs.GATE_ACCEPTANCE.name], obs.GATE_ACCEPTANCE, {**host, "instance": name}, value)
    if sw.any:
        _add(ours[obs.SWITCHES.name], obs.SWITCHES, host, sw.switches)
        _add(ours[obs.ROLLBACKS.name], obs.ROLLBACKS, host, sw.rollbacks)
        if sw.serving is not None:
            _add(ours[obs.GENERATION.name], obs.GENERATION, host, sw.serving)
        if sw.newest_time is not None:
            _add(ours[obs.SWITCH_TIME.name], obs.SWITCH_TIME, host, sw.newest_time)
        for verdict in GATE_OUTCOMES:
            _add(
                ours[obs.SWITCH_VERDICT.name],
                obs.SWITCH_VERDICT,
                {**host, "verdict": verdict},
                1.0 if verdict == sw.newest_verdict else 0.0,
            )
    _add(ours[obs.COLLECT_SECONDS.name], obs.COLLECT_SECONDS, host, reading.seconds)
    return [m for m in ours.values() if m.samples] + list(theirs.values())


def _up(inst: InstanceReading) -> bool:
    # An unloaded router member is not down: its router answered for it.
    return inst.scrape.state in ("ok", "unloaded")


class Exporter:
    """A prometheus-client collector: each collection is one reading of the host."""

    def __init__(self, reader: HostReader) -> None:
        self.reader = reader
        # Two scrapes at once would race over the previous counters: one reading at a time.
        self._lock = threading.Lock()

    def describe(self) -> Iterable[Metric]:
        # Nothing is described up front: registering must not read the servers.
        return []

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            reading = self.reader.read()
        yield from reading_families(reading)


def registry_of(exporter: Exporter) -> CollectorRegistry:
    """A registry holding only the exporter (no process or platform collectors: the series
    are the servers', not this Python's)."""
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(exporter)
    return registry


def exposition(registry: CollectorRegistry) -> str:
    """One scrape as Prometheus text (what `llamanix metrics --once` prints)."""
    from prometheus_client import generate_latest

    return generate_latest(registry).decode()


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], registry: CollectorRegistry) -> None:
        self.registry = registry
        super().__init__(address, _Handler)


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, generate_latest

        if self.path.split("?", 1)[0] not in ("/metrics", "/"):
            self.send_error(404, "the exporter serves /metrics")
            return
        body = generate_latest(self.server.registry)
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE_PLAIN_0_0_4)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # a line per scrape would fill the journal


def serve(registry: CollectorRegistry, listen: str, port: int) -> ThreadingHTTPServer:
    """Serve ``/metrics`` on ``listen:port`` from a thread of this process; OSError when the
    address cannot be bound.

    Always Prometheus' text format 0.0.4, whatever the scraper's Accept header asks: the
    OpenMetrics writer of prometheus-client turns the ':' of llama-server's names into '_' in
    the samples (but not in their HELP lines), so the names would depend on who scrapes."""
    server_class = _Server6 if ":" in bare(listen) else _Server
    server = server_class((bare(listen), port), registry)
    threading.Thread(target=server.serve_forever, name="exporter", daemon=True).start()
    return server
