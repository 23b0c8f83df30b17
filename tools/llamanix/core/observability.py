"""The series a host's exporter serves: names, labels and meanings, in one place.

The exporter (``observe.exporter``) writes them, the alert rules and the Grafana dashboards
(``render.prometheus.alert_rules``, ``render.dashboards``) query them, and
docs/observability.md lists them; tests check that every query of a rule or a panel names a
series listed here or one of llama-server's own.

llama-server's own series keep their names (``llamacpp:tokens_predicted_total`` ...), so a
query written for a bare llama-server still works; the exporter adds the labels below to each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# Every series of an instance carries these labels: the host and instance it belongs to, the
# llama.cpp variant and build (the commit llama-server reports in /props), the model file and
# the speculative type (a chain as "ngram-mod+mtp"; "none" without speculation).
TARGET_LABELS = ("host", "instance", "variant", "build", "model", "spec_type")
# The series about a host's switches carry the host alone; those about one instance's last
# switch, the host and the instance.
HOST_LABELS = ("host",)
INSTANCE_LABELS = ("host", "instance")
# What a build label says when neither the server nor the manifest named a commit.
UNKNOWN_BUILD = "unknown"
# The prefix of llama-server's own series.
LLAMACPP_PREFIX = "llamacpp:"
# The Prometheus job every exporter is scraped under (render.prometheus).
JOB = "llamanix"

Kind = Literal["gauge", "counter"]
Scope = Literal["target", "instance", "host"]


@dataclass(frozen=True)
class Series:
    """One series the exporter adds: its name (a counter's without ``_total``), kind, the
    labels it carries and what it means."""

    name: str
    kind: Kind
    scope: Scope
    doc: str
    extra_labels: tuple[str, ...] = ()

    @property
    def exposed(self) -> str:
        """The name as Prometheus stores it (counters end in ``_total``)."""
        return f"{self.name}_total" if self.kind == "counter" else self.name

    @property
    def labels(self) -> tuple[str, ...]:
        base = {
            "target": TARGET_LABELS,
            "instance": INSTANCE_LABELS,
            "host": HOST_LABELS,
        }[self.scope]
        return (*base, *self.extra_labels)


UP = Series(
    "llamanix_up",
    "gauge",
    "target",
    "1 when the instance's /metrics answered and parsed; 0 when it is down, refused the "
    "exporter or answered something that is not Prometheus text (the `reason` label says which).",
    ("reason",),
)
LOADED = Series(
    "llamanix_loaded",
    "gauge",
    "target",
    "1 when the instance's model is loaded; 0 for a router member its router has unloaded (not "
    "down: the router loads it on the next request).",
)
SCRAPE_SECONDS = Series(
    "llamanix_scrape_duration_seconds",
    "gauge",
    "target",
    "How long the exporter's requests to this instance took (its /metrics, and /props once).",
)
DECODE = Series(
    "llamanix_decode_tokens_per_second",
    "gauge",
    "target",
    "Decode rate while generating: tokens predicted / seconds spent predicting, between two "
    "collections of the exporter (since the server started when nothing was decoded between).",
)
PREFILL = Series(
    "llamanix_prefill_tokens_per_second",
    "gauge",
    "target",
    "Prompt processing rate, as the decode rate is computed (cached prompt tokens excluded).",
)
ACCEPTANCE = Series(
    "llamanix_spec_acceptance_ratio",
    "gauge",
    "target",
    "Accepted draft tokens / drafted tokens, as the decode rate is computed; absent without "
    "speculation.",
)
CEILING = Series(
    "llamanix_decode_ceiling_tokens_per_second",
    "gauge",
    "target",
    "The decode ceiling: the host GPU's memory bandwidth / the model's weight bytes read per "
    "token; absent when the host names no `gpu` or the model file cannot be read.",
)
CEILING_SHARE = Series(
    "llamanix_decode_ceiling_share",
    "gauge",
    "target",
    "The decode rate as a share of the ceiling.",
)
GATE_ACCEPTANCE = Series(
    "llamanix_gate_acceptance_ratio",
    "gauge",
    "instance",
    "The draft acceptance a bench gate measured over its runs (its prompts, at temperature 0) "
    "when it kept the serving generation; absent after a health or smoke gate.",
)
SWITCH_GAP = Series(
    "llamanix_last_switch_gap_seconds",
    "gauge",
    "instance",
    "The last switch that restarted the instance: seconds from the old server's last answer to "
    "the new server's first.",
)
SWITCH_LOAD = Series(
    "llamanix_last_switch_load_seconds",
    "gauge",
    "instance",
    "The last switch that restarted the instance: seconds from the new server's start to its "
    "first answer.",
)
SWITCH_TIME = Series(
    "llamanix_last_switch_timestamp_seconds",
    "gauge",
    "host",
    "When the host's newest generation was made (Unix time).",
)
SWITCH_VERDICT = Series(
    "llamanix_last_switch_verdict",
    "gauge",
    "host",
    "The gate's verdict on the host's newest generation: 1 for the `verdict` label that holds, "
    "0 for the others (passed, failed, pending, interrupted, unverified).",
    ("verdict",),
)
GENERATION = Series(
    "llamanix_generation",
    "gauge",
    "host",
    "The number of the generation serving on the host.",
)
SWITCHES = Series(
    "llamanix_switches",
    "counter",
    "host",
    "Generations made on the host (every switch makes one, kept or rolled back).",
)
ROLLBACKS = Series(
    "llamanix_rollbacks",
    "counter",
    "host",
    "Rollbacks on the host: a generation whose gate failed and was rolled back, or one that "
    "`llamanix rollback` served again.",
)
COLLECT_SECONDS = Series(
    "llamanix_exporter_collect_seconds",
    "gauge",
    "host",
    "How long the exporter's previous collection of every instance took (its scrape cost).",
)

SERIES: tuple[Series, ...] = (
    UP,
    LOADED,
    SCRAPE_SECONDS,
    DECODE,
    PREFILL,
    ACCEPTANCE,
    CEILING,
    CEILING_SHARE,
    GATE_ACCEPTANCE,
    SWITCH_GAP,
    SWITCH_LOAD,
    SWITCH_TIME,
    SWITCH_VERDICT,
    GENERATION,
    SWITCHES,
    ROLLBACKS,
    COLLECT_SECONDS,
)

# Why an instance's row is marked, in llamanix_up's `reason` label and top's state column.
ScrapeState = Literal["ok", "down", "refused", "error", "garbage", "unloaded"]
SCRAPE_STATES: tuple[ScrapeState, ...] = ("ok", "down", "refused", "error", "garbage", "unloaded")

# llama-server's series that the rules and dashboards query (present in every build that
# serves /metrics; the speculative ones only where the build counts drafts).
LLAMACPP_SERIES = (
    "llamacpp:prompt_tokens_total",
    "llamacpp:prompt_tokens_cached_total",
    "llamacpp:prompt_seconds_total",
    "llamacpp:tokens_predicted_total",
    "llamacpp:tokens_predicted_seconds_total",
    "llamacpp:n_decode_total",
    "llamacpp:requests_processing",
    "llamacpp:requests_deferred",
    "llamacpp:n_busy_slots_per_decode",
    "llamacpp:spec_decode_num_draft_tokens_total",
    "llamacpp:spec_decode_num_accepted_tokens_total",
    "llamacpp:spec_decode_num_drafts_total",
    "llamacpp:spec_decode_num_accepted_tokens_per_pos_total",
)


def series_markdown() -> str:
    """The series table of docs/observability.md (a test keeps the two equal)."""
    return "".join(f"| `{s.exposed}` | {', '.join(s.labels)} | {s.doc} |\n" for s in SERIES)
