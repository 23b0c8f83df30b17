"""Where clients reach an instance, and whether it serves: the gate's target (its own address,
or its router's and its name there), and the health check a restore or a rollback ends with."""

from __future__ import annotations

from dataclasses import dataclass

from llamanix.config.model import Config, Router
from llamanix.core.address import connect_url, is_loopback, is_wildcard, url_host
from llamanix.core.api_key import key_if_readable
from llamanix.render.units import ROUTER
from llamanix.server.drain import Endpoint
from llamanix.state.gate_records import GateResult
from llamanix.switch.gate import GateTarget, run_gate
from llamanix.switch.switch_records import Echo


def router_for(config: Config, name: str) -> Router | None:
    """The router an instance is served behind, if any."""
    router = config.hosts[config.instances[name].host].router
    return router if router is not None and name in router.members else None


def gate_url(config: Config, name: str) -> str:
    inst = config.instances[name]
    router = router_for(config, name)
    listen, port = (router.listen, router.port) if router else (inst.listen, inst.port)
    target = config.hosts[inst.host].target
    if target and (is_wildcard(listen) or is_loopback(listen)):
        # A remote host is reached by its ssh target's machine (no user, no ssh port).
        return f"http://{url_host(target.host)}:{port}"
    return connect_url(listen, port)


def gate_target(config: Config, name: str) -> GateTarget:
    """The instance as clients reach it: its own address, or its router's and its name there."""
    inst = config.instances[name]
    router = router_for(config, name)
    return GateTarget(
        name=name,
        url=gate_url(config, name),
        # Behind a router the model name picks the member (and loads it).
        alias=(inst.alias or inst.name) if router else inst.alias,
        # A remote host's key is not readable here: the chat check then reports the 401.
        api_key=key_if_readable(router.api_key_file if router else inst.api_key_file),
        speculative=inst.speculative.enabled,
        metrics=inst.metrics,
    )


def check_serving(
    config: Config | None, names: list[str], timeout_s: float, echo: Echo
) -> tuple[bool, list[GateResult]]:
    """Whether each of ``names`` answers its health check (``config``: the generation's
    config, None when nothing is to be checked)."""
    if config is None:
        return True, []
    results = [
        run_gate("health", gate_target(config, n), timeout_s)
        for n in names
        if n in config.instances
    ]
    for r in results:
        echo(f"  {r.name}: {'serving' if r.passed else 'NOT serving'} ({r.detail})")
    return all(r.passed for r in results), results


def endpoints(config: Config | None, host: str) -> dict[str, Endpoint]:
    """Where each of the host's own servers answers, as seen on the host (a switch of a
    systemd host runs there), and its router (under ``ROUTER``), which is asked about each of
    its members."""
    if config is None or host not in config.hosts:
        return {}
    router = config.hosts[host].router
    members = set(router.members) if router else set()
    found = {
        inst.name: Endpoint(connect_url(inst.listen, inst.port), key_if_readable(inst.api_key_file))
        for inst in config.instances_on(host)
        if inst.name not in members
    }
    if router is not None:
        served = tuple(
            config.instances[m].alias or m for m in router.members if m in config.instances
        )
        found[ROUTER] = Endpoint(
            connect_url(router.listen, router.port),
            key_if_readable(router.api_key_file),
            router=router.kind,
            members=served,
        )
    return found


def fence_ports(config: Config | None, host: str) -> dict[str, int]:
    """The ports other machines reach the host's servers (and its router) on: a restart fences
    them (``external.nft``). A loopback listener is reached from this machine alone."""
    if config is None or host not in config.hosts:
        return {}
    router = config.hosts[host].router
    members = set(router.members) if router else set()
    found = {
        inst.name: inst.port
        for inst in config.instances_on(host)
        if inst.name not in members and not is_loopback(inst.listen)
    }
    if router is not None and not is_loopback(router.listen):
        found[ROUTER] = router.port
    return found


@dataclass(frozen=True)
class HostServing:
    """One config's servers on a host as a restart sees them, made once per side of a switch
    (the config before it and after): where each answers on the host (``endpoints``, what
    the restart drains and watches) and the ports other machines reach (``fence``)."""

    endpoints: dict[str, Endpoint]
    fence: dict[str, int]

    @staticmethod
    def of(config: Config | None, host: str) -> HostServing:
        return HostServing(endpoints(config, host), fence_ports(config, host))


def gate_targets(config: Config | None, host: str) -> dict[str, GateTarget]:
    """The gate's target of each instance of the host (none for no config)."""
    if config is None:
        return {}
    return {inst.name: gate_target(config, inst.name) for inst in config.instances_on(host)}
