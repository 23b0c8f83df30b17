"""Grafana dashboards for a deployment: overview, per instance, speculation and switches.

Plain typed Python writing Grafana's dashboard JSON (schemaVersion 39, Grafana 10 and later):
each panel is a list of PromQL queries over the exporter's series (core/observability.py) and
llama-server's own. Every dashboard picks its Prometheus through a ``datasource`` variable and
filters by ``host`` (and ``instance``), and shows switches and rollbacks as annotations. The
thresholds drawn are the config's (``[metrics]``). A test runs every query against a real
Prometheus, with the variables set to match everything.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from llamanix.config.model import Metrics
from llamanix.core import observability as obs
from llamanix.core.json_value import JsonObject, JsonValue

SCHEMA_VERSION = 39
PanelKind = Literal["timeseries", "stat"]
DATASOURCE: JsonObject = {"type": "prometheus", "uid": "${datasource}"}
# What the test puts in place of the variables to run a query outside Grafana.
VARIABLES = {"$host": ".*", "$instance": ".*", "$__rate_interval": "1m"}
HOST = 'host=~"$host"'
ONE = 'host=~"$host", instance=~"$instance"'


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = "{{host}}/{{instance}}"


@dataclass(frozen=True)
class Panel:
    title: str
    queries: tuple[Query, ...]
    unit: str = "short"
    kind: PanelKind = "timeseries"
    description: str = ""
    width: int = 12
    threshold: float | None = None  # a red line (or colour step) at this value


@dataclass(frozen=True)
class Annotation:
    """Events drawn on every panel: each time ``expr`` returns a sample."""

    name: str
    expr: str
    probe: str  # the expression without its condition (returns data once the host switched)
    color: str


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    panels: tuple[Panel, ...]
    per_instance: bool = False

    @property
    def file_name(self) -> str:
        return f"{self.uid}.json"

    def queries(self) -> list[str]:
        return [q.expr for p in self.panels for q in p.queries]


def event_annotations() -> tuple[Annotation, ...]:
    return (
        Annotation(
            "Switches",
            f"changes({obs.SWITCHES.exposed}{{{HOST}}}[2m]) > 0",
            f"changes({obs.SWITCHES.exposed}{{{HOST}}}[2m])",
            "blue",
        ),
        Annotation(
            "Rollbacks",
            f"changes({obs.ROLLBACKS.exposed}{{{HOST}}}[2m]) > 0",
            f"changes({obs.ROLLBACKS.exposed}{{{HOST}}}[2m])",
            "red",
        ),
    )


def _rate(series: str, labels: str) -> str:
    return f"rate({series}{{{labels}}}[$__rate_interval])"


def _by(expr: str) -> str:
    return f"sum by (host, instance) ({expr})"


def dashboards(metrics: Metrics) -> list[Dashboard]:
    tokens = _rate("llamacpp:tokens_predicted_total", HOST)
    cached = _by(_rate("llamacpp:prompt_tokens_cached_total", HOST))
    prompted = _by(_rate("llamacpp:prompt_tokens_total", HOST))
    overview = Dashboard(
        "llamanix-overview",
        "llamanix: overview",
        "Every instance of every host: up, speed against the ceiling, load and queueing.",
        (
            Panel(
                "Instances serving",
                (Query(f"sum({obs.UP.name}{{{HOST}}})", "serving"),),
                kind="stat",
                width=6,
                description="Instances whose /metrics answered at the last scrape.",
            ),
            Panel(
                "Instances not serving",
                (Query(f"count({obs.UP.name}{{{HOST}}} == 0) or vector(0)", "not serving"),),
                kind="stat",
                width=6,
                threshold=1,
            ),
            Panel(
                "Generated tokens per second",
                (Query(f"sum({tokens})", "all hosts"),),
                unit="tokens/s",
                kind="stat",
                width=6,
            ),
            Panel(
                "Exporter collection time",
                (Query(f"max({obs.COLLECT_SECONDS.name}{{{HOST}}})", "slowest host"),),
                unit="s",
                kind="stat",
                width=6,
            ),
            Panel(
                "Decode tok/s",
                (Query(f"{obs.DECODE.name}{{{HOST}}}"),),
                unit="tokens/s",
                description="Per request, while generating (accepted drafts count).",
            ),
            Panel(
                "Share of the bandwidth ceiling",
                (Query(f"{obs.CEILING_SHARE.name}{{{HOST}}}"),),
                unit="percentunit",
                threshold=metrics.min_ceiling_share,
            ),
            Panel(
                "Requests in flight",
                (Query(_by(f"llamacpp:requests_processing{{{HOST}}}")),),
            ),
            Panel(
                "Requests deferred (waiting for a slot)",
                (Query(_by(f"llamacpp:requests_deferred{{{HOST}}}")),),
                threshold=1,
            ),
            Panel(
                "Generated tokens per second, by instance",
                (Query(_by(tokens)),),
                unit="tokens/s",
            ),
            Panel(
                "Prompt cache reuse",
                (Query(f"{cached} / ({cached} + {prompted})"),),
                unit="percentunit",
                description="Share of prompt tokens taken from the cache instead of computed.",
            ),
        ),
    )
    instance = Dashboard(
        "llamanix-instance",
        "llamanix: instance",
        "One instance in detail: rates from the counters, slots, cache and the exporter's cost.",
        (
            Panel(
                "Decode and prefill tok/s",
                (
                    Query(f"{obs.DECODE.name}{{{ONE}}}", "decode {{instance}}"),
                    Query(f"{obs.PREFILL.name}{{{ONE}}}", "prefill {{instance}}"),
                ),
                unit="tokens/s",
            ),
            Panel(
                "Decode tok/s against the ceiling",
                (
                    Query(
                        f"rate(llamacpp:tokens_predicted_total{{{ONE}}}[$__rate_interval]) / "
                        f"rate(llamacpp:tokens_predicted_seconds_total{{{ONE}}}"
                        "[$__rate_interval])",
                        "decode {{instance}}",
                    ),
                    Query(f"{obs.CEILING.name}{{{ONE}}}", "ceiling {{instance}}"),
                ),
                unit="tokens/s",
            ),
            Panel(
                "Requests in flight and deferred",
                (
                    Query(f"llamacpp:requests_processing{{{ONE}}}", "in flight {{instance}}"),
                    Query(f"llamacpp:requests_deferred{{{ONE}}}", "deferred {{instance}}"),
                ),
            ),
            Panel(
                "Busy slots per decode call",
                (Query(f"llamacpp:n_busy_slots_per_decode{{{ONE}}}"),),
            ),
            Panel(
                "Prompt tokens per second: computed and from cache",
                (
                    Query(_rate("llamacpp:prompt_tokens_total", ONE), "computed {{instance}}"),
                    Query(_rate("llamacpp:prompt_tokens_cached_total", ONE), "cached {{instance}}"),
                ),
                unit="tokens/s",
            ),
            Panel(
                "Decode calls per second",
                (Query(_rate("llamacpp:n_decode_total", ONE)),),
            ),
            Panel(
                "Scrape time of this instance",
                (Query(f"{obs.SCRAPE_SECONDS.name}{{{ONE}}}"),),
                unit="s",
            ),
            Panel(
                "Up (and loaded, behind a router)",
                (
                    Query(f"{obs.UP.name}{{{ONE}}}", "up {{instance}} ({{reason}})"),
                    Query(f"{obs.LOADED.name}{{{ONE}}}", "loaded {{instance}}"),
                ),
            ),
        ),
        per_instance=True,
    )
    drafted = _rate("llamacpp:spec_decode_num_draft_tokens_total", ONE)
    accepted = _rate("llamacpp:spec_decode_num_accepted_tokens_total", ONE)
    speculation = Dashboard(
        "llamanix-speculation",
        "llamanix: speculation",
        "Whether speculative decoding still pays: acceptance against what the gate kept.",
        (
            Panel(
                "Acceptance, and what the gate kept",
                (
                    Query(f"{obs.ACCEPTANCE.name}{{{ONE}}}", "serving {{instance}}"),
                    Query(f"{obs.GATE_ACCEPTANCE.name}{{{ONE}}}", "gate {{instance}}"),
                ),
                unit="percentunit",
            ),
            Panel(
                "Acceptance as a share of the gate's",
                (
                    Query(
                        f"{obs.ACCEPTANCE.name}{{{ONE}}} / on(host, instance) group_left "
                        f"{obs.GATE_ACCEPTANCE.name}{{{ONE}}}"
                    ),
                ),
                unit="percentunit",
                threshold=metrics.min_acceptance_share,
            ),
            Panel(
                "Drafted and accepted tokens per second",
                (
                    Query(drafted, "drafted {{instance}}"),
                    Query(accepted, "accepted {{instance}}"),
                ),
                unit="tokens/s",
            ),
            Panel(
                "Accepted tokens per draft",
                (Query(f"{accepted} / {_rate('llamacpp:spec_decode_num_drafts_total', ONE)}"),),
                description="Mean tokens accepted per verification step.",
            ),
            Panel(
                "Accepted tokens by draft position",
                (
                    Query(
                        _rate("llamacpp:spec_decode_num_accepted_tokens_per_pos_total", ONE),
                        "{{instance}} position {{position}}",
                    ),
                ),
                unit="tokens/s",
                width=24,
            ),
        ),
        per_instance=True,
    )
    switches = Dashboard(
        "llamanix-switches",
        "llamanix: switches",
        "Generations, the gate's verdicts, restart gaps and rollbacks, per host.",
        (
            Panel(
                "Serving generation",
                (Query(f"{obs.GENERATION.name}{{{HOST}}}", "{{host}}"),),
                kind="stat",
                width=6,
            ),
            Panel(
                "Newest switch's verdict",
                (Query(f"{obs.SWITCH_VERDICT.name}{{{HOST}}} == 1", "{{host}}: {{verdict}}"),),
                kind="stat",
                width=6,
            ),
            Panel(
                "Switches",
                (Query(f"{obs.SWITCHES.exposed}{{{HOST}}}", "{{host}}"),),
                kind="stat",
                width=6,
            ),
            Panel(
                "Rollbacks",
                (Query(f"{obs.ROLLBACKS.exposed}{{{HOST}}}", "{{host}}"),),
                kind="stat",
                width=6,
                threshold=1,
            ),
            Panel(
                "Last restart gap, by instance",
                (Query(f"{obs.SWITCH_GAP.name}{{{HOST}}}"),),
                unit="s",
                description="From the old server's last answer to the new server's first.",
            ),
            Panel(
                "Last load time, by instance",
                (Query(f"{obs.SWITCH_LOAD.name}{{{HOST}}}"),),
                unit="s",
            ),
            Panel(
                "Time of the newest switch",
                (Query(f"{obs.SWITCH_TIME.name}{{{HOST}}} * 1000", "{{host}}"),),
                unit="dateTimeAsIso",
                kind="stat",
                width=24,
            ),
        ),
    )
    return [overview, instance, speculation, switches]


def _variable(name: str, query: str) -> JsonObject:
    return {
        "name": name,
        "label": name,
        "type": "query",
        "datasource": DATASOURCE,
        "definition": query,
        "query": {"query": query, "refId": f"{name}-values"},
        "refresh": 2,
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
    }


def _panel_json(panel: Panel, panel_id: int, x: int, y: int) -> JsonObject:
    steps: list[JsonValue] = [{"color": "green", "value": None}]
    if panel.threshold is not None:
        steps.append({"color": "red", "value": panel.threshold})
    custom: JsonObject = {}
    if panel.kind == "timeseries" and panel.threshold is not None:
        custom = {"thresholdsStyle": {"mode": "line"}}
    return {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": 8, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {
            "defaults": {
                "unit": panel.unit,
                "custom": custom,
                "thresholds": {"mode": "absolute", "steps": steps},
            },
            "overrides": [],
        },
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}}
        if panel.kind == "timeseries"
        else {"reduceOptions": {"calcs": ["lastNotNull"]}, "textMode": "value_and_name"},
        "targets": [
            {"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": q.expr,
             "legendFormat": q.legend}
            for i, q in enumerate(panel.queries)
        ],
    }  # fmt: skip


def dashboard_json(board: Dashboard) -> JsonObject:
    variables: list[JsonValue] = [
        {
            "name": "datasource",
            "label": "Prometheus",
            "type": "datasource",
            "query": "prometheus",
            "current": {},
        },
        _variable("host", f"label_values({obs.UP.name}, host)"),
    ]
    if board.per_instance:
        variables.append(_variable("instance", f"label_values({obs.UP.name}{{{HOST}}}, instance)"))
    panels: list[JsonValue] = []
    x = y = 0
    for i, panel in enumerate(board.panels, start=1):
        if x + panel.width > 24:
            x, y = 0, y + 8
        panels.append(_panel_json(panel, i, x, y))
        x += panel.width
    return {
        "uid": board.uid,
        "title": board.title,
        "description": board.description,
        "tags": ["llamanix"],
        "editable": True,
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "timezone": "browser",
        "templating": {"list": variables},
        "annotations": {
            "list": [
                {
                    "name": a.name,
                    "enable": True,
                    "datasource": DATASOURCE,
                    "expr": a.expr,
                    "step": "60s",
                    "iconColor": a.color,
                    "titleFormat": f"{a.name[:-1].lower()} on {{{{host}}}}",
                    "tagKeys": "host",
                    "textFormat": "",
                    "useValueForTime": False,
                }
                for a in event_annotations()
            ]
        },
        "panels": panels,
    }


def dashboard_text(board: Dashboard) -> str:
    return json.dumps(dashboard_json(board), indent=2) + "\n"
