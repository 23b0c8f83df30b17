"""The exporter's unit (``llamanix-exporter.service``), rendered beside a host's instances when
the config has a ``[metrics]`` table: ``llamanix metrics CONFIG --host HOST`` under the same
sandbox as the instances, less what a Python HTTP server does not need.

A system unit runs as a dynamic user with no capabilities: PID 1 hands it what it reads that
only root may, the config and each instance's key as credentials and the host's generation
records in a read-only bind, so it reads neither more nor less than these, wherever they are
kept (the fleet agent keeps its copy in a 0700 directory). A user unit runs as the user, who
reads them all. It listens on ``[metrics] listen``; its IP filter lets in the networks of that
address and the instances it reads, and nothing else.
"""

from __future__ import annotations

from pathlib import Path

from llamanix.config.model import Config
from llamanix.core.address import connect_host, is_loopback, is_wildcard
from llamanix.core.state_dir import host_state_root
from llamanix.core.visibility import protect_home
from llamanix.render import systemd
from llamanix.render.manifest import unit_name
from llamanix.render.prometheus import metrics_of
from llamanix.render.unit_templates import unit_template
from llamanix.render.units import config_hash, ip_allow_list, llamanix_command

NAME = "exporter"
UNIT = unit_name(NAME)
# Whose key opens a router's members: the router's.
ROUTER_KEY = "router"
# Where a system unit's exporter finds the host's generation records: a read-only bind of
# .llamanix-state/HOST, which PID 1 makes whatever the modes of the directories above it.
STATE_BIND = "/run/llamanix-exporter/state"


def config_credential(source: str) -> str:
    """The credential the config is handed in: its suffix kept, which says how to parse it."""
    return "config" + (Path(source).suffix or ".toml")


def key_credential(owner: str) -> str:
    """The credential an instance's key (or a router's, owner "router") is handed in; the
    exporter looks for it there (observe.metrics_targets)."""
    return f"key-{owner}"


def _credentials(config: Config, host: str, source: str | None) -> list[systemd.UnitText]:
    lines = []
    if source is not None:
        lines.append(systemd.credential_path(config_credential(source), source))
    router = config.hosts[host].router
    if router is not None and router.api_key_file:
        lines.append(systemd.credential_path(key_credential(ROUTER_KEY), router.api_key_file))
    members = router.members if router is not None else ()
    for inst in sorted(config.instances_on(host), key=lambda i: i.name):
        if inst.name not in members and inst.api_key_file:
            lines.append(systemd.credential_path(key_credential(inst.name), inst.api_key_file))
    return lines


def _ip_allow(config: Config, host: str) -> tuple[str, ...] | None:
    """Who may talk to the exporter, and whom it talks to: the listen address's networks, and
    each instance (or router) address that is not loopback; None (no filter) when one of
    them is public."""
    metrics = metrics_of(config)
    allowed = ip_allow_list(metrics.listen)
    if allowed is None:
        return None
    out = list(allowed)
    router = config.hosts[host].router
    listens = [i.listen for i in config.instances_on(host)]
    if router is not None:
        listens.append(router.listen)
    for listen in listens:
        if is_loopback(listen) or is_wildcard(listen):
            continue
        more = ip_allow_list(listen)
        if more is None:
            return None
        address = connect_host(listen)
        out += [address] if address not in out else []
    return tuple(dict.fromkeys(out))


def render_exporter(config: Config, host: str, user: bool) -> str:
    """The exporter unit's text for ``host``."""
    metrics = metrics_of(config)
    source = str(Path(config.source).absolute())
    if user:
        exec_start = systemd.exec_line([*llamanix_command(), "metrics", source, "--host", host])
        binds = []
    else:
        # %d: the unit's credentials directory, where systemd puts the config it read as root.
        credential = f"%d/{config_credential(source)}"
        exec_start = systemd.exec_line(
            [*llamanix_command(), "metrics", credential, "--host", host, "--state-dir", STATE_BIND],
            keep=[credential],
        )
        # Optional: a host never switched has no records yet (its first switch restarts it).
        binds = [systemd.bind_path(str(host_state_root(Path(source), host)), STATE_BIND)]
    paths = [source, llamanix_command()[0]]
    if config.hosts[host].gpu is not None:
        # The ceiling is computed from the model files' headers.
        paths += [i.model for i in config.instances_on(host)]
    return unit_template("exporter.service.j2").render(
        source=systemd.comment(Path(config.source).name),
        config_hash=config_hash(config)[:19],
        host=host,
        exec_start=exec_start,
        credentials=_credentials(config, host, None if user else source),
        binds=binds,
        user=user,
        protect_home=protect_home(paths, user),
        ip_allow=_ip_allow(config, host),
        network_online=not is_loopback(metrics.listen),
        wanted_by="default.target" if user else "multi-user.target",
    )
