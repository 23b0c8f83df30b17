"""The paths a host's rendered units run or read, and the ones they will not see or cannot read.

`llamanix validate` refuses with these and `llamanix plan` warns with them; the rules are in
core.visibility, and docs/units.md says which hosts get which checks.
"""

from __future__ import annotations

from dataclasses import dataclass

from llamanix.config.model import Config
from llamanix.core.errors import Problem
from llamanix.core.visibility import (
    PathState,
    Reader,
    Role,
    Sandbox,
    finding,
    key_open_to_all,
    protect_home,
)
from llamanix.external.paths import current_reader, path_state
from llamanix.render import units
from llamanix.render.manifest import Render, RenderedInstance

LLAMANIX_FIELD = "llamanix itself"
_DYNAMIC = Reader(None)


@dataclass(frozen=True)
class UnitPath:
    field: str  # where the config names it (or LLAMANIX_FIELD)
    path: str
    role: Role


def instance_paths(config: Config, rendered: RenderedInstance) -> list[UnitPath]:
    """The binary (when given as a path), the models and the key file of one instance."""
    inst = config.instances[rendered.name]
    where = f"instances.{inst.name}"
    out: list[UnitPath] = []
    program = rendered.argv[0]
    if "/" in program:  # a bare name is looked up on the unit's PATH when it starts
        table = f"hosts.{inst.host}.binaries.{rendered.variant}"
        out.append(UnitPath(f"{where}.binary" if inst.binary else table, program, "binary"))
    out.append(UnitPath(f"{where}.model", inst.model, "model"))
    draft = inst.speculative.draft_model
    if draft:
        out.append(UnitPath(f"{where}.speculative.draft_model", draft, "model"))
    if inst.api_key_file:
        out.append(UnitPath(f"{where}.api_key_file", inst.api_key_file, "key"))
    return out


def sandbox_of(config: Config, rendered: RenderedInstance, user: bool) -> Sandbox:
    """What the unit's text says about the file system (see render_instance)."""
    inst = config.instances[rendered.name]
    return Sandbox(
        dynamic_user=not user,
        protect_home=protect_home(units.home_paths(inst, rendered.argv[0]), user),
        # System units always get a private /dev; GPU user units keep the host's.
        private_devices=not user or not rendered.gpu,
    )


def unseen_paths(config: Config, render: Render, local: bool) -> list[Problem]:
    """One problem per path a unit of ``render`` will not see or cannot use.

    ``local``: the units run on this machine, so its files are read (modes, symlinks) and
    llamanix itself is checked; otherwise only where each path is counts.
    """
    user = render.kind == "systemd-user"
    runner = current_reader() if user else _DYNAMIC
    problems: list[Problem] = []

    def check(field: str, path: str, role: Role, sandbox: Sandbox) -> bool:
        state: PathState | None = path_state(path) if local else None
        # PID 1 reads a system unit's key as root (LoadCredential=); a user manager as the user.
        reader = None if role == "key" and not user else runner
        found = finding(path, role, sandbox, state, reader)
        if found:
            problems.append(Problem(config.source, field, *found))
        return found is not None

    for rendered in (*render.instances, *units.member_entries(config, render)):
        sandbox = sandbox_of(config, rendered, user)
        for item in instance_paths(config, rendered):
            check(item.field, item.path, item.role, sandbox)
    entries = [*render.instances, *units.member_entries(config, render)]
    if local and entries:
        # The same llamanix runs every instance's readiness check: named once, by its first
        # path the unit cannot use (they share the fix).
        sandbox = sandbox_of(config, entries[0], user)
        for path in units.llamanix_paths():
            if check(LLAMANIX_FIELD, path, "llamanix", sandbox):
                break
    return list(dict.fromkeys(problems))


def key_files(config: Config) -> list[tuple[str, str, str]]:
    """(field, path, host) of every key file the config names: instances', routers' and the
    gateway's."""
    out: list[tuple[str, str, str]] = []
    for name, host in config.hosts.items():
        if host.router is not None and host.router.api_key_file:
            out.append((f"hosts.{name}.router.api_key_file", host.router.api_key_file, name))
    for inst in config.instances.values():
        if inst.api_key_file:
            out.append((f"instances.{inst.name}.api_key_file", inst.api_key_file, inst.host))
    if config.gateway is not None:
        gateway = config.gateway
        out.append(("gateway.api_key_file", gateway.api_key_file, gateway.host))
    return out


def open_key_files(
    config: Config, fields: list[tuple[str, str, str]] | None = None
) -> list[Problem]:
    """One warning per key file of a host on this machine (no ``target``) that every user here
    can read (``fields``: of ``key_files``, all of them when None)."""
    found: list[Problem] = []
    for field, path, host in key_files(config) if fields is None else fields:
        if config.hosts[host].target is not None:
            continue
        exposed = key_open_to_all(path, path_state(path))
        if exposed is not None:
            found.append(Problem(config.source, field, *exposed))
    return list(dict.fromkeys(found))
