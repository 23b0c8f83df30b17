"""A host whose kind the config leaves out is NixOS by default; on this machine, that is
checked before anything acts on it, never assumed: a Debian box without a host table would
otherwise be planned and dry-run as NixOS, and its real switch would fail on a missing flake
without naming the kind that was missing."""

from __future__ import annotations

from llamanix.config.model import IMPLICIT_HOST, Config
from llamanix.core.errors import Problem, UserError
from llamanix.external.machine import is_nixos


def unstated_nixos(config: Config, host: str) -> Problem | None:
    """The problem with ``host`` when it is NixOS only by default, is this machine (no target),
    and this machine is not NixOS; None otherwise."""
    table = config.hosts[host]
    if table.kind_stated or table.kind != "nixos" or table.target is not None or is_nixos():
        return None
    if host == IMPLICIT_HOST and not config.raw.get("hosts"):
        return Problem(
            config.source,
            "hosts",
            "no [hosts.NAME] table, so the instances would run on a NixOS host 'local', and "
            "this machine is not NixOS (no /etc/NIXOS)",
            'add [hosts.box] with kind = "systemd" (or "systemd-user") and binaries = '
            '{ upstream = "/usr/local/bin/llama-server" }; llamanix init writes one',
        )
    return Problem(
        config.source,
        f"hosts.{host}.kind",
        "missing, so the host would be NixOS (the default), and this machine is not NixOS (no "
        "/etc/NIXOS)",
        'set kind = "systemd" (system units) or "systemd-user", or kind = "nixos" on a NixOS host',
    )


def refuse_unstated_nixos(config: Config, hosts: list[str] | tuple[str, ...]) -> None:
    problems = [p for p in (unstated_nixos(config, h) for h in hosts) if p is not None]
    if problems:
        raise UserError(problems)
