"""Prometheus for a deployment: the scrape config of every host's exporter, and the alert rules.

Both are written as JSON, which YAML reads as it is (Prometheus and promtool load them), so no
YAML library is needed to write them. The scrape config is for a Prometheus on the machine that
renders: a host without a ``target`` is this machine, a host with one is reached at its
address (core/address.py), which a loopback-only exporter cannot be.

``honor_labels``: each exporter's series carry their own ``host`` and ``instance`` labels (the
llamanix instance), which must win over the target's ``instance`` (the exporter's address);
only the ``up`` series of the job keep the target's labels, with the host added.

The NixOS module writes the same job for its one host (modules/prometheus.nix; a test keeps
the two equal).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from llamanix.config.model import Config, Metrics
from llamanix.core import observability as obs
from llamanix.core.address import connect_host, is_loopback, remote_host, url_host
from llamanix.core.errors import Problem, UserError
from llamanix.core.json_codec import JSON_SKIP, JsonRecord, JsonShape, json_via
from llamanix.core.json_value import JsonObject

CONFIG_FILE = "prometheus.yml"
RULES_FILE = "llamanix.rules.yml"
GROUP = "llamanix"

Severity = Literal["critical", "warning", "info"]


def metrics_of(config: Config) -> Metrics:
    if config.metrics is None:
        raise UserError(
            Problem(
                config.source,
                "metrics",
                "this config has no [metrics] table",
                "add [metrics] (docs/observability.md)",
            )
        )
    return config.metrics


def exporter_address(config: Config, host: str) -> str:
    """HOST:PORT at which a Prometheus on this machine reaches ``host``'s exporter."""
    metrics = metrics_of(config)
    target = config.hosts[host].target
    if target is None:
        address = connect_host(metrics.listen)
    elif is_loopback(metrics.listen):
        raise UserError(
            Problem(
                config.source,
                "metrics.listen",
                f"the exporters listen on {metrics.listen}, where a Prometheus on this machine "
                f"cannot reach host '{host}' ({target})",
                'set listen = "0.0.0.0" and allow_remote = true (the exporter unit then lets '
                "only the local networks in), or render the scrape config on each host",
            )
        )
    else:
        address = remote_host(metrics.listen, target, host)
    return f"{url_host(address)}:{metrics.port}"


def scrape_hosts(config: Config) -> list[str]:
    """The hosts that run instances, in the config's order (each has an exporter)."""
    return [name for name in config.hosts if config.instances_on(name)]


def scrape_job(config: Config, hosts: list[str] | None = None) -> JsonObject:
    """One ``scrape_configs`` entry: the exporter of each of ``hosts`` (default: every host
    with instances), labelled with its host."""
    metrics = metrics_of(config)
    return {
        "job_name": obs.JOB,
        "scrape_interval": f"{metrics.scrape_interval}s",
        "scrape_timeout": f"{min(metrics.scrape_interval, 10)}s",
        "honor_labels": True,
        "static_configs": [
            {"targets": [exporter_address(config, name)], "labels": {"host": name}}
            for name in hosts or scrape_hosts(config)
        ],
    }


def prometheus_config(config: Config) -> JsonObject:
    """A whole prometheus.yml: the job, its evaluation interval and the rules beside it."""
    metrics = metrics_of(config)
    return {
        "global": {
            "scrape_interval": f"{metrics.scrape_interval}s",
            "evaluation_interval": f"{metrics.scrape_interval}s",
        },
        "rule_files": [RULES_FILE],
        "scrape_configs": [scrape_job(config)],
    }


def _duration(seconds: int) -> str:
    return f"{seconds}s"


def _labels(severity: Severity) -> JsonObject:
    return {"severity": severity}


@dataclass(frozen=True)
class AlertRule(JsonRecord):
    """One alert: its rule (its JSON, in Prometheus' rule format), and what
    docs/observability.md says of it.

    ``probe`` is the alert's expression without its condition: on a deployment that serves,
    it returns a series for every instance the alert watches, while the alert itself stays
    quiet. A test runs each probe against a real Prometheus."""

    alert: str
    expr: str
    for_s: int = field(metadata=json_via(_duration, key="for"))
    severity: Severity = field(metadata=json_via(_labels, key="labels"))
    summary: str = field(metadata=JSON_SKIP)
    means: str = field(metadata=JSON_SKIP)
    action: str = field(metadata=JSON_SKIP)
    probe: str = field(metadata=JSON_SKIP)

    json_shape: ClassVar[JsonShape] = JsonShape(
        computed={"annotations": lambda r: {"summary": r.summary, "description": r.action}}
    )


def _for(metrics: Metrics, scrapes: int, floor_s: int) -> int:
    """A condition must hold this long: several scrapes, and never less than ``floor_s``."""
    return max(floor_s, scrapes * metrics.scrape_interval)


