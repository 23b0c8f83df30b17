"""The managers that put a render on a host: NixOS (nixos-rebuild), systemd (system or user
units and systemctl), and ``llamanix up`` (a directory it watches). One protocol, so switch and
rollback do not care which one runs."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from llamanix.config.model import Config
from llamanix.core import file_reader
from llamanix.core.errors import ExternalCommandError, Problem, UserError
from llamanix.core.process_end import FAULT_SIGNALS, died_of
from llamanix.core.schema import NixosSudo
from llamanix.core.types import child_name
from llamanix.external import nix, systemctl
from llamanix.external.files import atomic_write
from llamanix.external.journalctl import read_journal
from llamanix.external.process import Runner
from llamanix.hosts.host_kind import refuse_unstated_nixos
from llamanix.render.changes import RenderFiles, diff_files, same_unit
from llamanix.render.exporter_unit import UNIT as EXPORTER_UNIT
from llamanix.render.manifest import MANIFEST, Render, unit_name
from llamanix.state.generations import (
    HostState,
    InstanceSummary,
    ManagerKind,
    ManagerRecord,
)
from llamanix.state.up_status import read_status

if TYPE_CHECKING:
    from llamanix.hosts.restarts import DrainingRestart
    from llamanix.hosts.warm import WarmCaches
    from llamanix.server.drain import Endpoint

Echo = Callable[[str], None]


def render_summary(render: Render) -> dict[str, InstanceSummary]:
    """Each instance of a typed render as a generation lists it (a router's members with the
    router's port)."""
    out = {r.name: InstanceSummary(r.variant, r.source_revision, r.port) for r in render.instances}
    if render.router is not None:
        for name in render.router.served:
            out[name] = InstanceSummary(
                render.router.member_variants.get(name), None, render.router.port
            )
    return out


def summary_of(files: RenderFiles) -> dict[str, InstanceSummary]:
    out = {name: InstanceSummary.of(e) for name, e in files.instances().items()}
    router = files.router
    if router is not None:
        for name in router.served:
            out[name] = InstanceSummary(router.variants.get(name), None, router.port)
    return out


# --- what changed, and the managers ---------------------------------------------------------


class Manager(Protocol):
    @property
    def name(self) -> ManagerKind: ...

    @property
    def reads_installed(self) -> bool:
        """Whether ``installed()`` reads the units really installed. When it does, switch and
        rollback compare them with what the current generation records (a killed command can
        leave others); when not, the manager's own tool keeps track (nixos-rebuild)."""
        ...

    @property
    def failed_activation_changes_nothing(self) -> bool:
        """Whether an ``activate()`` that raised left the previous generation serving, so a
        restore would go one generation too far (a nixos-rebuild that failed to build)."""
        ...

    @property
    def restores_the_previous_generation(self) -> bool:
        """Whether ``restore()`` goes back to the previous generation by the manager's own
        record, whatever files it is given (nixos-rebuild --rollback): a plain rollback then
        uses it in place of activating the target's files."""
        ...

    @property
    def runs_flake_packages(self) -> bool:
        """Whether the units run the flake's llama.cpp builds, so flake.lock's pins name the
        source revision of each (else the binary's own --version does)."""
        ...

    def describe(self) -> ManagerRecord: ...

    def preflight(self, runner: Runner) -> None: ...

    def installed(self) -> RenderFiles:
        """What is installed (the render's files, with their manifest where one is)."""
        ...

    def activate(
        self, runner: Runner, new: dict[str, str], old: dict[str, str], timeout_s: float
    ) -> dict[str, str]:
        """Install ``new`` in place of ``old``; returns instances known to have failed."""
        ...

    def restore(
        self, runner: Runner, old: dict[str, str], new: dict[str, str], timeout_s: float
    ) -> None: ...


def install_files(
    runner: Runner,
    dest: Path,
    new: dict[str, str],
    old: dict[str, str],
    only: Callable[[str], bool],
) -> None:
    """Write what differs (manifest last, each file atomically), then remove what went away."""
    names = sorted((n for n in new if only(n)), key=lambda n: n == MANIFEST)
    for name in (*names, *old):
        # A name from a manifest read back from disk is as untrusted as the config's.
        try:
            child_name(name)
        except ValueError as err:
            raise UserError(
                Problem(str(dest), "", f"refused to write or remove {err}", "check the manifest")
            ) from None
    for name in names:
        if new[name] != old.get(name) or not (dest / name).exists():
            if runner.dry_run:
                runner.note(f"write {dest / name}")
            else:
                atomic_write(dest / name, new[name])
    for name in sorted(n for n in old if only(n) and n not in new):
        if runner.dry_run:
            runner.note(f"remove {dest / name}")
        else:
            (dest / name).unlink(missing_ok=True)


def _is_unit(name: str) -> bool:
    return name.startswith("llamanix-") and name.endswith(".service")


def is_render_file(name: str) -> bool:
    return name == MANIFEST or _is_unit(name) or name.endswith(".argv.json")


class _InstallsFiles:
    """The answers of a manager that installs the render's files itself (systemd, up): it
    sees what is installed, a half-done activation is undone by installing the old files, and
    the units run the binaries the config names."""

    @property
    def reads_installed(self) -> bool:
        return True

    @property
    def failed_activation_changes_nothing(self) -> bool:
        return False

    @property
    def restores_the_previous_generation(self) -> bool:
        return False

    @property
    def runs_flake_packages(self) -> bool:
        return False


@dataclass
class SystemdManager(_InstallsFiles):
    """systemd (system or --user) on this machine: unit files plus systemctl."""

    units_dir: Path
    user: bool
    # Set by a switch: restart the changed servers one by one, each drained first, and
    # measure their gaps. None: restart them all with one systemctl call.
    restarts: DrainingRestart | None = None

    @property
    def name(self) -> ManagerKind:
        return "systemd-user" if self.user else "systemd"

    def describe(self) -> ManagerRecord:
        return ManagerRecord(self.name, units_dir=str(self.units_dir))

    def preflight(self, runner: Runner) -> None:
        pass

    def installed(self) -> RenderFiles:
        if not self.units_dir.is_dir():
            return RenderFiles({})
        # The exporter's unit is installed by hand, beside the render's: never the switch's.
        found = sorted(self.units_dir.glob("llamanix-*.service"))
        return RenderFiles({p.name: _unit_text(p) for p in found if p.name != EXPORTER_UNIT})

    def activate(
        self, runner: Runner, new: dict[str, str], old: dict[str, str], timeout_s: float
    ) -> dict[str, str]:
        new_u = {n: t for n, t in new.items() if _is_unit(n)}
        old_u = {n: t for n, t in old.items() if _is_unit(n)}
        removed = sorted(set(old_u) - set(new_u))
        added = sorted(set(new_u) - set(old_u))
        # A unit whose header alone changed (the config's hash) is rewritten, not restarted.
        changed = sorted(n for n in new_u if not same_unit(old_u.get(n), new_u[n]))
        systemctl.disable_now(runner, self.user, removed)
        install_files(runner, self.units_dir, new_u, old_u, _is_unit)
        systemctl.daemon_reload(runner, self.user)
        systemctl.enable(runner, self.user, added)
        systemctl.reset_failed(runner, self.user, changed)
        if runner.dry_run or self.restarts is None:
            started = systemctl.restart(runner, self.user, changed, check=False)
        else:
            started = self.restarts.restart(runner, self.user, changed)
        if not self.user and (self.units_dir / EXPORTER_UNIT).exists():
            # A system exporter has the config as a credential, a copy made when it started,
            # and its records' bind only where they existed then: it starts again to see
            # what this activation changed.
            systemctl.try_restart(runner, self.user, [EXPORTER_UNIT])
        if started or runner.dry_run:
            return {}
        return self.not_serving(changed)

    def not_serving(self, units: Sequence[str]) -> dict[str, str]:
        """{instance: why} for each unit that is not active: systemd's verdict, then the last
        line the unit itself printed (the server's own complaint, or the readiness check's)."""
        found: dict[str, str] = {}
        for unit in units:
            state = systemctl.show(self.user, unit)
            if state.serving:
                continue
            why = state.describe()
            if state.killed_by in FAULT_SIGNALS:
                # The process's own fault: its last lines say nothing of it, the signal does.
                found[unit[len("llamanix-") : -len(".service")]] = (
                    f"{why}: {died_of(state.killed_by)}"
                )
                continue
            try:
                lines = read_journal(unit, self.user, lines=20, own=True).strip().splitlines()
            except ExternalCommandError:
                lines = []
            check = [line for line in lines if line.startswith("llamanix readiness:")]
            server = [line for line in lines if not line.startswith("llamanix readiness:")]
            # The check's own complaint, unless it only saw the server exit: then the server's
            # last line says why.
            if check and "exited before serving" not in check[-1]:
                why += f": {check[-1].strip()}"
            elif server or lines:
                why += f": {(server or lines)[-1].strip()}"
            found[unit[len("llamanix-") : -len(".service")]] = why
        return found

    def restore(
        self, runner: Runner, old: dict[str, str], new: dict[str, str], timeout_s: float
    ) -> None:
        self.activate(runner, old, new, timeout_s)


@dataclass
class UpManager(_InstallsFiles):
    """A running ``llamanix up`` watching ``units_dir`` (machines and tests without systemd)."""

    units_dir: Path
    # Set by a switch with warm_switch instances: their caches are saved from the servers
    # answering at ``old`` before the new render is installed, and restored into those at
    # ``new`` once ``up`` runs it (by instance name).
    warm: WarmCaches | None = None
    old: Mapping[str, Endpoint] = field(default_factory=dict)
    new: Mapping[str, Endpoint] = field(default_factory=dict)

    @property
    def name(self) -> ManagerKind:
        return "up"

    def describe(self) -> ManagerRecord:
        return ManagerRecord(self.name, units_dir=str(self.units_dir))

    def preflight(self, runner: Runner) -> None:
        if not runner.dry_run and read_status(self.units_dir) is None:
            raise UserError(
                Problem(
                    str(self.units_dir),
                    "--manager up",
                    "no llamanix up is running for this directory",
                    "start it first: llamanix up CONFIG --host HOST",
                )
            )

    def installed(self) -> RenderFiles:
        path = self.units_dir / MANIFEST
        manifest = file_reader.text_if_present(path, source=str(path))
        if manifest is None:
            return RenderFiles({})
        found = RenderFiles.read_back({MANIFEST: manifest}, self.units_dir)
        for name, entry in found.instances().items():
            for fname in (entry.unit, f"{name}.argv.json"):
                path = self.units_dir / fname
                text = file_reader.text_if_present(path, source=str(path))
                if text is not None:
                    found.files[fname] = text
        return found

    def activate(
        self, runner: Runner, new: dict[str, str], old: dict[str, str], timeout_s: float
    ) -> dict[str, str]:
        warm = None if runner.dry_run else self.warm
        if warm is not None:
            for name in warm.plans:
                if name in self.old:
                    warm.save(name, self.old[name])
        install_files(runner, self.units_dir, new, old, is_render_file)
        if runner.dry_run:
            runner.note(f"wait for llamanix up to apply {self.units_dir / MANIFEST}")
            return {}
        failed = self.wait_applied(new, timeout_s)
        if warm is not None:
            for name in warm.plans:
                if name not in failed and name in self.new:
                    warm.restore(name, self.new[name])
        return failed

    def wait_applied(self, new: dict[str, str], timeout_s: float) -> dict[str, str]:
        """Wait until ``up`` runs exactly ``new``; returns {instance: error} for failed starts."""
        from llamanix.hosts.supervisor import load_specs

        digest = hashlib.sha256(new[MANIFEST].encode()).hexdigest()
        keys = {n: s.key for n, s in load_specs(self.units_dir).items()}
        deadline = time.monotonic() + timeout_s
        while True:
            status = read_status(self.units_dir)
            if status is None:
                raise ExternalCommandError(f"llamanix up for {self.units_dir} is gone")
            entries = {n: status.instances.get(n) for n in keys}
            if status.manifest == digest and all(
                e is not None and e.key == keys[n] and e.settled for n, e in entries.items()
            ):
                return {
                    n: e.last_error or e.state
                    for n, e in entries.items()
                    if e is not None and e.state != "running"
                }
            if time.monotonic() > deadline:
                return {
                    n: f"not serving within {timeout_s:g}s "
                    f"(state {'unknown' if e is None else e.state})"
                    for n, e in entries.items()
                    if e is None or e.state != "running"
                }
            time.sleep(0.1)

    def restore(
        self, runner: Runner, old: dict[str, str], new: dict[str, str], timeout_s: float
    ) -> None:
        self.activate(runner, old, new, timeout_s)


@dataclass
class NixosManager:
    """A NixOS host: the flake beside the config declares it; nixos-rebuild activates it."""

    flake_dir: Path
    host: str
    target: str | None
    build_host: str | None = None
    sudo: NixosSudo = "auto"

    @property
    def name(self) -> ManagerKind:
        return "nixos"

    @property
    def reads_installed(self) -> bool:
        return False  # the units live in the system closure; nixos-rebuild tracks them

    @property
    def failed_activation_changes_nothing(self) -> bool:
        # nixos-rebuild switch fails before activating when the build fails; a --rollback
        # after it would go one generation too far.
        return True

    @property
    def restores_the_previous_generation(self) -> bool:
        return True  # nixos-rebuild switch --rollback

    @property
    def runs_flake_packages(self) -> bool:
        return True

    def describe(self) -> ManagerRecord:
        return ManagerRecord(self.name, flake=str(self.flake_dir))

    def preflight(self, runner: Runner) -> None:
        if not runner.dry_run and not (self.flake_dir / "flake.nix").exists():
            raise UserError(
                Problem(
                    str(self.flake_dir),
                    "flake.nix",
                    "no flake beside the config",
                    f"keep the config in the flake that defines nixosConfigurations.{self.host}",
                )
            )

    def installed(self) -> RenderFiles:
        return RenderFiles({})

    def activate(
        self, runner: Runner, new: dict[str, str], old: dict[str, str], timeout_s: float
    ) -> dict[str, str]:
        nix.nixos_rebuild_switch(
            runner, self.flake_dir, self.host, self.target, self.build_host, self.sudo
        )
        return {}

    def restore(
        self, runner: Runner, old: dict[str, str], new: dict[str, str], timeout_s: float
    ) -> None:
        nix.nixos_rebuild_rollback(runner, self.flake_dir, self.target, self.sudo)


def as_installed(
    manager: Manager, recorded: RenderFiles, new: dict[str, str]
) -> tuple[RenderFiles, list[str]]:
    """What is really installed, in place of the files a generation records, and the
    instances where the two differ.

    A switch or rollback killed half-way can leave other units installed than ``current``
    says; activating from the recorded files would then skip the very files that differ.
    Only the files of this render and of the recorded generation count, so units of another
    config in the same directory are left alone."""
    if not manager.reads_installed:  # its own tool knows what it installed
        return recorded, []
    installed = manager.installed()
    drifted, _ = diff_files(recorded, installed)
    if not drifted:
        return recorded, []
    keep = set(recorded.files) | set(new)
    files = {**recorded.files, **{k: v for k, v in installed.files.items() if k in keep}}
    # The manifest among them is the installed one where there is one (the new render's
    # always has one, so it is kept).
    manifest = installed.manifest if MANIFEST in installed.files else recorded.manifest
    return RenderFiles(files, manifest), drifted


def _unit_text(path: Path) -> str:
    """An installed unit's text; a masked unit (a link to /dev/null, ``systemctl mask``) is
    empty, as systemd reads it, rather than a device the reader refuses."""
    if os.path.realpath(path) == os.devnull:
        return ""
    return file_reader.read_text(path, source=str(path))


def user_units_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "systemd" / "user"


def runs_under_up(config: Config, host: str) -> bool:
    """Whether ``llamanix up`` runs the host from beside the config: its last switch went
    through ``--manager up``, or a live ``up`` owns the host's default directory."""
    state = HostState.beside(Path(config.source), host)
    recorded = state.manager()
    return (recorded is not None and recorded.manager == "up") or read_status(
        state.up_dir
    ) is not None


def make_manager(
    config: Config,
    host: str,
    state: HostState,
    manager: ManagerKind | None,
    units_dir: Path | None,
) -> Manager:
    recorded = state.manager()
    kind = manager or (recorded.manager if recorded else None)
    if kind is None:
        refuse_unstated_nixos(config, [host])
        kind = config.hosts[host].kind
    if units_dir is None and recorded and recorded.manager == kind and recorded.units_dir:
        units_dir = Path(recorded.units_dir)
    target = config.hosts[host].target
    if kind == "nixos":
        table = config.hosts[host]
        # nixos-rebuild --target-host takes the destination alone (validate refuses a port).
        destination = target.destination if target else None
        return NixosManager(
            Path(config.source).resolve().parent, host, destination, table.build_host, table.sudo
        )
    if target:
        raise UserError(
            Problem(
                config.source,
                f"hosts.{host}.target",
                f"switching a remote {kind} host is not supported",
                "run llamanix switch on that machine",
            )
        )
    if kind == "up":
        return UpManager(units_dir or state.up_dir)
    if kind == "systemd-user":
        return SystemdManager(units_dir or user_units_dir(), user=True)
    return SystemdManager(units_dir or Path("/etc/systemd/system"), user=False)


def refuse_router_under_up(config: Config, host: str) -> None:
    """``llamanix up`` runs each instance's argv file and knows no router (nor gateway): say
    so rather than leave the routed members (or the gateway) silently unserved."""
    if config.gateway is not None and config.gateway.host == host:
        raise UserError(
            Problem(
                config.source,
                "gateway.host",
                "llamanix up does not run the gateway",
                "let systemd run this host (switch without --manager up)",
            )
        )
    if config.hosts[host].router is None:
        return
    raise UserError(
        Problem(
            config.source,
            f"hosts.{host}.router",
            "llamanix up does not run routers yet",
            "let systemd run this host (switch without --manager up), or leave the router out",
        )
    )


def not_serving_now(config: Config, host: str, state: HostState) -> dict[str, str]:
    """{instance: why} for the current generation's units that systemd is not running now
    (a crash loop it gave up on after StartLimitBurst, say); empty for other managers."""
    current = state.current()
    if current is None:
        return {}
    manager = make_manager(config, host, state, None, None)
    if not isinstance(manager, SystemdManager):
        return {}
    files = current.render_files()
    units = [unit_name(name) for name in files.instances()]
    routed = files.routed_members()
    if routed is not None:
        units.append(routed[0])
    try:
        return manager.not_serving(units)
    except ExternalCommandError as err:
        return {"*": f"cannot ask systemd: {err}"}
