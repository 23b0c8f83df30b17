"""Where clients reach an instance, and whether it serves: the gate's target (its own address,
or its router's and its name there), and the health check a restore or a rollback ends with."""

from __future__ import annotations

from llamanix.core.address import connect_url, is_loopback, is_wildcard, url_host
from llamanix.core.api_key import key_if_readable
from llamanix.core.config import Config, Router
from llamanix.deploy.gate import GateTarget, run_gate
from llamanix.deploy.gate_records import GateResult
from llamanix.deploy.switch_records import Echo
from llamanix.measure.drain import Endpoint


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
    systemd host runs there); a router's members are reached through their router."""
    if config is None or host not in config.hosts:
        return {}
    router = config.hosts[host].router
    members = set(router.members) if router else set()
    return {
        inst.name: Endpoint(connect_url(inst.listen, inst.port), key_if_readable(inst.api_key_file))
        for inst in config.instances_on(host)
        if inst.name not in members
    }