def alert_rules(metrics: Metrics) -> list[AlertRule]:
    acceptance = f"{obs.ACCEPTANCE.name} / on(host, instance) group_left {obs.GATE_ACCEPTANCE.name}"
    ceiling = (
        f"{obs.CEILING_SHARE.name} and on(host, instance) rate(llamacpp:tokens_predicted_total[5m])"
    )
    return [
        AlertRule(
            "LlamanixExporterDown",
            f'up{{job="{obs.JOB}"}} == 0',
            _for(metrics, 4, 60),
            "critical",
            "The llamanix exporter of host {{ $labels.host }} does not answer",
            "Prometheus cannot scrape the host's exporter: nothing about its instances is "
            "known (the host may be down, or llamanix-exporter.service stopped).",
            "Check the host, then `systemctl status llamanix-exporter` and "
            "`journalctl -u llamanix-exporter` there.",
            f'up{{job="{obs.JOB}"}}',
        ),
        AlertRule(
            "LlamanixInstanceDown",
            f"{obs.UP.name} == 0",
            _for(metrics, 4, 60),
            "critical",
            "{{ $labels.host }}/{{ $labels.instance }} does not serve /metrics "
            "({{ $labels.reason }})",
            "The exporter reached the host but not the instance's /metrics: the server is down "
            "or restarting (`down`), refuses the exporter's key (`refused`), or answers an "
            "error or something that is not Prometheus text (`error`, `garbage`).",
            "`systemctl status llamanix-INSTANCE` and its journal on the host; `llamanix top` "
            "shows the reason in its row. For `refused`, the exporter unit must carry the "
            "instance's key (render again after changing api_key_file).",
            obs.UP.name,
        ),
        AlertRule(
            "LlamanixSwitchRolledBack",
            f"increase({obs.ROLLBACKS.exposed}[1h]) > 0",
            0,
            "warning",
            "A switch of host {{ $labels.host }} was rolled back",
            "A generation failed its gate and the previous one serves again, or someone ran "
            "`llamanix rollback`: what the host serves is not what the config last asked for.",
            "`llamanix generations CONFIG --host HOST` shows the gate's verdict and why; fix "
            "the change (or the gate's thresholds) and switch again.",
            obs.ROLLBACKS.exposed,
        ),
        AlertRule(
            "LlamanixAcceptanceBelowGate",
            f"{acceptance} < {metrics.min_acceptance_share:g}",
            _for(metrics, 20, 900),
            "warning",
            "Draft acceptance of {{ $labels.host }}/{{ $labels.instance }} fell to "
            "{{ $value | humanizePercentage }} of what its gate kept",
            "Speculation accepts a smaller share of its drafts than when the gate kept this "
            f"generation (below {metrics.min_acceptance_share:.0%} of it): today's traffic "
            "differs from the gate's prompts, so the draft may now cost more than it saves.",
            "Compare with `llamanix bench` on real traffic (--prompts), with and without "
            'speculation; switch to another drafter or to type = "none" if it no longer '
            "pays, or gate on prompts like the traffic (--gate-prompts).",
            acceptance,
        ),
        AlertRule(
            "LlamanixDecodeBelowCeiling",
            f"{obs.CEILING_SHARE.name} < {metrics.min_ceiling_share:g} and on(host, instance) "
            "rate(llamacpp:tokens_predicted_total[5m]) > 0",
            _for(metrics, 20, 900),
            "warning",
            "{{ $labels.host }}/{{ $labels.instance }} decodes at "
            "{{ $value | humanizePercentage }} of its bandwidth ceiling",
            f"While busy, the instance decodes below {metrics.min_ceiling_share:.0%} of what "
            "the GPU's memory bandwidth allows for its model: layers on the CPU, a cache type "
            "or flag that costs speed, or a GPU shared with something else.",
            "Run `llamanix doctor` on the host and `llamanix plan` for the offload; compare "
            "`llamanix bench` with `llamanix model ceiling`.",
            ceiling,
        ),
        AlertRule(
            "LlamanixRequestsDeferred",
            "llamacpp:requests_deferred > 0",
            _for(metrics, 20, 300),
            "warning",
            "{{ $labels.host }}/{{ $labels.instance }} has had requests waiting for a slot",
            "Requests queue because every slot is busy: clients wait before their first token.",
            "Raise `parallel` (more slots share the context), add a replica behind the "
            "gateway, or lower the load; `llamanix top` shows in-flight and deferred requests.",
            "llamacpp:requests_deferred",
        ),
    ]


def rules_config(metrics: Metrics) -> JsonObject:
    return {
        "groups": [
            {
                "name": GROUP,
                "interval": f"{metrics.scrape_interval}s",
                "rules": [rule.to_json() for rule in alert_rules(metrics)],
            }
        ]
    }


def text(data: JsonObject) -> str:
    """JSON, which YAML reads as it is."""
    return json.dumps(data, indent=2) + "\n"


def alerts_markdown(metrics: Metrics) -> str:
    """The alerts table of docs/observability.md (a test keeps the two equal)."""
    out = ["| alert | fires when | what it means | what to do |", "|---|---|---|---|"]
    for rule in alert_rules(metrics):
        held = f" for {rule.for_s} s" if rule.for_s else ""
        out.append(
            f"| `{rule.alert}` ({rule.severity}) | `{rule.expr}`{held} | {rule.means} | "
            f"{rule.action} |"
        )
    return "\n".join(out) + "\n"
