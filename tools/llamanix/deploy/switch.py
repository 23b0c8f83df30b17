"""switch: change what a host of this machine runs, gate it, and undo it when the gate fails.

A switch renders the changed config in memory (a bad value stops it before anything is
written), records the render as a new numbered generation, writes the config atomically, hands
the render to the host's manager (nixos-rebuild, systemctl, or a running ``llamanix up``), and
runs the gate against every instance that changed. If the gate fails, the config goes back, the
manager restores the previous generation, and the previous instances are checked over HTTP
before the switch reports failure (exit 1).

This is one host's switch, from a request already read and locked (deploy.request); which host
is switched here and which over ssh is deploy.fleet's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from llamanix.core.config import Config
from llamanix.core.errors import ExternalCommandError
from llamanix.deploy import gateway_venv
from llamanix.deploy.binary_dialect import refuse_other_dialect
from llamanix.deploy.crash_point import crash_point
from llamanix.deploy.gap_records import GapRecord
from llamanix.deploy.gate import GatePrompts, measure_baseline, run_gate
from llamanix.deploy.gate_records import (
    DEFAULT_GATE_PROMPTS,
    Baseline,
    BaselineRecord,
    GateKind,
    GateResult,
)
from llamanix.deploy.generations import (
    GateRecord,
    Generation,
    GenerationRecord,
    HostState,
    RollbackRecord,
)
from llamanix.deploy.host_render import with_source_revisions
from llamanix.deploy.managers import (
    Manager,
    SystemdManager,
    as_installed,
    make_manager,
    refuse_router_under_up,
    render_summary,
    summary_of,
)
from llamanix.deploy.request import SwitchRequest
from llamanix.deploy.restarts import DrainingRestart
from llamanix.deploy.serving import check_serving, endpoints, gate_target, router_for
from llamanix.deploy.switch_records import Echo, HostOutcome, Restore, SwitchOptions
from llamanix.external.files import atomic_write
from llamanix.external.process import Runner
from llamanix.render.changes import render_changes, served_names
from llamanix.render.gateway import UNIT_NAME as GATEWAY_UNIT
from llamanix.render.manifest import Render, unit_name
from llamanix.render.units import ROUTER


def _bench_baselines(
    request: SwitchRequest,
    host: str,
    names: list[str],
    state: HostState,
    echo: Echo,
    prompts: GatePrompts | None,
) -> dict[str, Baseline]:
    """Each changed instance's --max-regression baseline: measured now on the instance still
    serving (same machine, moments before the candidate), else the last good bench's runs
    of the same prompts."""
    old_config = request.old_config
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

    request: SwitchRequest
    host: str
    runner: Runner
    echo: Echo
    state: HostState
    manager: Manager
    current: Generation | None
    render: Render  # the new render, typed; new_files is its files, made once
    new_files: dict[str, str]
    # What the current generation records (or, before the first switch, what is installed),
    # and what is really installed where a killed command left something else.
    old_files: dict[str, str]
    activate_from: dict[str, str]
    changed: list[str]
    removed: list[str]
    file_text: str  # the config file as it is now
    # Filled as the changed servers restart (systemd hosts).
    gaps: dict[str, GapRecord] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return self.request.path

    @property
    def config(self) -> Config:
        return self.request.config

    @property
    def gate(self) -> GateKind:
        return self.request.gate

    @property
    def opts(self) -> SwitchOptions:
        return self.request.opts

    @property
    def old_text(self) -> str:
        return self.request.old_text

    @property
    def new_text(self) -> str:
        return self.request.new_text


def switch_host(
    request: SwitchRequest,
    host: str,
    file_text: str,
    runner: Runner,
    echo: Echo,
    restore_config: bool = True,
) -> HostOutcome:
    """Switch one host: render and compare, record the generation and write the config,
    activate and gate, then keep the generation or restore the previous one. ``file_text``:
    what the config file holds now (the new text once an earlier host's switch wrote it)."""
    sw = _prepare(request, host, file_text, runner, echo)
    if not sw.changed and not sw.removed and sw.file_text == sw.new_text:
        echo(f"{sw.host}: nothing changed")
        number = sw.current.number if sw.current else None
        return HostOutcome(sw.host, "unchanged", number, previous=number)
    echo(f"{sw.host}: switching {', '.join(sw.changed) or '(removals only)'} via {sw.manager.name}")
    # The gateway's LiteLLM is installed before anything is staged (a failed install leaves
    # the host as it was), and before a baseline is measured (moments before the candidate).
    gateway_venv.ensure_for(sw.runner, sw.manager.name, sw.render)
    if runner.dry_run:
        return _dry_run(sw)
    baselines: dict[str, Baseline] = {}
    if sw.gate == "bench" and sw.opts.max_regression is not None:
        baselines = _bench_baselines(
            request,
            sw.host,
            [n for n in sw.changed if n != GATEWAY_UNIT],
            sw.state,
            echo,
            request.prompts,
        )
    gen = _stage(sw)
    # After _stage: the units found installed before a first switch are a generation now.
    before = sw.state.current()
    previous = before.number if before else None
    started = time.monotonic()
    results, activated_s = _activate_and_gate(sw, baselines)
    for r in results:
        echo(f"  gate {r.gate} {r.name}: {'passed' if r.passed else 'FAILED'}: {r.detail}")
    if all(r.passed for r in results):
        # The manager's activation returns once the units serve (each unit's readiness
        # check, `llamanix up`'s wait, nixos-rebuild's switch with its build).
        return replace(_commit(sw, gen, results), previous=previous, out_of_service_s=activated_s)
    outcome = _restore(sw, gen, results, activated_s is not None, restore_config, started)
    return replace(outcome, previous=previous)


def _prepare(
    request: SwitchRequest, host: str, file_text: str, runner: Runner, echo: Echo
) -> _HostSwitch:
    """Render the new config and compare it with what the host runs; writes nothing."""
    config, opts = request.config, request.opts
    state = HostState.beside(request.path, host)
    manager = make_manager(config, host, state, opts.manager, opts.units_dir)
    if manager.name == "up":
        refuse_router_under_up(config, host)
    manager.preflight(runner)
    render = with_source_revisions(request.renders[host], config, manager.runs_flake_packages)
    if not manager.runs_flake_packages:
        refuse_other_dialect(config, host)
    new_files = render.files()
    current = state.current()
    old_files = current.files() if current else manager.installed()
    changed, removed = render_changes(render, new_files, old_files)
    activate_from, drifted = (
        as_installed(manager, old_files, new_files) if current else (old_files, [])
    )
    changed = sorted(set(changed) | (set(drifted) & set(render.names())))
    return _HostSwitch(
        request=request,
        host=host,
        runner=runner,
        echo=echo,
        state=state,
        manager=manager,
        current=current,
        render=render,
        new_files=new_files,
        old_files=old_files,
        activate_from=activate_from,
        changed=changed,
        removed=removed,
        file_text=file_text,
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
        instances=render_summary(sw.render),
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
) -> tuple[list[GateResult], float | None]:
    """Install the new generation and gate each changed instance: the results, and how long
    the manager took to activate it (None when it did not finish)."""
    results: list[GateResult] = []
    activated_s = None
    try:
        started = time.monotonic()
        draining = _draining_restart(sw)
        early = sw.manager.activate(sw.runner, sw.new_files, sw.activate_from, sw.opts.timeout_s)
        activated_s = time.monotonic() - started
        crash_point("switch:activated")
        if draining is not None:
            sw.gaps.update(draining.gaps)
            for name, gap in sorted(draining.gaps.items()):
                sw.echo(f"  restart {name}: {gap.describe()}")
        if GATEWAY_UNIT in early:
            # Its unit's start check asked LiteLLM itself; a gateway that did not start fails
            # the switch as a server would.
            why = f"did not start: {early[GATEWAY_UNIT]}"
            results.append(GateResult(GATEWAY_UNIT, sw.gate, False, why))
        for name in sw.changed:
            if name == GATEWAY_UNIT and unit_name(GATEWAY_UNIT) in sw.new_files:
                continue  # no gate of its own: its unit started, or `early` says why not
            # A member's unit is its router's.
            unit = ROUTER if router_for(sw.config, name) else name
            if unit in early:
                results.append(GateResult(name, sw.gate, False, f"did not start: {early[unit]}"))
                continue
            limits = sw.opts.thresholds(baselines.get(name), sw.request.prompts)
            target = gate_target(sw.config, name)
            results.append(run_gate(sw.gate, target, sw.opts.timeout_s, limits))
    except ExternalCommandError as err:
        results.append(GateResult(sw.host, sw.gate, False, str(err)))
    return results, activated_s


def _draining_restart(sw: _HostSwitch) -> DrainingRestart | None:
    """The systemd manager restarts the changed servers one by one, each drained first."""
    if not isinstance(sw.manager, SystemdManager) or sw.runner.dry_run:
        return None
    sw.manager.restarts = DrainingRestart(
        old=endpoints(sw.request.old_config, sw.host),
        new=endpoints(sw.config, sw.host),
        drain_timeout_s=sw.opts.drain_timeout_s,
    )
    return sw.manager.restarts


def _commit(sw: _HostSwitch, gen: Generation, results: list[GateResult]) -> HostOutcome:
    """Every gate passed: the generation becomes current, and its benches the baselines."""
    crash_point("switch:gate-passed")
    gate = GateRecord("passed", sw.gate, {r.name: r for r in results})
    gen.save(replace(gen.record, gate=gate, gaps=dict(sw.gaps) or None))
    sw.state.set_current(gen)
    for r in results:
        if r.bench is not None:
            variant = sw.config.instances[r.name].variant
            sw.state.save_baseline(r.name, BaselineRecord.of(r.bench, gen.number, variant))
    return HostOutcome(
        sw.host, "passed", gen.number, changed=sw.changed, gates=results, gaps=dict(sw.gaps)
    )


def _restore(
    sw: _HostSwitch,
    gen: Generation,
    results: list[GateResult],
    activated: bool,
    restore_config: bool,
    started: float,
) -> HostOutcome:
    """A gate failed: put the config back, restore the previous generation and check that it
    serves again. ``started``: when activation began (``time.monotonic``), for the time the
    host was out of service: until the restored generation answered (None while it does not)."""
    failed = next(r for r in results if not r.passed)
    failed_gate = GateRecord("failed", sw.gate, {r.name: r for r in results})
    gen.save(replace(gen.record, gate=failed_gate, gaps=dict(sw.gaps) or None))
    restored = sw.state.current()
    sw.echo(
        f"{sw.host}: gate failed; restoring generation "
        f"{restored.number if restored else 'none (nothing was installed)'}"
    )
    if restore_config and sw.new_text != sw.old_text:  # _stage left the new text there
        atomic_write(sw.path, sw.old_text)
    if sw.manager.failed_activation_changes_nothing and not activated:
        detail = (
            f"{failed.name}: {failed.detail}; nixos-rebuild did not finish, so nothing "
            "was rolled back (check `nixos-rebuild list-generations`)"
        )
        # The previous generation never stopped serving.
        return HostOutcome(
            sw.host, "failed", gen.number, detail, sw.changed, results, None, 0.0,
            restore="never stopped",
        )  # fmt: skip
    crash_point("switch:restoring")
    # Only what was installed before can serve again: an instance the failed generation
    # added (every instance, on a first switch) has nothing to wait for.
    was_installed = served_names(sw.old_files)
    to_serve = sorted(n for n in set(sw.changed) | set(sw.removed) if n in was_installed)
    try:
        sw.manager.restore(sw.runner, sw.old_files, sw.new_files, sw.opts.timeout_s)
        # The config before --set is parsed only when something is to serve again.
        old_config = sw.request.old_config if to_serve else None
        serving, _ = check_serving(old_config, to_serve, sw.opts.timeout_s, sw.echo)
    except ExternalCommandError as err:
        sw.echo(f"  restore failed: {err}")
        serving = False
    gen.save(replace(gen.record, rollback=RollbackRecord(serving)))
    restore: Restore
    if not was_installed:
        again, restore = "none (nothing was installed), so nothing serves", "nothing before"
    elif serving:
        again, restore = "serving again", "serving again"
    else:
        again, restore = "NOT answering", "not answering"
    detail = f"{failed.name}: {failed.detail}; previous generation {again}"
    back_s = time.monotonic() - started if was_installed and serving else None
    return HostOutcome(
        sw.host, "failed", gen.number, detail, sw.changed, results, None, back_s, dict(sw.gaps),
        restore,
    )  # fmt: skip
