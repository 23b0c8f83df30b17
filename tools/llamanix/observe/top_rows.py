"""``llamanix top``'s figures: one row per instance, per host, as ``top --once --json`` prints
them and the live view draws them.

A host with a ``target`` (kind systemd or systemd-user) is read over ssh, the way a fleet switch
reaches it: its own llamanix runs ``fleet-agent top`` there (one of the fleet agent's commands,
which its sudoers line allows), on the fleet agent's copy of the config (where that host's
generations are kept), and the JSON of ``top --once --json`` comes back.
A host that cannot be read is one marked row, never a traceback.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from llamanix.config.model import Config
from llamanix.core.errors import ExternalCommandError, UserError
from llamanix.core.json_codec import JsonRecord
from llamanix.external.process import Runner
from llamanix.external.ssh import SSH_FAILED, run_ssh
from llamanix.fleet.protocol import EXIT_INCOMPATIBLE, HELLO
from llamanix.fleet.remote import agent_argv, agent_request, remote_host
from llamanix.observe.host_reading import HostReading, InstanceReading
from llamanix.observe.scrape import NOTHING_LISTENS
from llamanix.observe.switch_figures import SwitchFigures
from llamanix.render.manifest import unit_name
from llamanix.render.units import ROUTER

TOP_FORMAT = "llamanix-top/1"
# A host's state: read, not reachable over ssh, or reached but its llamanix could not read it.
HostState = Literal["ok", "unreachable", "error"]


@dataclass(frozen=True)
class TopRow(JsonRecord):
    """One instance: its state (``ok``, or why its row is marked) and its figures."""

    instance: str
    state: str
    detail: str
    variant: str | None = None
    build: str | None = None
    model: str | None = None
    spec_type: str | None = None
    in_flight: float | None = None
    deferred: float | None = None
    decode_tok_s: float | None = None
    decode_basis: str | None = None
    prefill_tok_s: float | None = None
    ttft_1k_s: float | None = None
    acceptance: float | None = None
    ceiling_tok_s: float | None = None
    ceiling_share: float | None = None
    cache_reuse: float | None = None
    gate_acceptance: float | None = None
    last_gap_s: float | None = None
    last_load_s: float | None = None
    last_switch_generation: int | None = None


@dataclass(frozen=True)
class TopHost(JsonRecord):
    host: str
    state: HostState
    detail: str = ""
    generation: int | None = None
    newest_generation: int | None = None
    newest_verdict: str | None = None
    switches: int | None = None
    rollbacks: int | None = None
    seconds: float | None = None
    rows: tuple[TopRow, ...] = ()


def _row(reading: InstanceReading, switches: SwitchFigures) -> TopRow:
    fig = reading.figures
    restart = switches.restarts.get(reading.target.instance)
    labels = reading.target.labels
    return TopRow(
        instance=reading.target.instance,
        state=reading.scrape.state,
        detail=_detail(reading),
        variant=labels.get("variant"),
        build=reading.build,
        model=labels.get("model"),
        spec_type=labels.get("spec_type"),
        in_flight=fig.in_flight if fig else None,
        deferred=fig.deferred if fig else None,
        decode_tok_s=fig.decode_tok_s if fig else None,
        decode_basis=fig.decode_basis if fig else None,
        prefill_tok_s=fig.prefill_tok_s if fig else None,
        ttft_1k_s=fig.ttft_1k_s if fig else None,
        acceptance=fig.acceptance if fig else None,
        ceiling_tok_s=reading.target.ceiling_tok_s,
        ceiling_share=reading.ceiling_share,
        cache_reuse=fig.cache_reuse if fig else None,
        gate_acceptance=switches.gate_acceptance.get(reading.target.instance),
        last_gap_s=restart.gap.gap_s if restart else None,
        last_load_s=restart.gap.load_s if restart else None,
        last_switch_generation=restart.generation if restart else None,
    )


def _detail(reading: InstanceReading) -> str:
    """Why a row is marked, and for a server that is not there, where to look."""
    detail = reading.scrape.detail
    if reading.scrape.state == "down" and detail.startswith(NOTHING_LISTENS):
        member = reading.target.endpoint.member is not None
        unit = unit_name(ROUTER if member else reading.target.instance)
        detail += f" (see why: systemctl status {unit}; start it: llamanix switch)"
    return detail


def top_host(reading: HostReading) -> TopHost:
    sw = reading.switches
    return TopHost(
        host=reading.host,
        state="ok",
        detail="; ".join(reading.notes),
        generation=sw.serving,
        newest_generation=sw.newest,
        newest_verdict=sw.newest_verdict,
        switches=sw.switches if sw.any else None,
        rollbacks=sw.rollbacks if sw.any else None,
        seconds=reading.seconds,
        rows=tuple(_row(r, sw) for r in reading.instances),
    )


def top_json(hosts: list[TopHost]) -> str:
    return json.dumps({"format": TOP_FORMAT, "hosts": [h.to_json() for h in hosts]}, indent=2)


def parse_top_json(text: str) -> list[TopHost]:
    """What ``top --once --json`` printed; ValueError when it is not that."""
    data = json.loads(text)
    if not isinstance(data, dict) or data.get("format") != TOP_FORMAT:
        raise ValueError(f"not {TOP_FORMAT} output")
    hosts = data.get("hosts")
    if not isinstance(hosts, list):
        raise ValueError("no hosts list")
    return [TopHost.from_json(h, f"hosts[{i}]") for i, h in enumerate(hosts)]


def is_remote(config: Config, host: str) -> bool:
    return config.hosts[host].target is not None


def remote_top(config: Config, host: str, runner: Runner, window: float = 0.0) -> TopHost:
    """One remote host's rows, read by its own llamanix over ssh; a marked host when that
    fails (unreachable, no llamanix, no fleet copy of the config there, output not top's)."""
    try:
        rh = remote_host(config, host)
    except UserError as err:
        return TopHost(host, "error", str(err))
    if rh is None:
        kind = config.hosts[host].kind
        return TopHost(
            host,
            "error",
            f"a {kind} host is not read over ssh (only systemd and systemd-user hosts are): "
            f"run llamanix top on {host} itself",
        )
    # Through the fleet agent (one of the commands a host's sudoers line allows, as it is:
    # what it reads comes on stdin).
    request = agent_request(rh, window_s=window)
    lines: list[str] = []
    try:
        result = run_ssh(
            runner, rh.target, agent_argv(rh, "top"), lines.append, request, show=False
        )
    except ExternalCommandError as err:
        return TopHost(host, "unreachable", str(err))
    if result.returncode == SSH_FAILED:
        return TopHost(host, "unreachable", f"ssh {rh.target}: {result.last_error or 'failed'}")
    if result.returncode == EXIT_INCOMPATIBLE:
        return TopHost(
            host,
            "error",
            f"the llamanix on {rh.target} speaks another fleet protocol: install the same "
            "llamanix on both sides",
        )
    if result.returncode != 0:
        return TopHost(
            host,
            "error",
            f"llamanix top on {rh.target} exited {result.returncode}: "
            f"{result.last_error or 'no message'}",
        )
    try:
        found = parse_top_json("\n".join(ln for ln in lines if not ln.startswith(HELLO)))
    except ValueError as err:
        return TopHost(host, "error", f"{rh.target} answered something that is not top's: {err}")
    match = [h for h in found if h.host == host]
    return match[0] if match else TopHost(host, "error", f"{rh.target} did not report {host}")
