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
from typing import Literal

from llamanix.core.address import connect_url, is_loopback, is_wildcard, url_host
from llamanix.core.api_key import key_if_readable
from llamanix.core.config import Config, Router, suggest
from llamanix.core.errors import ExternalCommandError, Problem, UserError
from llamanix.core.probe import commit_of
from llamanix.core.variants import VARIANTS
from llamanix.deploy.config_edit import apply_sets, lenient_parse, parse_text, read_config_text
from llamanix.deploy.crash_point import crash_point
from llamanix.deploy.gate import (
    ACTIONS,
    BENCH_RUNS,
    DEFAULT_GATE_PROMPTS,
    DEFAULT_MAX_RUNS,
    GATES,
    Action,
    Baseline,
    BaselineRecord,
    GateKind,
    GatePrompts,
    GateResult,
    GateTarget,
    Thresholds,
    measure_baseline,
    run_gate,
)
from llamanix.deploy.generations import (
    GateRecord,
    Generation,
    GenerationRecord,
    HostState,
    ManagerKind,
    RollbackRecord,
)
from llamanix.deploy.host_lock import host_lock
from llamanix.deploy.managers import (
    Manager,
    diff_files,
    diff_instances,
    make_manager,
    refuse_router_under_up,
    served_names,
    summary_of,
)
from llamanix.external import nix
from llamanix.external.clock import now
from llamanix.external.files import atomic_write
from llamanix.external.llama_server import binary_version_line
from llamanix.external.process import Runner
from llamanix.render.manifest import Render, RenderedInstance
from llamanix.render.units import ROUTER, pick_host, render_host

# What a switch did on one host.
Outcome = Literal["passed", "failed", "unchanged", "dry-run"]
Echo = Callable[[str], None]


def _router_for(config: Config, name: str) -> Router | None:
    """The router an instance is served behind, if any."""
    router = config.hosts[config.instances[name].host].router
    return router if router is not None and name in router.members else None


def gate_url(config: Config, name: str) -> str:
    inst = config.instances[name]
    router = _router_for(config, name)
    listen, port = (router.listen, router.port) if router else (inst.listen, inst.port)
    target = config.hosts[inst.host].target
    if target and (is_wildcard(listen) or is_loopback(listen)):
        # A remote host is reached by its ssh name.
        return f"http://{url_host(target.rsplit('@', 1)[-1])}:{port}"
    return connect_url(listen, port)


def gate_target(config: Config, name: str) -> GateTarget:
    """The instance as clients reach it: its own address, or its router's and its name there."""
    inst = config.instances[name]
    router = _router_for(config, name)
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
    # bench gate: the prompts measured, in turn (bench's --prompts spelling).
    gate_prompts: str | None = None

    def bench_prompts(self) -> GatePrompts | None:
        """The --gate-prompts' prompts; None for the default (checked in gate_kind)."""
        return None if self.gate_prompts is None else GatePrompts.load(self.gate_prompts)

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
        if self.gate_prompts is not None:
            if gate != "bench":
                raise UserError(
                    Problem(
                        "llamanix switch",
                        "--gate-prompts",
                        f"are what the bench gate measures, not '{gate}'",
                        "use --gate bench (or leave --gate-prompts out)",
                    )
                )
            self.bench_prompts()
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
            self.bench_prompts(),
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

    def to_json(self) -> dict[str, object]:
        return {
            "host": self.host,
            "result": self.result,
            "generation": self.generation,
            "changed": self.changed,
            "detail": self.detail,
            "gate": {r.name: r.to_json() for r in self.gates},
        }


def with_source_revisions(render: Render, config: Config, from_flake: bool) -> Render:
    """The render with each instance's source, where the probe did not already say: the
    flake.lock pin when the units run the flake's packages (NixOS), else the binary's
    --version."""
    locked = nix.locked_revisions(Path(config.source).resolve().parent) if from_flake else {}

    def revision(inst: RenderedInstance) -> str | None:
        if inst.source_revision:
            return inst.source_revision
        if from_flake:
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
    if not manager.reads_installed:  # its own tool knows what it installed
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
    path: Path,
    old_text: str,
    host: str,
    names: list[str],
    state: HostState,
    echo: Echo,
    prompts: GatePrompts | None,
) -> dict[str, Baseline]:
    """Each changed instance's --max-regression baseline: measured now on the instance still
    serving (same machine, moments before the candidate), else the last good bench's runs
    of the same prompts."""
    old_config = lenient_parse(path, old_text)
    found: dict[str, Baseline] = {}
    for name in names:
        old = old_config.instances.get(name) if old_config else None
        baseline = None
        if old_config and old and old.host == host:
            baseline = measure_baseline(gate_target(old_config, name), prompts)
        baseline = baseline or Baseline.stored(
            state.baseline(name), prompts.spec if prompts else DEFAULT_GATE_PROMPTS
        )
        if baseline is None:
            echo(f"  baseline {name}: none (not answering, and no stored runs)")
            continue
        found[name] = baseline
        echo(
            f"  baseline {name}: {len(baseline.samples)} runs ({baseline.source}), "
            f"decode {', '.join(f'{v:.1f}' for v in baseline.samples)} tok/s"
        )
    return found


