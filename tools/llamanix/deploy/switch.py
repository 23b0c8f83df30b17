"""switch, rollback and pin: change what a host runs, gate it, and undo it when the gate fails.

A switch renders the changed config in memory (a bad value stops it before anything is
written), records the render as a new numbered generation, writes the config atomically, hands
the render to the host's manager (nixos-rebuild, systemctl, or a running ``llamanix up``), and
runs the gate against every instance that changed. If the gate fails, the config goes back, the
manager restores the previous generation, and the previous instances are checked over HTTP
before the switch reports failure (exit 1).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import tomlkit
import tomlkit.exceptions

from llamanix.core.config import Config, parse_config, suggest
from llamanix.core.errors import ExternalCommandError, Problem, UserError
from llamanix.core.probe import commit_of
from llamanix.core.variants import VARIANTS
from llamanix.deploy.gate import GATES, GateResult, GateTarget, Thresholds, run_gate
from llamanix.deploy.generations import Generation, HostState, now
from llamanix.deploy.supervisor import SETTLED, load_specs, read_status
from llamanix.external import nix, systemctl
from llamanix.external.files import atomic_write
from llamanix.external.llama_server import binary_version_line
from llamanix.external.process import Runner
from llamanix.render.units import MANIFEST, Render, pick_host, render_host

MANAGERS = ("nixos", "systemd", "systemd-user", "up")
Echo = Callable[[str], None]

# --- config edits ----------------------------------------------------------------------------


def _parse_value(text: str) -> Any:
    """A TOML value (3, 0.75, true, "x", ["a"]); anything else is taken as a bare string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_sets(path: Path, text: str, sets: tuple[str, ...]) -> str:
    """The config text with each ``KEY.PATH=VALUE`` applied (comments and layout kept)."""
    if not sets:
        return text
    edits: list[tuple[list[str], Any]] = []
    for item in sets:
        key, sep, value = item.partition("=")
        parts = key.strip().split(".")
        if not sep or not all(parts):
            raise UserError(
                Problem(
                    str(path),
                    "--set",
                    f"'{item}' is not KEY=VALUE",
                    "write e.g. --set instances.qwen.variant=ik",
                )
            )
        edits.append((parts, _parse_value(value.strip())))
    if path.suffix == ".json":
        data = json.loads(text)
        for parts, value in edits:
            _assign(data, parts, value, path)
        return json.dumps(data, indent=2) + "\n"
    try:
        doc = tomlkit.parse(text)
    except tomlkit.exceptions.ParseError as err:
        raise UserError(Problem(str(path), "", f"TOML syntax error: {err}")) from None
    for parts, value in edits:
        _assign(doc, parts, value, path)
    return tomlkit.dumps(doc)


def _assign(container: Any, parts: list[str], value: Any, path: Path) -> None:
    node = container
    for i, part in enumerate(parts[:-1]):
        if part not in node:
            node[part] = tomlkit.table() if not isinstance(container, dict) else {}
        node = node[part]
        if not hasattr(node, "__setitem__") or isinstance(node, str | list):
            where = ".".join(parts[: i + 1])
            raise UserError(
                Problem(
                    str(path),
                    "--set",
                    f"{where} is not a table",
                    "set a key inside a table, e.g. instances.NAME.KEY=VALUE",
                )
            )
    node[parts[-1]] = value


def parse_text(path: Path, text: str) -> Config:
    """Validate a (changed) config text as if it were the file."""
    try:
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as err:
        raise UserError(Problem(str(path), "", f"syntax error: {err}")) from None
    return parse_config(data, str(path))


