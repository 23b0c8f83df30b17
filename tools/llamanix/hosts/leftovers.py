"""What a switch that did not finish leaves behind, how ``doctor`` names it, and how the next
command removes it (docs/switching.md, "Crash consistency").

A switch killed in the middle of a restart (SIGKILL, the OOM killer, a reboot of the machine
that ran it over ssh) can leave, on this machine:

- with the units (``look_machine``): a fence or a redirect (nftables tables, ``external.nft``),
  a blue-green bridge (its runtime unit, running or not, and its unit file in /run) and the
  bridge's state and cache directories, and warm-switch slot files in the instances' state
  directories;
- in the host's state (``look_host``): a generation's staging directory, an atomic write's
  temporary file, a generation whose gate is still "pending", and units other than the current
  generation's: a unit file the killed switch installed, or a unit of the current generation
  that does not run (stopped for a restart that never came).

``llamanix doctor`` lists each (``leftovers`` check); the next ``switch`` or ``rollback``
removes what is on the machine and in the state before it changes anything, and ``llamanix
tidy`` removes all of it and then makes the host serve its current generation again. Every
look that asks a tool (nft, systemctl) and gets no answer is an error, never "nothing there".
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from llamanix.config.model import Config
from llamanix.external import nft, systemctl
from llamanix.external.process import Runner
from llamanix.hosts.blue_green import RUNTIME_UNITS, SUFFIX
from llamanix.hosts.managers import Manager, NixosManager, SystemdManager, UpManager, make_manager
from llamanix.hosts.restarts import instance_of
from llamanix.hosts.warm import FILE_PREFIX
from llamanix.render.changes import RenderFiles, diff_files
from llamanix.render.manifest import unit_name
from llamanix.state.generations import Generation, HostState, ManagerKind

Echo = Callable[[str], None]

LeftoverKind = Literal[
    "fence",
    "redirect",
    "bridge",
    "bridge-files",
    "slot-files",
    "staging",
    "temporary-file",
    "pending",
    "unit-differs",
    "unit-not-running",
]
LEFTOVER_KINDS: tuple[LeftoverKind, ...] = get_args(LeftoverKind)
# What scope of this machine a host's units are: system units (root: with them the nftables
# fences and redirects, the blue-green bridges under /run and the state under /var/lib), a
# user's units, a `llamanix up` directory, or NixOS (nixos-rebuild keeps its own record).
ScopeKind = Literal["system", "user", "up", "nixos"]
BRIDGE_PATTERN = f"llamanix-*{SUFFIX}.service"
# Where systemd keeps system units' state and cache (with DynamicUser=, under private/).
SYSTEM_STATE = (Path("/var/lib"), Path("/var/cache"))


@dataclass(frozen=True)
class Leftover:
    """One thing a switch that did not finish left: what it is, in words, and what it is about
    (a port, a unit, a path; ``instance`` where it is one instance's)."""

    kind: LeftoverKind
    what: str
    about: str
    instance: str | None = None


@dataclass(frozen=True)
class Scope:
    """The units a host's manager writes on this machine."""

    units_dir: Path
    kind: ScopeKind

    def state_bases(self) -> list[Path]:
        """Where the instances' state directories (``llamanix-NAME``) are."""
        if self.kind == "system":
            return [Path("/var/lib"), Path("/var/lib/private")]
        if self.kind == "user":
            base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
            return [Path(base)]
        if self.kind == "up":
            return [self.units_dir / "state"]
        return []


def scope_of(manager: Manager) -> Scope:
    if isinstance(manager, SystemdManager):
        return Scope(manager.units_dir, "user" if manager.user else "system")
    if isinstance(manager, UpManager):
        return Scope(manager.units_dir, "up")
    return Scope(Path("/etc/systemd/system"), "nixos")


def local_scope(
    path: Path,
    config: Config,
    host: str,
    manager: ManagerKind | None = None,
    units_dir: Path | None = None,
) -> Scope | None:
    """The units on this machine that switching ``host`` changes; None when it changes
    another machine's (a ``target``: its own llamanix, or nixos-rebuild, switches there)."""
    if config.hosts[host].target is not None:
        return None
    return scope_of(make_manager(config, host, HostState.beside(path, host), manager, units_dir))


@dataclass
class Look:
    """What a look found, and what it could not look at (and why)."""

    found: list[Leftover] = field(default_factory=list)
    unlooked: list[str] = field(default_factory=list)


# --- the machine: nftables, bridges, slot files ---------------------------------------------


def _bridges(scope: Scope) -> list[tuple[str, str]]:
    """(unit, its state in words) of each blue-green bridge systemd has, or whose unit file is
    in /run; a unit of the units directory itself (an instance named ``*-bridge``) is none."""
    own = {p.name for p in scope.units_dir.glob(BRIDGE_PATTERN)}
    found: dict[str, str] = {}
    for unit in systemctl.list_units(False, BRIDGE_PATTERN):
        if unit.unit in own:
            continue
        if unit.active_state != "inactive":
            found[unit.unit] = f"{unit.active_state} ({unit.sub_state})"
    for path in sorted(Path(RUNTIME_UNITS).glob(BRIDGE_PATTERN)):
        if path.name not in own:
            said = found.get(path.name)
            found[path.name] = f"{said}, " if said else ""
            found[path.name] += f"its unit file {path}"
    return sorted(found.items())


def _bridge_directories(scope: Scope) -> list[Path]:
    own = {p.name.removesuffix(".service") for p in scope.units_dir.glob(BRIDGE_PATTERN)}
    found: list[Path] = []
    for base in SYSTEM_STATE:
        for parent in (base, base / "private"):
            for path in sorted(parent.glob(f"llamanix-*{SUFFIX}")):
                if path.name not in own and (path.is_dir() or path.is_symlink()):
                    found.append(path)
    return found


def _slot_files(scope: Scope) -> list[Path]:
    seen: set[Path] = set()
    found: list[Path] = []
    for base in scope.state_bases():
        for directory in sorted(base.glob("llamanix-*")):
            real = directory.resolve()
            if real in seen or not real.is_dir():
                continue
            seen.add(real)
            found.extend(sorted(real.glob(f"{FILE_PREFIX}*.bin")))
    return found


def _unreadable(scope: Scope) -> list[str]:
    """The places of ``scope`` this process cannot list (system units' private state, for a
    user): what is there is unknown, not absent."""
    if scope.kind != "system":
        return []
    return [
        str(p)
        for base in SYSTEM_STATE
        if (p := base / "private").is_dir() and not os.access(p, os.R_OK | os.X_OK)
    ]


def look_machine(scope: Scope) -> Look:
    """What switches that did not finish left with ``scope``'s units.
    ``ExternalCommandError`` when nft or systemctl fails to say what is there."""
    look = Look()
    if scope.kind == "system":
        why = nft.unavailable()
        if why is not None:
            look.unlooked.append(f"fences and redirects ({why})")
        else:
            for port in nft.fenced_ports():
                what = f"a fence on port {port} (nft table inet {nft.table_of(port)})"
                look.found.append(Leftover("fence", what, str(port)))
            for port in nft.redirected_ports():
                table = nft.redirect_table(port)
                what = f"a blue-green redirect table for port {port} (nft table inet {table})"
                look.found.append(Leftover("redirect", what, str(port)))
        for unit, state in _bridges(scope):
            what = f"the blue-green bridge {unit}: {state}"
            look.found.append(Leftover("bridge", what, unit))
        for path in _bridge_directories(scope):
            look.found.append(Leftover("bridge-files", f"the bridge's directory {path}", str(path)))
    for path in _slot_files(scope):
        what = f"the warm switch's slot file {path}"
        look.found.append(Leftover("slot-files", what, str(path)))
    unreadable = _unreadable(scope)
    if unreadable:
        look.unlooked.append(
            f"bridge directories and slot files in {', '.join(unreadable)} (root's alone)"
        )
    return look


def tidy_machine(scope: Scope, runner: Runner) -> list[str]:
    """Remove what switches that did not finish left with ``scope``'s units; one line for each
    thing removed. The caller holds the units' lock (``host_lock.units_lock``): no switch is
    under way that these could be the tools of."""
    done: list[str] = []
    look = look_machine(scope)
    reload = False
    # The redirects and fences first: then new connections reach the unit's own port, not a
    # bridge about to go.
    for item in look.found:
        if item.kind == "fence":
            nft.unfence(int(item.about))
            done.append(f"lifted the fence a killed switch left on port {item.about}")
        elif item.kind == "redirect":
            nft.untrack(int(item.about))
            done.append(f"ended the redirect a killed switch left on port {item.about}")
    for item in look.found:
        if item.kind == "bridge":
            systemctl.stop(runner, False, [item.about])
            systemctl.reset_failed(runner, False, [item.about])
            path = Path(RUNTIME_UNITS) / item.about
            if path.exists():
                path.unlink()
                reload = True
            done.append(f"stopped the blue-green bridge a killed switch left ({item.about})")
    if reload:
        systemctl.daemon_reload(runner, False)
    for item in look.found:
        if item.kind == "bridge-files":
            path = Path(item.about)
            if path.is_symlink():
                path.unlink()
            else:
                shutil.rmtree(path, ignore_errors=True)
            done.append(f"removed {path}, a bridge's directory a killed switch left")
        elif item.kind == "slot-files":
            Path(item.about).unlink(missing_ok=True)
            done.append(f"removed {item.about}, a slot file a killed switch never restored")
    return done


# --- the host's state and units -------------------------------------------------------------


def _temporary_files(state: HostState, config_path: Path) -> list[Path]:
    folders = [state.root, state.bench_dir, *(g.path for g in state.generations())]
    found = [
        tmp
        for folder in folders
        if folder.is_dir()
        for tmp in sorted(folder.glob(".*.tmp"))
        if tmp.is_file()
    ]
    # The config's own atomic write (``.NAME.RANDOM.tmp`` beside it).
    found += sorted(p for p in config_path.parent.glob(f".{config_path.name}.*.tmp") if p.is_file())
    return found


def _units_of(files: RenderFiles) -> list[str]:
    units = [unit_name(name) for name in files.instances()]
    routed = files.routed_members()
    if routed is not None:
        units.append(routed[0])
    return units


def _unrecorded(
    state: HostState, current: RenderFiles, number: int, installed: RenderFiles
) -> list[str]:
    """Instances whose unit is installed, which the current generation (``current``, number
    ``number``) does not have and a newer one (a switch that did not finish) added."""
    recorded = set(current.instances())
    added: set[str] = set()
    for gen in state.generations():
        if gen.number > number:
            added |= set(gen.render_files().instances()) - recorded
    there = set(installed.instances())
    return sorted(added & there)


def look_host(state: HostState, config_path: Path, manager: Manager) -> Look:
    """What switches of this host that did not finish left in its state and its units.
    ``ExternalCommandError`` when systemctl fails to say how a unit is."""
    look = Look()
    if state.generations_dir.is_dir():
        for staging in sorted(state.generations_dir.glob(".*.tmp")):
            what = f"{staging}, a generation a killed switch never finished"
            look.found.append(Leftover("staging", what, str(staging)))
    for tmp in _temporary_files(state, config_path):
        what = f"{tmp}, the temporary file of a write that was killed"
        look.found.append(Leftover("temporary-file", what, str(tmp)))
    for gen in state.generations():
        if gen.outcome == "pending":
            what = f"generation {gen.number}, whose switch was killed before its gate finished"
            look.found.append(Leftover("pending", what, str(gen.number)))
    current = state.current()
    if current is None or not manager.reads_installed:
        return look
    recorded = current.render_files()
    installed = manager.installed()
    changed, _ = diff_files(recorded, installed)
    for name in changed:
        unit = unit_name(name)
        said = "is missing" if unit not in installed.files else "differs from the generation's"
        what = f"{unit} {said} (generation {current.number} is current)"
        look.found.append(Leftover("unit-differs", what, unit, name))
    for name in _unrecorded(state, recorded, current.number, installed):
        unit = unit_name(name)
        what = f"{unit} is installed, and generation {current.number} (current) has no {name}"
        look.found.append(Leftover("unit-differs", what, unit, name))
    if isinstance(manager, SystemdManager):
        units = [u for u in _units_of(recorded) if u in installed.files]
        for name, why in sorted(manager.not_serving(units).items()):
            what = f"{unit_name(name)} of generation {current.number} does not run: {why}"
            look.found.append(Leftover("unit-not-running", what, unit_name(name), name))
    return look


def tidy_host(state: HostState, config_path: Path) -> list[str]:
    """Remove what switches of this host that did not finish left in its state (the caller
    holds the host's lock); one line for each thing done."""
    notes = state.recover()
    for tmp in sorted(
        p for p in config_path.parent.glob(f".{config_path.name}.*.tmp") if p.is_file()
    ):
        tmp.unlink(missing_ok=True)
        notes.append(f"removed {tmp}, the temporary file of a config write that was killed")
    return notes


@dataclass(frozen=True)
class Restored:
    """What ``restore_current`` did: the units it wrote back or started, and the instances to
    check (those it touched)."""

    generation: Generation | None
    touched: tuple[str, ...] = ()
    lines: tuple[str, ...] = ()


def restore_current(
    state: HostState, manager: Manager, runner: Runner, timeout_s: float
) -> Restored:
    """Make the units the current generation's again, and running: those a killed switch
    installed are written back (and restarted), units it added are removed, and units of the
    generation that do not run are started."""
    current = state.current()
    if current is None:
        return Restored(None, (), ("no generation is recorded: nothing to serve",))
    if isinstance(manager, NixosManager) or not manager.reads_installed:
        return Restored(current, (), ("nixos-rebuild keeps the system's units itself",))
    recorded = current.render_files()
    installed = manager.installed()
    changed, _ = diff_files(recorded, installed)
    added = _unrecorded(state, recorded, current.number, installed)
    lines: list[str] = []
    if changed or added:
        mine = set(recorded.instances()) | set(added)
        if isinstance(manager, SystemdManager):
            # Only this host's units: another config's in the same directory are left alone.
            old = {u: t for u, t in installed.files.items() if instance_of(u) in mine}
        else:
            old = installed.files
        failed = manager.activate(runner, recorded.files, old, timeout_s)
        lines.append(
            f"wrote back generation {current.number}'s units: "
            + ", ".join(unit_name(n) for n in [*changed, *added])
        )
        if failed:
            lines.append(f"did not start: {failed}")
    started: list[str] = []
    if isinstance(manager, SystemdManager):
        units = _units_of(recorded)
        down = manager.not_serving(units)
        if down:
            started = [unit_name(n) for n in sorted(down)]
            systemctl.reset_failed(runner, manager.user, started)
            systemctl.restart(runner, manager.user, started, check=False)
            lines.append(f"started {', '.join(started)}, which did not run")
    touched = sorted(set(changed) | {instance_of(u) for u in started})
    return Restored(current, tuple(touched), tuple(lines))
