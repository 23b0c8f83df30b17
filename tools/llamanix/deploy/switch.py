"""switch, rollback and pin: change what a host runs, gate it, and undo it when the gate fails.

A switch renders the changed config in memory (a bad value stops it before anything is
written), records the render as a new numbered generation, writes the config atomically, hands
the render to the host's manager (nixos-rebuild, systemctl, or a running ``llamanix up``), and
runs the gate against every instance that changed. If the gate fails, the config goes back, the
manager restores the previous generation, and the previous instances are checked over HTTP
before the switch reports failure (exit 1).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from llamanix.core.config import Config, suggest
from llamanix.core.errors import ExternalCommandError, Problem, UserError
from llamanix.core.probe import commit_of
from llamanix.core.variants import VARIANTS
from llamanix.deploy.config_edit import apply_sets, lenient_parse, parse_text, read_config_text
from llamanix.deploy.crash_point import crash_point
from llamanix.deploy.gate import (
    ACTIONS,
    BENCH_RUNS,
    DEFAULT_MAX_RUNS,
    GATES,
    Action,
    Baseline,
    GateKind,
    GateResult,
    GateTarget,
    Thresholds,
    measure_baseline,
    run_gate,
)
from llamanix.deploy.generations import Generation, HostState, now
from llamanix.deploy.host_lock import host_lock
from llamanix.deploy.managers import (
    Manager,
    ManagerKind,
    NixosManager,
    diff_files,
    diff_instances,
    make_manager,
    manifest_instances,
    summary_of,
)
from llamanix.external import nix
from llamanix.external.files import atomic_write
from llamanix.external.llama_server import binary_version_line
from llamanix.external.process import Runner
from llamanix.render.manifest import Render, RenderedInstance
from llamanix.render.units import pick_host, render_host

# What a switch did on one host.
Outcome = Literal["passed", "failed", "unchanged", "dry-run"]
Echo = Callable[[str], None]


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
    gate: GateKind | None = None
    min_tok_s: float | None = None
    max_regression: float | None = None
    # bench gate with --max-regression: most candidate runs, and what an inconclusive ends as.
    max_runs: int = DEFAULT_MAX_RUNS
    inconclusive: str = "keep"
    timeout_s: float = 120.0
    # Seconds to wait for another switch, rollback or pin of the same host to finish.
    wait_s: float = 0.0
    manager: ManagerKind | None = None
    units_dir: Path | None = None

    def gate_kind(self, source: str) -> GateKind:
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
        if self.max_regression is not None and not 0 <= self.max_regression < 100:
            raise UserError(
                Problem(
                    "llamanix switch",
                    "--max-regression",
                    f"must be a percentage from 0 to below 100, got {self.max_regression:g}",
                    "pass e.g. --max-regression 5",
                )
            )
        if self.max_runs < BENCH_RUNS:
            raise UserError(
                Problem(
                    "llamanix switch",
                    "--max-runs",
                    f"must be at least {BENCH_RUNS} (the first batch of runs), got {self.max_runs}",
                    f"pass --max-runs {BENCH_RUNS} or more",
                )
            )
        self.inconclusive_action()
        return gate

    def inconclusive_action(self) -> Action:
        for action in ACTIONS:
            if self.inconclusive == action:
                return action
        raise UserError(
            Problem(
                "llamanix switch",
                "--inconclusive",
                f"unknown outcome '{self.inconclusive}'",
                suggest(self.inconclusive, ACTIONS),
            )
        )

    def thresholds(self, baseline: Baseline | None) -> Thresholds:
        return Thresholds(
            self.min_tok_s,
            self.max_regression,
            baseline,
            self.max_runs,
            self.inconclusive_action(),
        )


@dataclass
class HostOutcome:
    host: str
    result: Outcome
    generation: int | None = None
    detail: str = ""
    changed: list[str] = field(default_factory=list)
    gates: list[GateResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.result != "failed"

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "result": self.result,
            "generation": self.generation,
            "changed": self.changed,
            "detail": self.detail,
            "gate": {r.name: r.to_json() for r in self.gates},
        }


def with_source_revisions(render: Render, config: Config, kind: str) -> Render:
    """The render with each instance's source: the flake.lock pin (NixOS) or the binary's
    --version, where the probe did not already say."""
    locked = nix.locked_revisions(Path(config.source).resolve().parent) if kind == "nixos" else {}

    def revision(inst: RenderedInstance) -> str | None:
        if inst.source_revision:
            return inst.source_revision
        if kind == "nixos":
            return locked.get(VARIANTS[inst.variant].flake_input or "nixpkgs")
        program = Path(inst.argv[0])
        if program.is_absolute() and os.access(program, os.X_OK):
            try:
                return commit_of(binary_version_line(program))
            except (ExternalCommandError, OSError, ValueError):
                return None
        return None

    return replace(
        render,
        instances=tuple(replace(i, source_revision=revision(i)) for i in render.instances),
    )


def _as_installed(
    manager: Manager, recorded: dict[str, str], new: dict[str, str]
) -> tuple[dict[str, str], list[str]]:
    """What is really installed, in place of the files a generation records, and the
    instances where the two differ.

    A switch or rollback killed half-way can leave other units installed than ``current``
    says; activating from the recorded files would then skip the very files that differ.
    Only the files of this render and of the recorded generation count, so units of another
    config in the same directory are left alone."""
    if manager.name == "nixos":  # nixos-rebuild knows what it installed; nothing to compare
        return recorded, []
    installed = manager.installed()
    drifted, _ = diff_files(recorded, installed)
    if not drifted:
        return recorded, []
    keep = set(recorded) | set(new)
    return {**recorded, **{k: v for k, v in installed.items() if k in keep}}, drifted


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


def _bench_baselines(
    path: Path, old_text: str, host: str, names: list[str], state: HostState, echo: Echo
) -> dict[str, Baseline]:
    """Each changed instance's --max-regression baseline: measured now on the instance still
    serving (same machine, moments before the candidate), else the last good bench's runs."""
    old_config = lenient_parse(path, old_text)
    found: dict[str, Baseline] = {}
    for name in names:
        old = old_config.instances.get(name) if old_config else None
        baseline = None
        if old_config and old and old.host == host:
            baseline = measure_baseline(gate_target(old_config, name))
        baseline = baseline or Baseline.stored(state.baseline(name))
        if baseline is None:
            echo(f"  baseline {name}: none (not answering, and no stored runs)")
            continue
        found[name] = baseline
        echo(
            f"  baseline {name}: {len(baseline.samples)} runs ({baseline.source}), "
            f"decode {', '.join(f'{v:.1f}' for v in baseline.samples)} tok/s"
        )
    return found


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
    render = with_source_revisions(render_host(config, host), config, manager.name)
    new_files = render.files()
    current = state.current()
    old_files = current.files() if current else manager.installed()
    changed, removed = diff_instances(render, old_files)
    activate_from, drifted = (
        _as_installed(manager, old_files, new_files) if current else (old_files, [])
    )
    changed = sorted(set(changed) | (set(drifted) & set(render.names())))
    if manager.name == "nixos" and not old_files:
        changed = sorted(render.names())  # nothing recorded yet: gate them all
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

    baselines: dict[str, Baseline] = {}
    if gate == "bench" and opts.max_regression is not None:
        baselines = _bench_baselines(path, old_text, host, changed, state, echo)
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
    crash_point("switch:staged")
    if file_text != new_text:
        atomic_write(path, new_text)
    crash_point("switch:config-written")

    results: list[GateResult] = []
    activated = False
    try:
        early = manager.activate(runner, new_files, activate_from, opts.timeout_s)
        activated = True
        crash_point("switch:activated")
        for name in changed:
            if name in early:
                results.append(GateResult(name, gate, False, f"did not start: {early[name]}"))
                continue
            limits = opts.thresholds(baselines.get(name))
            results.append(run_gate(gate, gate_target(config, name), opts.timeout_s, limits))
    except ExternalCommandError as err:
        results.append(GateResult(host, gate, False, str(err)))
    for r in results:
        echo(f"  gate {r.gate} {r.name}: {'passed' if r.passed else 'FAILED'}: {r.detail}")
    if all(r.passed for r in results):
        crash_point("switch:gate-passed")
        gen.update(
            gate={
                "result": "passed",
                "kind": gate,
                "instances": {r.name: r.to_json() for r in results},
            }
        )
        state.set_current(gen)
        for r in results:
            if r.bench is not None:
                state.save_baseline(
                    r.name,
                    {
                        "tok_s": r.bench.median,
                        "samples": list(r.bench.samples),
                        "generation": gen.number,
                        "variant": config.instances[r.name].variant,
                    },
                )
        return HostOutcome(host, "passed", gen.number, changed=changed, gates=results)

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
        return HostOutcome(host, "failed", gen.number, detail, changed, results)
    crash_point("switch:restoring")
    try:
        manager.restore(runner, old_files, new_files, opts.timeout_s)
        old_config = lenient_parse(path, old_text)
        # Only what was installed before can serve again: an instance the failed generation
        # added (every instance, on a first switch) has nothing to wait for.
        was_installed = manifest_instances(old_files)
        serving, _ = _check_serving(
            old_config,
            sorted(n for n in set(changed) | set(removed) if n in was_installed),
            opts.timeout_s,
            echo,
        )
    except ExternalCommandError as err:
        echo(f"  restore failed: {err}")
        serving = False
    gen.update(rollback={"serving_again": serving})
    if not manifest_instances(old_files):
        again = "none (nothing was installed), so nothing serves"
    else:
        again = "serving again" if serving else "NOT answering"
    detail = f"{failed.name}: {failed.detail}; previous generation {again}"
    return HostOutcome(host, "failed", gen.number, detail, changed, results)