@dataclass(frozen=True)
class _HostSwitch:
    """One host's switch, rendered and compared with what runs: what each stage works on."""

    path: Path
    host: str
    config: Config
    gate: GateKind
    opts: SwitchOptions
    runner: Runner
    echo: Echo
    state: HostState
    manager: Manager
    current: Generation | None
    new_files: dict[str, str]
    # What the current generation records (or, before the first switch, what is installed),
    # and what is really installed where a killed command left something else.
    old_files: dict[str, str]
    activate_from: dict[str, str]
    changed: list[str]
    removed: list[str]
    file_text: str  # the config file as it is now
    old_text: str
    new_text: str


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
    """Switch one host: render and compare, record the generation and write the config,
    activate and gate, then keep the generation or restore the previous one."""
    sw = _prepare(path, host, old_text, new_text, opts, runner, echo)
    if not sw.changed and not sw.removed and sw.file_text == new_text:
        echo(f"{sw.host}: nothing changed")
        return HostOutcome(sw.host, "unchanged", sw.current.number if sw.current else None)
    echo(f"{sw.host}: switching {', '.join(sw.changed) or '(removals only)'} via {sw.manager.name}")
    if runner.dry_run:
        return _dry_run(sw)
    baselines: dict[str, Baseline] = {}
    if sw.gate == "bench" and opts.max_regression is not None:
        baselines = _bench_baselines(
            path, old_text, sw.host, sw.changed, sw.state, echo, opts.bench_prompts()
        )
    gen = _stage(sw)
    results, activated = _activate_and_gate(sw, baselines)
    for r in results:
        echo(f"  gate {r.gate} {r.name}: {'passed' if r.passed else 'FAILED'}: {r.detail}")
    if all(r.passed for r in results):
        return _commit(sw, gen, results)
    return _restore(sw, gen, results, activated, restore_config)


def _prepare(
    path: Path,
    host: str,
    old_text: str,
    new_text: str,
    opts: SwitchOptions,
    runner: Runner,
    echo: Echo,
) -> _HostSwitch:
    """Render the new config and compare it with what the host runs; writes nothing."""
    config = parse_text(path, new_text)
    host = pick_host(config, host)
    gate = opts.gate_kind(str(path))
    state = HostState.beside(path, host)
    manager = make_manager(config, host, state, opts.manager, opts.units_dir)
    if manager.name == "up":
        refuse_router_under_up(config, host)
    manager.preflight(runner)
    from llamanix.deploy.plan import member_vram

    render = with_source_revisions(
        render_host(config, host, vram=member_vram(config, host)),
        config,
        manager.runs_flake_packages,
    )
    new_files = render.files()
    current = state.current()
    old_files = current.files() if current else manager.installed()
    changed, removed = diff_instances(render, old_files)
    activate_from, drifted = (
        _as_installed(manager, old_files, new_files) if current else (old_files, [])
    )
    changed = sorted(set(changed) | (set(drifted) & set(render.names())))
    return _HostSwitch(
        path=path,
        host=host,
        config=config,
        gate=gate,
        opts=opts,
        runner=runner,
        echo=echo,
        state=state,
        manager=manager,
        current=current,
        new_files=new_files,
        old_files=old_files,
        activate_from=activate_from,
        changed=changed,
        removed=removed,
        file_text=read_config_text(path),
        old_text=old_text,
        new_text=new_text,
    )


def _dry_run(sw: _HostSwitch) -> HostOutcome:
    if sw.file_text != sw.new_text:
        sw.runner.note(f"write {sw.path}")
    sw.manager.activate(sw.runner, sw.new_files, sw.old_files, sw.opts.timeout_s)
    sw.runner.note(f"gate {sw.gate}: {', '.join(sw.changed) or 'nothing'}")
    return HostOutcome(sw.host, "dry-run", None, changed=sw.changed)


