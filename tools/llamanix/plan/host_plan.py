"""What ``llamanix plan`` shows, as records: per host, a row for each instance (with its VRAM fit
and decode ceiling), the router's plan, and the table that prints them. ``plan/plan.py``
computes them; ``to_json`` is ``plan --json``, key for key."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar, TextIO

from llamanix.config.drift import FieldDrift
from llamanix.core.json_codec import JSON_SKIP, JsonRecord, JsonShape, json_key, json_via
from llamanix.core.json_value import JsonObject
from llamanix.core.schema import GatewayKind, HostKind, RouterKind
from llamanix.core.text_table import box_table, print_lines, style, styled

GIB = 2**30
COLUMNS = ("instance", "variant", "address", "speculative", "fit / ceiling", "exposure")
# systemd-analyze --offline scores any unit as a system service running as root; user units
# run unprivileged, so their score reads worse than it is.
USER_UNITS_NOTE = "user units are scored as if they ran as root (systemd-analyze --offline)"


@dataclass(frozen=True)
class VramFit(JsonRecord):
    """What the instance needs of the host's GPU, and the decode speed the GPU's memory
    bandwidth allows at most."""

    gpu: str
    vram_bytes: int
    gpu_memory_bytes: int
    ceiling_tok_s: float

    @property
    def fits(self) -> bool:
        return self.vram_bytes <= self.gpu_memory_bytes

    def summary(self) -> str:
        used, total = self.vram_bytes / GIB, self.gpu_memory_bytes / GIB
        verdict = "fits" if self.fits else "DOES NOT FIT"
        return f"{verdict} {used:.1f}/{total:.0f} GiB, <= {self.ceiling_tok_s:.0f} tok/s"

    # ``fits`` follows from the fields.
    json_shape: ClassVar[JsonShape] = JsonShape(
        computed={"fits": lambda f: f.fits},
        order=("gpu", "vram_bytes", "gpu_memory_bytes", "fits", "ceiling_tok_s"),
    )


@dataclass(frozen=True)
class UnreadableModel(JsonRecord):
    """The host names a GPU, but a model file of the instance cannot be read here."""

    gpu: str
    error: str  # the reader's problem, one line

    def summary(self) -> str:
        return "model not readable"


Fit = VramFit | UnreadableModel


@dataclass(frozen=True)
class InstanceRow(JsonRecord):
    """One instance as the host would run it. The fit is written twice: as its figures
    (``vram``) and as its one line (``fit``)."""

    name: str
    variant: str
    pinned_revision: str | None  # the flake.lock pin of the variant's source, when there is one
    address: str  # where clients reach it: its own address, or its router's and its name there
    speculative: str  # one line, the whole chain ("ngram-mod n_max=16 then mtp"); "none" when off
    speculative_types: tuple[str, ...]  # the chain's types in order; ("none",) when off
    argv: tuple[str, ...]
    unit: str
    gpu: bool
    security_exposure: float | None  # systemd-analyze's score; None when not measured
    warnings: tuple[str, ...]
    drift: tuple[FieldDrift, ...] | None  # from the --previous build; None without both probes
    fit: Fit | None = field(metadata=json_key("vram"))  # None when the host names no GPU

    json_shape: ClassVar[JsonShape] = JsonShape(
        computed={"fit": lambda r: None if r.fit is None else r.fit.summary()}
    )


@dataclass(frozen=True)
class RouterPlan(JsonRecord):
    """The host's router: its endpoint, which members stay loaded together and which take
    turns, and why."""

    kind: RouterKind
    address: str
    members: Mapping[str, str]  # member instance -> the model name clients ask for
    resident: tuple[str, ...]
    take_turns: tuple[str, ...]
    max_loaded: int
    reason: str
    too_big: tuple[str, ...]


@dataclass(frozen=True)
class Replica(JsonRecord):
    """One instance as the gateway reaches it."""

    instance: str
    host: str
    api_base: str


@dataclass(frozen=True)
class GatewayPlan(JsonRecord):
    """The one endpoint in front of every host: where it runs and listens, how it routes, and
    each model group (the name clients ask for) with its replicas."""

    kind: GatewayKind
    host: str
    address: str  # listen:port
    version: str
    routing_strategy: str
    retries: int
    health_check_interval: int
    groups: Mapping[str, tuple[Replica, ...]]

    def lines(self) -> list[str]:
        out = [
            f"gateway {self.kind} {self.version} on host {self.host}, {self.address} "
            f"({self.routing_strategy}, {self.retries} retries, health checks every "
            f"{self.health_check_interval} s)"
        ]
        for group, replicas in self.groups.items():
            shown = ", ".join(f"{r.instance} on {r.host} ({r.api_base})" for r in replicas)
            out.append(f"  {group}: {shown}")
        return out


def _hosts_json(hosts: tuple[HostPlan, ...]) -> JsonObject:
    return {h.name: h.to_json() for h in hosts}


@dataclass(frozen=True)
class HostPlan(JsonRecord):
    """One host's plan; its name is the key its plan is kept under, and its note follows from
    its kind."""

    name: str = field(metadata=JSON_SKIP)
    kind: HostKind
    instances: tuple[InstanceRow, ...]
    unseen_paths: tuple[str, ...]  # what validate refuses; a plan shows them as warnings
    router: RouterPlan | None

    @property
    def security_note(self) -> str | None:
        return USER_UNITS_NOTE if self.kind == "systemd-user" else None

    json_shape: ClassVar[JsonShape] = JsonShape(
        computed={"security_note": lambda h: h.security_note}, omit_none=("security_note",)
    )


@dataclass(frozen=True)
class Plan(JsonRecord):
    config: str  # the config file, as given
    # Written as an object by host name.
    hosts: tuple[HostPlan, ...] = field(metadata=json_via(_hosts_json))
    gateway: GatewayPlan | None = None  # None: no gateway, or not on the host asked for


def print_plan(plan: Plan, out: TextIO | None = None) -> None:
    """The plan as ``llamanix plan`` prints it, host after host."""
    out = out or sys.stdout
    colour = styled(out)
    for host in plan.hosts:
        print_lines(host_lines(host, colour), out)
    if plan.gateway is not None:
        print_lines(plan.gateway.lines(), out)


def host_lines(host: HostPlan, colour: bool = False) -> list[str]:
    """One host: the table of its instances, its router, what it will not see, then each
    instance's command line with its warnings and drift."""
    warning = style("warning", "33", colour)
    rows = [
        (
            row.name,
            row.variant + (f" @{row.pinned_revision[:7]}" if row.pinned_revision else ""),
            row.address,
            row.speculative,
            "-" if row.fit is None else row.fit.summary(),
            "-" if row.security_exposure is None else f"{row.security_exposure:.1f}",
        )
        for row in host.instances
    ]
    out = box_table(f"host {host.name} ({host.kind})", COLUMNS, rows, colour)
    if (router := host.router) is not None:
        out += _router_lines(router)
    # What validate refuses: a plan still shows what would run, with these on top.
    out += [f"{warning}: {line}" for line in host.unseen_paths]
    for row in host.instances:
        out.append(f"{style(row.name, '1', colour)}: {shlex.join(row.argv)}")
        out += [f"  {warning}: {w}" for w in row.warnings]
        if row.drift is not None:
            count = "none" if not row.drift else f"{len(row.drift)} field(s)"
            out.append(f"  drift from --previous: {count}")
            out += [f"    {d.line()}" for d in row.drift]
    return out


def _router_lines(router: RouterPlan) -> list[str]:
    members = ", ".join(f"{m} as '{served}'" for m, served in router.members.items())
    out = [f"router {router.kind} on {router.address}: {members}"]
    if router.resident:
        out.append(f"  loaded together: {', '.join(router.resident)}")
    if router.take_turns:
        out.append(f"  take turns, one at a time: {', '.join(router.take_turns)}")
    out.append(f"  why: {router.reason} (at most {router.max_loaded} loaded)")
    return out