def _recover(state: HostState, echo: Echo) -> None:
    """Tidy what a killed switch or rollback of this host left (the caller holds the lock)."""
    for note in state.recover():
        echo(f"{state.host}: {note}")


def switch(
    path: Path, host: str, opts: SwitchOptions, runner: Runner, echo: Echo
) -> list[HostOutcome]:
    """Switch one host, or every host in order (``all``), stopping at the first failure.

    Each host's lock is held for the whole switch, config read included (--wait: how long to
    wait for another switch, rollback or pin to finish); a dry run changes nothing and locks
    nothing."""
    opts.gate_kind(str(path))  # bad options: one line before anything is read or locked
    if runner.dry_run:
        return _switch_locked(path, host, opts, runner, echo)
    first = parse_text(path, apply_sets(path, read_config_text(path), opts.sets))
    names = list(first.hosts) if host == "all" else [pick_host(first, host)]
    with ExitStack() as locks:
        for name in names:  # always in config order, so two callers cannot deadlock
            state = HostState.beside(path, name)
            locks.enter_context(host_lock(state.root, f"host {name}", str(path), opts.wait_s))
            _recover(state, echo)
        return _switch_locked(path, host, opts, runner, echo)


def _switch_locked(
    path: Path, host: str, opts: SwitchOptions, runner: Runner, echo: Echo
) -> list[HostOutcome]:
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
    wait_s: float = 0.0,
) -> Generation:
    config = parse_text(path, read_config_text(path))
    name = pick_host(config, host)
    state = HostState.beside(path, name)
    if runner.dry_run:
        return _rollback_locked(
            path, name, state, to, runner, echo, manager_name, units_dir, timeout_s
        )
    with host_lock(state.root, f"host {name}", str(path), wait_s, command="rollback"):
        _recover(state, echo)
        return _rollback_locked(
            path, name, state, to, runner, echo, manager_name, units_dir, timeout_s
        )


