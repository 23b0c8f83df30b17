"""What ``llamanix render`` adds for a config with a ``[metrics]`` table: the host's exporter
unit, the deployment's Prometheus config and alert rules, and the Grafana dashboards
(docs/observability.md). Every file is computed here, in memory; the command writes them."""

from __future__ import annotations

from llamanix.config.model import Config
from llamanix.render import dashboards, prometheus
from llamanix.render.exporter_unit import UNIT, render_exporter

PROMETHEUS_DIR = "prometheus"
GRAFANA_DIR = "grafana"


def observability_files(config: Config, host: str, user: bool) -> dict[str, str]:
    """Relative path -> text; empty without a ``[metrics]`` table."""
    if config.metrics is None:
        return {}
    metrics = config.metrics
    files = {
        UNIT: render_exporter(config, host, user),
        f"{PROMETHEUS_DIR}/{prometheus.CONFIG_FILE}": prometheus.text(
            prometheus.prometheus_config(config)
        ),
        f"{PROMETHEUS_DIR}/{prometheus.RULES_FILE}": prometheus.text(
            prometheus.rules_config(metrics)
        ),
    }
    for board in dashboards.dashboards(metrics):
        files[f"{GRAFANA_DIR}/{board.file_name}"] = dashboards.dashboard_text(board)
    return files