def read_config_text(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        raise UserError(Problem(str(path), "", "no such file", "check the path")) from None


# --- what changed ----------------------------------------------------------------------------


def manifest_instances(files: dict[str, str]) -> dict[str, dict[str, Any]]:
    if MANIFEST not in files:
        # A bare set of installed units (no manifest): one entry per unit file.
        return {
            n[len("llamanix-") : -len(".service")]: {"unit": n}
            for n in files
            if n.startswith("llamanix-") and n.endswith(".service")
        }
    data = json.loads(files[MANIFEST])
    instances = data.get("instances", {})
    return instances if isinstance(instances, dict) else {}


def diff_instances(new: dict[str, str], old: dict[str, str]) -> tuple[list[str], list[str]]:
    """(changed or added, removed) instance names."""
    new_i, old_i = manifest_instances(new), manifest_instances(old)
    changed = []
    for name, entry in new_i.items():
        unit, argv = entry["unit"], f"{name}.argv.json"
        if (
            name not in old_i
            or new.get(unit) != old.get(unit)
            or (argv in old and new.get(argv) != old.get(argv))
        ):
            changed.append(name)
    return sorted(changed), sorted(set(old_i) - set(new_i))


def summary_of(files: dict[str, str]) -> dict[str, dict[str, Any]]:
    return {
        name: {
            "variant": e.get("variant"),
            "source_revision": e.get("source_revision"),
            "port": e.get("port"),
        }
        for name, e in manifest_instances(files).items()
    }


# --- managers --------------------------------------------------------------------------------


class Manager(Protocol):
    @property
    def name(self) -> str: ...

    def describe(self) -> dict[str, str]: ...

    def preflight(self, runner: Runner) -> None: ...

    def installed(self) -> dict[str, str]: ...

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


@dataclass
class SystemdManager:
    """systemd (system or --user) on this machine: unit files plus systemctl."""

    units_dir: Path
    user: bool

    @property
    def name(self) -> str:
        return "systemd-user" if self.user else "systemd"

    def describe(self) -> dict[str, str]:
        return {"manager": self.name, "units_dir": str(self.units_dir)}

    def preflight(self, runner: Runner) -> None:
        pass

    def installed(self) -> dict[str, str]:
        if not self.units_dir.is_dir():
            return {}
        return {p.name: p.read_text() for p in sorted(self.units_dir.glob("llamanix-*.service"))}

    def activate(
        self, runner: Runner, new: dict[str, str], old: dict[str, str], timeout_s: float
    ) -> dict[str, str]:
        new_u = {n: t for n, t in new.items() if _is_unit(n)}
        old_u = {n: t for n, t in old.items() if _is_unit(n)}
        removed = sorted(set(old_u) - set(new_u))
        added = sorted(set(new_u) - set(old_u))
        changed = sorted(n for n in new_u if old_u.get(n) != new_u[n])
        systemctl.disable_now(runner, self.user, removed)
        install_files(runner, self.units_dir, new_u, old_u, _is_unit)
        systemctl.daemon_reload(runner, self.user)
        systemctl.enable(runner, self.user, added)
        systemctl.restart(runner, self.user, changed)
        return {}

    def restore(
        self, runner: Runner, old: dict[str, str], new: dict[str, str], timeout_s: float
    ) -> None:
        self.activate(runner, old, new, timeout_s)


@dataclass
class UpManager:
    """A running ``llamanix up`` watching ``units_dir`` (machines and tests without systemd)."""

    units_dir: Path
    name: str = "up"

    def describe(self) -> dict[str, str]:
        return {"manager": self.name, "units_dir": str(self.units_dir)}

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

    def installed(self) -> dict[str, str]:
        try:
            manifest = (self.units_dir / MANIFEST).read_text()
        except FileNotFoundError:
            return {}
        files = {MANIFEST: manifest}
        for name, entry in manifest_instances(files).items():
            for fname in (entry["unit"], f"{name}.argv.json"):
                if (self.units_dir / fname).exists():
                    files[fname] = (self.units_dir / fname).read_text()
        return files

    def activate(
        self, runner: Runner, new: dict[str, str], old: dict[str, str], timeout_s: float
    ) -> dict[str, str]:
        install_files(runner, self.units_dir, new, old, is_render_file)
        if runner.dry_run:
            runner.note(f"wait for llamanix up to apply {self.units_dir / MANIFEST}")
            return {}
        return self.wait_applied(new, timeout_s)

    def wait_applied(self, new: dict[str, str], timeout_s: float) -> dict[str, str]:
        """Wait until ``up`` runs exactly ``new``; returns {instance: error} for failed starts."""
        digest = hashlib.sha256(new[MANIFEST].encode()).hexdigest()
        keys = {n: s.key for n, s in load_specs(self.units_dir).items()}
        deadline = time.monotonic() + timeout_s
        while True:
            status = read_status(self.units_dir)
            if status is None:
                raise ExternalCommandError(f"llamanix up for {self.units_dir} is gone")
            states = status.get("instances", {})
            if status.get("manifest") == digest and all(
                states.get(n, {}).get("key") == k and states[n].get("state") in SETTLED
                for n, k in keys.items()
            ):
                return {
                    n: str(states[n].get("last_error") or states[n]["state"])
                    for n in keys
                    if states[n]["state"] != "running"
                }
            if time.monotonic() > deadline:
                return {
                    n: f"not serving within {timeout_s:g}s "
                    f"(state {states.get(n, {}).get('state', 'unknown')})"
                    for n in keys
                    if states.get(n, {}).get("state") != "running"
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
    name: str = "nixos"

    def describe(self) -> dict[str, str]:
        return {"manager": self.name, "flake": str(self.flake_dir)}

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

    def installed(self) -> dict[str, str]:
        return {}

    def activate(
        self, runner: Runner, new: dict[str, str], old: dict[str, str], timeout_s: float
    ) -> dict[str, str]:
        nix.nixos_rebuild_switch(runner, self.flake_dir, self.host, self.target)
        return {}

    def restore(
        self, runner: Runner, old: dict[str, str], new: dict[str, str], timeout_s: float
    ) -> None:
        nix.nixos_rebuild_rollback(runner, self.flake_dir, self.target)


def user_units_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "systemd" / "user"


def make_manager(
    config: Config, host: str, state: HostState, manager: str | None, units_dir: Path | None
) -> Manager:
    recorded = state.manager()
    kind = manager or recorded.get("manager") or config.hosts[host].kind
    if units_dir is None and recorded.get("manager") == kind and recorded.get("units_dir"):
        units_dir = Path(recorded["units_dir"])
    target = config.hosts[host].target
    if kind == "nixos":
        return NixosManager(Path(config.source).resolve().parent, host, target)
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
        return UpManager(units_dir or state.root / "up")
    if kind == "systemd-user":
        return SystemdManager(units_dir or user_units_dir(), user=True)
    return SystemdManager(units_dir or Path("/etc/systemd/system"), user=False)


# --- gating ----------------------------------------------------------------------------------


def gate_url(config: Config, name: str) -> str:
    inst = config.instances[name]
    target = config.hosts[inst.host].target
    address = inst.listen
    if address in ("0.0.0.0", "::", "127.0.0.1", "::1", "localhost"):
        # A remote host is reached by its ssh name; a local wildcard over loopback.
        address = target.rsplit("@", 1)[-1] if target else "127.0.0.1"
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{inst.port}"


def gate_target(config: Config, name: str) -> GateTarget:
    inst = config.instances[name]
    key = None
    if inst.api_key_file:
        try:
            key = Path(inst.api_key_file).read_text().strip() or None
        except OSError:
            key = None  # a remote host's key: the chat check then reports the 401
    return GateTarget(
        name=name,
        url=gate_url(config, name),
        alias=inst.alias,
        api_key=key,
        speculative=inst.speculative.enabled,
        metrics=inst.metrics,
    )


@dataclass(frozen=True)
class SwitchOptions:
    sets: tuple[str, ...] = ()
    gate: str | None = None
    min_tok_s: float | None = None
    max_regression: float | None = None
    timeout_s: float = 120.0
    manager: str | None = None
    units_dir: Path | None = None

    def gate_kind(self, source: str) -> str:
        wants_bench = self.min_tok_s is not None or self.max_regression is not None
        if self.min_tok_s is not None and self.max_regression is not None:
            raise UserError(
                Problem(source, "--min-tok-s", "and --max-regression both given", "use one of them")
            )
        gate = self.gate or ("bench" if wants_bench else "health")
        if gate not in GATES:
            raise UserError(
                Problem(source, "--gate", f"unknown gate '{gate}'", suggest(gate, GATES))
            )
        if wants_bench and gate != "bench":
            raise UserError(
                Problem(
                    source,
                    "--gate",
                    f"--min-tok-s/--max-regression need a measurement, not '{gate}'",
                    "use --gate bench",
                )
            )
        return gate


@dataclass
class HostOutcome:
    host: str
    result: str  # passed | failed | unchanged | dry-run
    generation: int | None = None
    detail: str = ""
    changed: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.result != "failed"


def fill_source_revisions(render: Render, config: Config, kind: str) -> None:
    """Which source each instance runs: the flake.lock pin (NixOS) or the binary's --version."""
    locked = nix.locked_revisions(Path(config.source).resolve().parent) if kind == "nixos" else {}
    for inst in render.instances:
        if inst.source_revision:
            continue
        if kind == "nixos":
            variant = VARIANTS[inst.variant]
            inst.source_revision = locked.get(variant.flake_input or "nixpkgs")
            continue
        program = Path(inst.argv[0])
        if program.is_absolute() and os.access(program, os.X_OK):
            try:
                inst.source_revision = commit_of(binary_version_line(program))
            except (ExternalCommandError, OSError, ValueError):
                inst.source_revision = None


def _check_serving(
    config: Config | None, names: list[str], timeout_s: float, echo: Echo
) -> tuple[bool, list[GateResult]]:
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


def _lenient_parse(path: Path, text: str) -> Config | None:
    try:
        return parse_text(path, text)
    except UserError:
        return None


def switch_host(
    path: Path,
    host: str,
    old_text: str,
    new_text: str,
    opts: SwitchOptions,
    runner: Runner,
    echo: Echo,
    restore_config: bool = True,
) -> HostOutcome:
    config = parse_text(path, new_text)
    host = pick_host(config, host)
    gate = opts.gate_kind(str(path))
    state = HostState.beside(path, host)
    manager = make_manager(config, host, state, opts.manager, opts.units_dir)
    manager.preflight(runner)
    render = render_host(config, host)
    fill_source_revisions(render, config, manager.name)
    new_files = render.files()
    current = state.current()
    old_files = current.files() if current else manager.installed()
    changed, removed = diff_instances(new_files, old_files)
    if manager.name == "nixos" and not old_files:
        changed = sorted(manifest_instances(new_files))  # nothing recorded yet: gate them all
    file_text = read_config_text(path)
    if not changed and not removed and file_text == new_text:
        echo(f"{host}: nothing changed")
        return HostOutcome(host, "unchanged", current.number if current else None)
    echo(f"{host}: switching {', '.join(changed) or '(removals only)'} via {manager.name}")
    if runner.dry_run:
        if file_text != new_text:
            runner.note(f"write {path}")
        manager.activate(runner, new_files, old_files, opts.timeout_s)
        runner.note(f"gate {gate}: {', '.join(changed) or 'nothing'}")
        return HostOutcome(host, "dry-run", None, changed=changed)

    suffix = path.suffix or ".toml"
    if current is None and old_files:
        baseline = state.create(
            old_files,
            file_text,
            suffix,
            {
                "instances": summary_of(old_files),
                "gate": {"result": "unverified"},
                "note": "found installed before the first switch",
            },
        )
        state.set_current(baseline)
    gen = state.create(
        new_files,
        new_text,
        suffix,
        {
            "instances": summary_of(new_files),
            "changed": changed,
            "removed": removed,
            "manager": manager.describe(),
            "gate": {"result": "pending", "kind": gate},
        },
    )
    state.set_manager(manager.describe())
    if file_text != new_text:
        atomic_write(path, new_text)

    results: list[GateResult] = []
    activated = False
    try:
        early = manager.activate(runner, new_files, old_files, opts.timeout_s)
        activated = True
        for name in changed:
            if name in early:
                results.append(GateResult(name, gate, False, f"did not start: {early[name]}"))
                continue
            limits = Thresholds(
                opts.min_tok_s, opts.max_regression, (state.baseline(name) or {}).get("tok_s")
            )
            results.append(run_gate(gate, gate_target(config, name), opts.timeout_s, limits))
    except ExternalCommandError as err:
        results.append(GateResult(host, gate, False, str(err)))
    for r in results:
        echo(f"  gate {r.gate} {r.name}: {'passed' if r.passed else 'FAILED'}: {r.detail}")
    if all(r.passed for r in results):
        gen.update(
            gate={
                "result": "passed",
                "kind": gate,
                "instances": {r.name: r.to_json() for r in results},
            }
        )
        state.set_current(gen)
        for r in results:
            if r.tok_s is not None:
                state.save_baseline(
                    r.name,
                    {
                        "tok_s": r.tok_s,
                        "generation": gen.number,
                        "variant": config.instances[r.name].variant,
                    },
                )
        return HostOutcome(host, "passed", gen.number, changed=changed)

    failed = next(r for r in results if not r.passed)
    gen.update(
        gate={"result": "failed", "kind": gate, "instances": {r.name: r.to_json() for r in results}}
    )
    restored = state.current()
    echo(
        f"{host}: gate failed; restoring generation "
        f"{restored.number if restored else 'none (nothing was installed)'}"
    )
    if restore_config and read_config_text(path) != old_text:
        atomic_write(path, old_text)
    if manager.name == "nixos" and not activated:
        detail = (
            f"{failed.name}: {failed.detail}; nixos-rebuild did not finish, so nothing "
            "was rolled back (check `nixos-rebuild list-generations`)"
        )
        return HostOutcome(host, "failed", gen.number, detail, changed)
    try:
        manager.restore(runner, old_files, new_files, opts.timeout_s)
        old_config = _lenient_parse(path, old_text)
        serving, _ = _check_serving(
            old_config, sorted(set(changed) | set(removed)), opts.timeout_s, echo
        )
    except ExternalCommandError as err:
        echo(f"  restore failed: {err}")
        serving = False
    gen.update(rollback={"serving_again": serving})
    detail = f"{failed.name}: {failed.detail}; previous generation " + (
        "serving again" if serving else "NOT answering"
    )
    return HostOutcome(host, "failed", gen.number, detail, changed)


def switch(
    path: Path, host: str, opts: SwitchOptions, runner: Runner, echo: Echo
) -> list[HostOutcome]:
    """Switch one host, or every host in order (``all``), stopping at the first failure."""
    old_text = read_config_text(path)
    new_text = apply_sets(path, old_text, opts.sets)
    config = parse_text(path, new_text)  # every --set value checked before anything is written
    opts.gate_kind(str(path))
    hosts = list(config.hosts) if host == "all" else [pick_host(config, host)]
    outcomes: list[HostOutcome] = []
    for name in hosts:
        first = not any(o.result == "passed" for o in outcomes)
        outcome = switch_host(
            path, name, old_text, new_text, opts, runner, echo, restore_config=first
        )
        outcomes.append(outcome)
        if not outcome.ok:
            if not first:
                echo(
                    f"note: {path} keeps the change: hosts "
                    f"{', '.join(o.host for o in outcomes if o.result == 'passed')} run it; "
                    f"fix it and switch {name} again"
                )
            break
    return outcomes


# --- rollback --------------------------------------------------------------------------------


def rollback(
    path: Path,
    host: str | None,
    to: int | None,
    runner: Runner,
    echo: Echo,
    manager_name: str | None = None,
    units_dir: Path | None = None,
    timeout_s: float = 120.0,
) -> Generation:
    config = parse_text(path, read_config_text(path))
    name = pick_host(config, host)
    state = HostState.beside(path, name)
    current = state.current()
    found = (
        state.get(to)
        if to is not None
        else state.previous_good(current.number if current else 1 << 30)
    )
    if found is None:
        raise UserError(
            Problem(
                str(state.root),
                "--host",
                f"host '{name}' has no earlier good generation",
                "see llamanix generations",
            )
        )
    target = found
    manager = make_manager(config, name, state, manager_name, units_dir)
    manager.preflight(runner)
    new_files = target.files()
    old_files = current.files() if current else manager.installed()
    snapshot = target.config_snapshot()
    echo(f"{name}: rolling back to generation {target.number} via {manager.name}")
    if runner.dry_run:
        if snapshot is not None:
            runner.note(f"write {path}")
    elif snapshot is not None:
        atomic_write(path, snapshot.read_text())
    if isinstance(manager, NixosManager) and to is None:
        nix.nixos_rebuild_rollback(runner, manager.flake_dir, manager.target)
    else:
        failed = manager.activate(runner, new_files, old_files, timeout_s)
        if failed:
            raise ExternalCommandError(f"generation {target.number} did not start: {failed}")
    if runner.dry_run:
        return target
    changed, _ = diff_instances(new_files, old_files)
    target_config = _lenient_parse(path, snapshot.read_text()) if snapshot else None
    serving, _ = _check_serving(target_config, changed, timeout_s, echo)
    state.set_current(target)
    target.update(activated_again=now())
    if not serving:
        raise ExternalCommandError(f"generation {target.number} is installed but not answering")
    return target


# --- pin -------------------------------------------------------------------------------------

_REV = re.compile(r"^[A-Za-z0-9._-]+$")
_PINNED_BY_URL = re.compile(r"/[0-9a-f]{40}$")


def pin(variant: str, rev: str | None, latest: bool, flake_dir: Path, runner: Runner) -> str:
    """Point the variant's flake input at REV (or its newest commit); returns the input name."""
    if variant not in VARIANTS:
        raise UserError(
            Problem(
                "pin", "VARIANT", f"unknown variant '{variant}'", suggest(variant, tuple(VARIANTS))
            )
        )
    if (rev is None) == (not latest):
        raise UserError(
            Problem(
                "pin",
                "REV",
                "give a revision or --latest (not both)",
                f"e.g. llamanix pin {variant} --latest",
            )
        )
    if not (flake_dir / "flake.nix").exists():
        raise UserError(
            Problem(
                str(flake_dir),
                "--flake",
                "no flake.nix here",
                "run in the llamanix flake or pass --flake DIR",
            )
        )
    v = VARIANTS[variant]
    flake_input = v.flake_input or "nixpkgs"
    if _PINNED_BY_URL.search(v.upstream):
        # `nix flake lock` cannot move an input whose URL names a commit (and an override would
        # be undone by the next lock, whose `original` no longer matches flake.nix).
        raise UserError(
            Problem(
                "pin",
                "VARIANT",
                f"{variant} is pinned by URL in flake.nix ({v.upstream})",
                "edit that URL to move it, or pin variant upstream, which carries the same code",
            )
        )
    if latest:
        nix.flake_lock_update_input(runner, flake_dir, flake_input)
        return flake_input
    assert rev is not None
    if not _REV.match(rev):
        raise UserError(
            Problem(
                "pin", "REV", f"'{rev}' is not a revision", "give a commit hash, tag or branch name"
            )
        )
    repo = "github:NixOS/nixpkgs" if v.flake_input is None else "/".join(v.upstream.split("/")[:2])
    nix.flake_lock_override_input(runner, flake_dir, flake_input, f"{repo}/{rev}")
    return flake_input