def _stage(sw: _HostSwitch) -> Generation:
    """Record the new generation (gate "pending"), then write the config."""
    suffix = sw.path.suffix or ".toml"
    if sw.current is None and sw.old_files:
        found = GenerationRecord(
            instances=summary_of(sw.old_files),
            gate=GateRecord("unverified"),
            note="found installed before the first switch",
        )
        sw.state.set_current(sw.state.create(sw.old_files, sw.file_text, suffix, found))
    record = GenerationRecord(
        instances=summary_of(sw.new_files),
        changed=tuple(sw.changed),
        removed=tuple(sw.removed),
        manager=sw.manager.describe(),
        gate=GateRecord("pending", sw.gate),
    )
    gen = sw.state.create(sw.new_files, sw.new_text, suffix, record)
    sw.state.set_manager(sw.manager.describe())
    crash_point("switch:staged")
    if sw.file_text != sw.new_text:
        atomic_write(sw.path, sw.new_text)
    crash_point("switch:config-written")
    return gen


def _activate_and_gate(
    sw: _HostSwitch, baselines: dict[str, Baseline]
) -> tuple[list[GateResult], bool]:
    """Install the new generation and gate each changed instance: the results, and whether
    the manager finished activating."""
    results: list[GateResult] = []
    activated = False
    try:
        early = sw.manager.activate(sw.runner, sw.new_files, sw.activate_from, sw.opts.timeout_s)
        activated = True
        crash_point("switch:activated")
        for name in sw.changed:
            # A member's unit is its router's.
            unit = ROUTER if _router_for(sw.config, name) else name
            if unit in early:
                results.append(GateResult(name, sw.gate, False, f"did not start: {early[unit]}"))
                continue
            limits = sw.opts.thresholds(baselines.get(name))
            target = gate_target(sw.config, name)
            results.append(run_gate(sw.gate, target, sw.opts.timeout_s, limits))
    except ExternalCommandError as err:
        results.append(GateResult(sw.host, sw.gate, False, str(err)))
    return results, activated


def _commit(sw: _HostSwitch, gen: Generation, results: list[GateResult]) -> HostOutcome:
    """Every gate passed: the generation becomes current, and its benches the baselines."""
    crash_point("switch:gate-passed")
    gate = GateRecord("passed", sw.gate, {r.name: r for r in results})
    gen.save(replace(gen.record, gate=gate))
    sw.state.set_current(gen)
    for r in results:
        if r.bench is not None:
            variant = sw.config.instances[r.name].variant
            sw.state.save_baseline(r.name, BaselineRecord.of(r.bench, gen.number, variant))
    return HostOutcome(sw.host, "passed", gen.number, changed=sw.changed, gates=results)


def _restore(
    sw: _HostSwitch,
    gen: Generation,
    results: list[GateResult],
    activated: bool,
    restore_config: bool,
) -> HostOutcome:
    """A gate failed: put the config back, restore the previous generation and check that it
    serves again."""
    failed = next(r for r in results if not r.passed)
    gen.save(replace(gen.record, gate=GateRecord("failed", sw.gate, {r.name: r for r in results})))
    restored = sw.state.current()
    sw.echo(
        f"{sw.host}: gate failed; restoring generation "
        f"{restored.number if restored else 'none (nothing was installed)'}"
    )
    if restore_config and read_config_text(sw.path) != sw.old_text:
        atomic_write(sw.path, sw.old_text)
    if sw.manager.failed_activation_changes_nothing and not activated:
        detail = (
            f"{failed.name}: {failed.detail}; nixos-rebuild did not finish, so nothing "
            "was rolled back (check `nixos-rebuild list-generations`)"
        )
        return HostOutcome(sw.host, "failed", gen.number, detail, sw.changed, results)
    crash_point("switch:restoring")
    # Only what was installed before can serve again: an instance the failed generation
    # added (every instance, on a first switch) has nothing to wait for.
    was_installed = served_names(sw.old_files)
    try:
        sw.manager.restore(sw.runner, sw.old_files, sw.new_files, sw.opts.timeout_s)
        serving, _ = _check_serving(
            lenient_parse(sw.path, sw.old_text),
            sorted(n for n in set(sw.changed) | set(sw.removed) if n in was_installed),
            sw.opts.timeout_s,
            sw.echo,
        )
    except ExternalCommandError as err:
        sw.echo(f"  restore failed: {err}")
        serving = False
    gen.save(replace(gen.record, rollback=RollbackRecord(serving)))
    if not was_installed:
        again = "none (nothing was installed), so nothing serves"
    else:
        again = "serving again" if serving else "NOT answering"
    detail = f"{failed.name}: {failed.detail}; previous generation {again}"
    return HostOutcome(sw.host, "failed", gen.number, detail, sw.changed, results)


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
    manager_name: ManagerKind | None = None,
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
    manager_name: ManagerKind | None,
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
    if manager.restores_the_previous_generation and to is None:
        manager.restore(runner, new_files, old_files, timeout_s)
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
    target.save(replace(target.record, activated_again=now()))
    if not serving:
        raise ExternalCommandError(f"generation {target.number} is installed but not answering")
    return target
