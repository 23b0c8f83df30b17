"""llama-server's Prometheus /metrics: scrape, parse (prometheus-client's parser), subtract.

llama-server only serves /metrics when started with ``--metrics``; every name carries the
``llamacpp:`` prefix, which is dropped here. Counters are subtracted between two scrapes; the
gauges (``predicted_tokens_seconds`` ...) are averaged by the server over the window since the
previous scrape, so the value after a run already describes that run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PREFIX = "llamacpp:"
# Declared a counter by llama-server but a running maximum: its delta means nothing. The parser
# appends "_total" to counter samples that lack it; this one keeps its own name.
NOT_COUNTERS = frozenset({"n_tokens_max"})


@dataclass(frozen=True)
class MetricsSnapshot:
    """One scrape: sample name (prefix dropped, labels appended) -> value."""

    values: dict[str, float]
    counters: frozenset[str] = field(default_factory=frozenset)

    def get(self, name: str, default: float | None = None) -> float | None:
        return self.values.get(name, default)


def _sample_key(name: str, labels: dict[str, str]) -> str:
    if name.startswith(PREFIX):
        name = name[len(PREFIX) :]
    if labels:
        inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        name = f"{name}{{{inner}}}"
    return name


def parse_metrics(text: str) -> MetricsSnapshot:
    """Parse Prometheus text exposition into a snapshot."""
    values: dict[str, float] = {}
    counters: set[str] = set()
    # Imported here: the gate's records (read by `plan`) import this module, not the parser.
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        family_name = _sample_key(family.name, {})
        for sample in family.samples:
            if family_name in NOT_COUNTERS:
                values[_sample_key(family.name, dict(sample.labels))] = float(sample.value)
                continue
            key = _sample_key(sample.name, dict(sample.labels))
            values[key] = float(sample.value)
            if family.type == "counter":
                counters.add(key)
    return MetricsSnapshot(values=values, counters=frozenset(counters))


def metrics_delta(before: MetricsSnapshot, after: MetricsSnapshot) -> dict[str, float]:
    """Counters: what the window between the scrapes added. Gauges: the value after."""
    out: dict[str, float] = {}
    for key, value in after.values.items():
        if key in after.counters:
            out[key] = value - before.values.get(key, 0.0)
        else:
            out[key] = value
    return out