def _rollback_locked(
    path: Path,
    name: str,
    state: HostState,
    to: int | None,
    runner: Runner,
    echo: Echo,
    manager_name: str | None,
    units_dir: Path | None,
    timeout_s: float,
) -> Generation:
    config = parse_text(path, read_config_text(path))
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
    old_files, _ = _as_installed(manager, old_files, new_files)
    snapshot = target.config_snapshot()
    echo(f"{name}: rolling back to generation {target.number} via {manager.name}")
    if runner.dry_run:
        if snapshot is not None:
            runner.note(f"write {path}")
    elif snapshot is not None:
        atomic_write(path, snapshot.read_text())
        crash_point("rollback:config-written")
    if isinstance(manager, NixosManager) and to is None:
        nix.nixos_rebuild_rollback(runner, manager.flake_dir, manager.target)
    else:
        failed = manager.activate(runner, new_files, old_files, timeout_s)
        if failed:
            raise ExternalCommandError(f"generation {target.number} did not start: {failed}")
        crash_point("rollback:activated")
    if runner.dry_run:
        return target
    changed, _ = diff_files(new_files, old_files)
    target_config = lenient_parse(path, snapshot.read_text()) if snapshot else None
    serving, _ = _check_serving(target_config, changed, timeout_s, echo)
    state.set_current(target)
    target.update(activated_again=now())
    if not serving:
        raise ExternalCommandError(f"generation {target.number} is installed but not answering")
    return target
