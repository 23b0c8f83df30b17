"""One look at a llama-server's /metrics, as the exporter and ``llamanix top`` take it.

A scrape never loads a model and never raises for a server's fault: whatever an instance does
(down, refusing the key, answering an error or text that is not Prometheus text, or unloaded by
its router) becomes a ``Scrape`` whose state says so, with one line of detail.

Behind a router a member is read where the router exposes it, only while it is loaded:

- llama-server's router mode: ``GET /metrics?model=NAME&autoload=false`` (the router answers
  "model is not loaded" rather than loading it);
- llama-swap: ``GET /running`` first, then ``GET /upstream/NAME/metrics`` for a member that is
  running (``/upstream`` would start one that is not).

Not ``server.client.LlamaClient``: a scrape needs short deadlines, the query above and
llama-swap's own paths, and must never wait for a load.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal
from urllib.parse import quote

from llamanix.core.observability import LLAMACPP_PREFIX, ScrapeState
from llamanix.core.schema import RouterKind
from llamanix.server.metrics import NOT_COUNTERS, MetricsSnapshot, parse_metrics

if TYPE_CHECKING:
    import httpx

# A scrape that takes longer than this is a server too busy to answer: marked, not waited for.
CONNECT_S = 2.0
READ_S = 5.0
# How a scrape's detail starts where nothing listens on the server's port.
NOTHING_LISTENS = "nothing listens on"
FamilyKind = Literal["counter", "gauge"]


@dataclass(frozen=True)
class Endpoint:
    """Where one instance is read: its own address, or its router's with the name the router
    serves it under."""

    url: str
    member: str | None = None
    router: RouterKind | None = None

    def metrics_path(self) -> tuple[str, dict[str, str]]:
        if self.member is None:
            return "/metrics", {}
        if self.router == "llama-swap":
            return f"/upstream/{quote(self.member, safe='')}/metrics", {}
        return "/metrics", {"model": self.member, "autoload": "false"}

    def props_path(self) -> tuple[str, dict[str, str]]:
        if self.member is None or self.router == "llama-server":
            # llama-server's router serves its members with its own binary: its /props names
            # the build they run.
            return "/props", {}
        return f"/upstream/{quote(self.member, safe='')}/props", {}


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True)
class Family:
    """One of llama-server's series families, as it exposed it (``llamacpp:`` names)."""

    name: str  # a counter's without "_total"
    kind: FamilyKind
    doc: str
    samples: tuple[Sample, ...]


@dataclass(frozen=True)
class Scrape:
    """What one look at an instance found."""

    state: ScrapeState
    detail: str = ""
    families: tuple[Family, ...] = ()
    snapshot: MetricsSnapshot | None = None
    seconds: float = 0.0
    build: str | None = None  # the commit of /props' build_info, when asked for

    @property
    def ok(self) -> bool:
        return self.state == "ok"


def parse_families(text: str) -> tuple[Family, ...]:
    """llama-server's families in Prometheus text; ValueError when the text is not that or
    holds none of them."""
    from prometheus_client.parser import text_string_to_metric_families

    out: list[Family] = []
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(LLAMACPP_PREFIX):
            continue
        short = family.name[len(LLAMACPP_PREFIX) :]
        # n_tokens_max is declared a counter but is a running maximum (server.metrics).
        kind: FamilyKind = (
            "counter" if family.type == "counter" and short not in NOT_COUNTERS else "gauge"
        )
        samples = tuple(
            # The parser names a counter's samples NAME_total; a gauge's sample is the family.
            Sample(s.name if kind == "counter" else family.name, dict(s.labels), float(s.value))
            for s in family.samples
            if not s.name.endswith("_created")
        )
        out.append(Family(family.name, kind, family.documentation, samples))
    if not out:
        raise ValueError("no llamacpp: series")
    return tuple(out)


def build_commit(build_info: object) -> str | None:
    """The commit of /props' ``build_info`` (``b6123-0c1e570`` -> ``0c1e570``)."""
    if not isinstance(build_info, str) or not build_info:
        return None
    tail = build_info.rsplit("-", 1)[-1]
    return tail or None


def _get(client: httpx.Client, url: str, path_query: tuple[str, dict[str, str]]) -> httpx.Response:
    path, query = path_query
    return client.get(url.rstrip("/") + path, params=query or None)


def _running(client: httpx.Client, ep: Endpoint) -> bool:
    """Whether llama-swap runs the member now (its /running list, state "ready")."""
    resp = client.get(ep.url.rstrip("/") + "/running")
    resp.raise_for_status()
    data = resp.json()
    entries = data.get("running") if isinstance(data, dict) else None
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and entry.get("model") == ep.member:
            return entry.get("state") in (None, "ready")
    return False


def _error_text(resp: httpx.Response) -> str:
    text = resp.text.strip().replace("\n", " ")
    return text[:120] + ("..." if len(text) > 120 else "")


def scrape(
    client: httpx.Client,
    ep: Endpoint,
    *,
    props: bool = False,
) -> Scrape:
    """Read one instance's /metrics (and its build from /props, when asked); never raises
    for the server's fault."""
    import httpx

    started = time.perf_counter()

    def done(state: ScrapeState, detail: str) -> Scrape:
        return Scrape(state, detail, seconds=time.perf_counter() - started)

    try:
        if ep.router == "llama-swap" and not _running(client, ep):
            return done("unloaded", f"llama-swap does not run {ep.member} now")
        resp = _get(client, ep.url, ep.metrics_path())
    except httpx.TimeoutException:
        return done("down", f"no answer within {READ_S:g} s")
    except httpx.ConnectError as err:
        if "refused" not in str(err).lower():
            return done("down", f"{type(err).__name__}: {err}")
        where = httpx.URL(ep.url)
        return done(
            "down",
            f"{NOTHING_LISTENS} {where.host}:{where.port} (connection refused): the server is "
            "stopped, crashed or not started yet",
        )
    except httpx.TransportError as err:
        return done("down", f"{type(err).__name__}: {err}" if str(err) else type(err).__name__)
    except ValueError as err:  # /running that is not JSON
        return done("garbage", f"/running: {err}")
    if resp.status_code in (401, 403):
        return done("refused", f"HTTP {resp.status_code}: the API key was refused or missing")
    if ep.member is not None and resp.status_code == 400 and "not loaded" in resp.text:
        return done("unloaded", f"the router has not loaded {ep.member}")
    if resp.status_code != 200:
        return done("error", f"HTTP {resp.status_code}: {_error_text(resp)}")
    try:
        families = parse_families(resp.text)
        snapshot = parse_metrics(resp.text)
    except ValueError as err:
        return done("garbage", f"/metrics is not Prometheus text: {err}")
    build = _build(client, ep) if props else None
    return Scrape(
        "ok",
        families=families,
        snapshot=snapshot,
        seconds=time.perf_counter() - started,
        build=build,
    )


def _build(client: httpx.Client, ep: Endpoint) -> str | None:
    import httpx

    try:
        resp = _get(client, ep.url, ep.props_path())
        data = resp.json() if resp.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    return build_commit(data.get("build_info")) if isinstance(data, dict) else None


def http_client(api_key: str | None = None) -> httpx.Client:
    """The client a scraper keeps for one instance (or one router): short deadlines, the key
    as a Bearer header."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.Client(
        timeout=httpx.Timeout(READ_S, connect=CONNECT_S),
        limits=httpx.Limits(max_connections=2),
        headers=headers,
    )
