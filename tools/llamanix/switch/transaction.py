"""switch: change what a host of this machine runs, gate it, and undo it when the gate fails.

A switch renders the changed config in memory (a bad value stops it before anything is
written), records the render as a new numbered generation, writes the config atomically, hands
the render to the host's manager (nixos-rebuild, systemctl, or a running ``llamanix up``), and
runs the gate against every instance that changed. If the gate fails, the config goes back, the
manager restores the previous generation, and the previous instances are checked over HTTP
before the switch reports failure (exit 1).

This is one host's switch, from a request already read and locked (switch.request); which host
is switched here and which over ssh is fleet's.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from llamanix.config.model import Config
from llamanix.core.errors import ExternalCommandError, UserError
from llamanix.external.files import WriteFailed
from llamanix.external.process import Runner
from llamanix.hosts import gateway_venv
from llamanix.hosts.binary_dialect import probe_notes, refuse_other_dialect
from llamanix.hosts.blue_green import Bridge, bridge_for, why_not
from llamanix.hosts.leftovers import scope_of, tidy_machine
from llamanix.hosts.managers import (
    Manager,
    NixosManager,
    SystemdManager,
    UpManager,
    as_installed,
    make_manager,
    refuse_router_under_up,
    render_summary,
    summary_of,
)
from llamanix.hosts.restarts import DrainingRestart
from llamanix.hosts.warm import GIB, WarmCaches, WarmPlan, plan_for, state_directory
from llamanix.render.changes import RenderFiles, render_changes
from llamanix.render.gateway import UNIT_NAME as GATEWAY_UNIT
from llamanix.render.host_render import with_source_revisions
from llamanix.render.manifest import Render, unit_name
from llamanix.render.units import ROUTER
from llamanix.state.config_edit import config_mode, write_config
from llamanix.state.crash_point import crash_point
from llamanix.state.gap_records import GapRecord
from llamanix.state.gate_records import (
    BENCH_MAX_TOKENS,
    DEFAULT_GATE_PROMPTS,
    Baseline,
    BaselineRecord,
    GateKind,
    GateResult,
)
from llamanix.state.generations import (
    GateRecord,
    Generation,
    GenerationRecord,
    HostState,
    RollbackRecord,
)
from llamanix.state.warm_records import WarmRecord
from llamanix.switch.gate import (
    BASELINE_RUNS,
    GateTarget,
    confirm_regression,
    measure_baseline,
    run_gate,
)
from llamanix.switch.request import SwitchRequest
from llamanix.switch.serving import HostServing, check_serving, gate_targets, router_for
from llamanix.switch.switch_records import Echo, HostOutcome, Restore, SwitchOptions


def _bench_baselines(sw: _HostSwitch, names: list[str]) -> dict[str, Baseline]:
    """Each changed instance's --max-regression baseline: measured now on the instance still
    serving (same machine, moments before the candidate), else the last good bench's runs
    of the same prompts."""
    prompts, echo = sw.request.prompts, sw.echo
    found: dict[str, Baseline] = {}
    for name in names:
        old = sw.old_targets.get(name)  # served on this host before the switch
        baseline = measure_baseline(old, prompts) if old is not None else None
        baseline = baseline or Baseline.stored(
            sw.state.baseline(name), prompts.spec if prompts else DEFAULT_GATE_PROMPTS
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
    # and what is really installed where a killed command left something else: read back
    # once, each with its manifest.
    old: RenderFiles
    installed: RenderFiles
    changed: list[str]
    removed: list[str]
    file_text: str  # the config file as it is now
    # Filled as the changed servers restart (systemd hosts).
    gaps: dict[str, GapRecord] = field(default_factory=dict)
    # The warm_switch instances' caches across their restart.
    warm: WarmCaches | None = None

    @property
    def path(self) -> Path:
        return self.request.path

    @property
    def old_files(self) -> dict[str, str]:
        return self.old.files

    @property
    def activate_from(self) -> dict[str, str]:
        return self.installed.files

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

    # What a restart and the gate use of each side, made once and on first use (the config
    # before --set is parsed only when one of them needs it).
    @functools.cached_property
    def old_serving(self) -> HostServing:
        return HostServing.of(self.request.old_config, self.host)

    @functools.cached_property
    def new_serving(self) -> HostServing:
        return HostServing.of(self.config, self.host)

    @functools.cached_property
    def old_targets(self) -> dict[str, GateTarget]:
        """The instances as they served before the switch: their baselines."""
        return gate_targets(self.request.old_config, self.host)

    @functools.cached_property
    def targets(self) -> dict[str, GateTarget]:
        """The instances as the gate asks them, made at the first gate (after activation: a
        key file the switch installs is read then)."""
        return gate_targets(self.config, self.host)


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
    if not runner.dry_run:
        # What a switch that did not finish left with these units (the lock is ours: no other
        # is under way) goes before anything is measured or written, changed or not.
        for line in tidy_machine(scope_of(sw.manager), runner):
            echo(f"{sw.host}: {line}")
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
        baselines = _bench_baselines(sw, [n for n in sw.changed if n != GATEWAY_UNIT])
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
    outcome = _confirm(sw, gen, results, outcome, restore_config)
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
    from_flake = manager.runs_flake_packages
    render = with_source_revisions(request.renders[host], config, from_flake)
    if not from_flake:
        refuse_other_dialect(config, host)
    new_files = render.files()
    current = state.current()
    old = current.render_files() if current else manager.installed()
    changed, removed = render_changes(render, new_files, old)
    installed, drifted = as_installed(manager, old, new_files) if current else (old, [])
    changed = sorted(set(changed) | (set(drifted) & set(render.names())))
    warm = _warm_caches(request, host, manager, installed, render, changed)
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
        old=old,
        installed=installed,
        changed=changed,
        removed=removed,
        file_text=file_text,
        warm=warm,
    )


def _warm_caches(
    request: SwitchRequest,
    host: str,
    manager: Manager,
    installed: RenderFiles,
    render: Render,
    changed: list[str],
) -> WarmCaches | None:
    """The warm switch of each changed instance that asks for one (``hosts.warm``)."""
    config = request.config
    wanted = [n for n in changed if n in config.instances and config.instances[n].warm_switch]
    # The config before --set is parsed only when an instance asks for a warm switch.
    old_config = request.old_config if wanted else None
    if old_config is None:
        return None
    old_argv = {n: e.argv for n, e in installed.instances().items()}
    new_argv = {r.name: r.argv for r in render.instances}
    units_dir = manager.units_dir if isinstance(manager, UpManager) else None
    limit = int(request.opts.warm_limit_gib * GIB)
    plans: dict[str, WarmPlan] = {}
    for name in wanted:
        old, new = old_config.instances.get(name), config.instances[name]
        if old is None or old.host != host:
            continue
        if isinstance(manager, NixosManager):
            why = "nixos-rebuild restarts the unit, without a save"
            plans[name] = WarmPlan(name, why, Path("/var/lib"))
            continue
        directory = state_directory(name, manager.name, units_dir)
        plan = plan_for(
            name, old, new, old_argv.get(name, ()), new_argv.get(name, ()), directory, limit
        )
        if plan is not None:
            plans[name] = plan
    return WarmCaches(plans) if plans else None


def _dry_run(sw: _HostSwitch) -> HostOutcome:
    """Every step a real switch takes, in its order: what it asks (the probe, the baseline),
    writes (marked with ``#``) and runs; nothing is asked, written or run."""
    note = sw.runner.note
    # The host's state as the user named the config (the directory beside it).
    state = HostState.as_named(sw.path, sw.host)
    if not sw.manager.runs_flake_packages:
        for line in probe_notes(sw.config, sw.host):
            note(line)
    if isinstance(sw.manager, SystemdManager):
        # As switch_host does, before anything is measured or written.
        note("lift what a killed switch left: fences, redirects, a blue-green bridge")
    if sw.gate == "bench" and sw.opts.max_regression is not None:
        for name in (n for n in sw.changed if n != GATEWAY_UNIT):
            note(
                f"baseline {name}: 1 warm-up + {BASELINE_RUNS} runs of {BENCH_MAX_TOKENS} tokens "
                "on the server answering now (else the stored runs of "
                f"{state.baseline_path(name)})"
            )
    number = (sw.current.number + 1) if sw.current else 1
    note(f"record generation {number} in {state.root}")
    if sw.file_text != sw.new_text:
        note(f"write {sw.path}")
    if isinstance(sw.manager, SystemdManager):
        servers = [n for n in sw.changed if n in sw.config.instances or n == ROUTER]
        if servers:
            note(
                f"systemctl restart below: {', '.join(servers)} one at a time, each running one "
                "first fenced where other machines reach it (nft), drained (at most "
                f"{sw.opts.drain_timeout_s:g} s) and its main process stopped"
            )
    sw.manager.activate(sw.runner, sw.new_files, sw.old_files, sw.opts.timeout_s)
    note(f"gate {sw.gate}: {', '.join(sw.changed) or 'nothing'}")
    return HostOutcome(sw.host, "dry-run", None, changed=sw.changed)


def _stage(sw: _HostSwitch) -> Generation:
    """Record the new generation (gate "pending"), then write the config."""
    suffix = sw.path.suffix or ".toml"
    mode = config_mode(sw.path)
    how = sw.manager.describe()  # recorded with the generation, and as the host's last
    try:
        # A write that fails (a full disk) undoes the others: nothing is activated yet.
        with sw.state.all_or_nothing():
            if sw.current is None and sw.old_files:
                found = GenerationRecord(
                    instances=summary_of(sw.old),
                    gate=GateRecord("unverified"),
                    note="found installed before the first switch",
                )
                sw.state.set_current(
                    sw.state.create(sw.old_files, sw.file_text, suffix, found, mode)
                )
            record = GenerationRecord(
                instances=render_summary(sw.render),
                changed=tuple(sw.changed),
                removed=tuple(sw.removed),
                manager=how,
                gate=GateRecord("pending", sw.gate),
            )
            gen = sw.state.create(sw.new_files, sw.new_text, suffix, record, mode)
            sw.state.set_manager(how)
            crash_point("switch:staged")
            if sw.file_text != sw.new_text:
                write_config(sw.path, sw.new_text)
    except WriteFailed as err:
        [problem] = err.problems
        said = (
            f"{problem.message}; {sw.host} was not switched "
            "(its config and generations are as they were)"
        )
        raise UserError(replace(problem, message=said)) from None
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
        _warm_up(sw)
        early = sw.manager.activate(sw.runner, sw.new_files, sw.activate_from, sw.opts.timeout_s)
        activated_s = time.monotonic() - started
        crash_point("switch:activated")
        if draining is not None:
            sw.gaps.update(draining.gaps)
            for name, gap in sorted(draining.gaps.items()):
                sw.echo(f"  restart {name}: {gap.describe()}")
        if sw.warm is not None:
            sw.warm.settle()
            for name, record in sorted(sw.warm.records.items()):
                sw.echo(f"  {name}: {record.describe()}")
        results = _gate_changed(sw, early, sw.gate, baselines)
    except ExternalCommandError as err:
        results.append(GateResult(sw.host, sw.gate, False, str(err)))
    return results, activated_s


def _gate_changed(
    sw: _HostSwitch, early: dict[str, str], gate: GateKind, baselines: dict[str, Baseline]
) -> list[GateResult]:
    """Gate each changed instance; ``early``: the units that did not start, and why."""
    results: list[GateResult] = []
    if GATEWAY_UNIT in early:
        # Its unit's start check asked LiteLLM itself; a gateway that did not start fails the
        # switch as a server would.
        results.append(
            GateResult(GATEWAY_UNIT, gate, False, f"did not start: {early[GATEWAY_UNIT]}")
        )
    for name in sw.changed:
        if name == GATEWAY_UNIT and unit_name(GATEWAY_UNIT) in sw.new_files:
            continue  # no gate of its own: its unit started, or `early` says why not
        # A member's unit is its router's.
        unit = ROUTER if router_for(sw.config, name) else name
        if unit in early:
            results.append(GateResult(name, gate, False, f"did not start: {early[unit]}"))
            continue
        limits = sw.opts.thresholds(baselines.get(name), sw.request.prompts)
        results.append(run_gate(gate, sw.targets[name], sw.opts.timeout_s, limits))
    return results


def _draining_restart(sw: _HostSwitch) -> DrainingRestart | None:
    """The systemd manager restarts the changed servers one by one, each fenced and drained
    first (hosts.restarts)."""
    if not isinstance(sw.manager, SystemdManager) or sw.runner.dry_run:
        return None
    bridges, no_bridge = _bridges(sw, sw.manager.user) if sw.opts.blue_green else ({}, {})
    old, new = sw.old_serving, sw.new_serving
    sw.manager.restarts = DrainingRestart(
        old=old.endpoints,
        new=new.endpoints,
        drain_timeout_s=sw.opts.drain_timeout_s,
        fence_old=old.fence,
        fence_new=new.fence,
        warm=sw.warm,
        bridges=bridges,
        no_bridge=no_bridge,
    )
    return sw.manager.restarts


def _bridges(sw: _HostSwitch, user: bool) -> tuple[dict[str, Bridge], dict[str, str]]:
    """The bridge of each changed server that can switch blue-green, and why the others
    cannot."""
    bridges: dict[str, Bridge] = {}
    no_bridge: dict[str, str] = {}
    rendered = {r.name: r for r in sw.render.instances}
    for name in sw.changed:
        if name not in rendered or name not in sw.config.instances:
            continue  # the gateway, or a router (its members restart with it)
        why = why_not(sw.config, name, rendered[name].gpu, user)
        if why is None:
            bridges[name] = bridge_for(sw.config, name, user)
        else:
            no_bridge[name] = why
            sw.echo(f"  {name}: not blue-green: {why}")
    return bridges, no_bridge


def _warm_up(sw: _HostSwitch) -> None:
    """``llamanix up`` saves and restores the warm_switch caches around applying a render."""
    if sw.opts.blue_green and not isinstance(sw.manager, SystemdManager):
        sw.echo(f"  not blue-green: the {sw.manager.name} manager restarts the servers itself")
    if isinstance(sw.manager, UpManager) and not sw.runner.dry_run:
        sw.manager.warm = sw.warm
        sw.manager.old = sw.old_serving.endpoints
        sw.manager.new = sw.new_serving.endpoints


def _reverse_restarts(sw: _HostSwitch) -> None:
    """A rollback restarts the same instances the other way: the candidates are the running
    servers (drained and fenced), the previous ones start again."""
    if isinstance(sw.manager, SystemdManager) and sw.manager.restarts is not None:
        sw.manager.restarts = sw.manager.restarts.reversed()
    elif isinstance(sw.manager, UpManager):
        sw.manager.old, sw.manager.new = sw.manager.new, sw.manager.old


def _commit(sw: _HostSwitch, gen: Generation, results: list[GateResult]) -> HostOutcome:
    """Every gate passed: the generation becomes current, and its benches the baselines."""
    crash_point("switch:gate-passed")
    gate = GateRecord("passed", sw.gate, {r.name: r for r in results})
    gen.save(replace(gen.record, gate=gate, gaps=dict(sw.gaps) or None, warm=_warm_records(sw)))
    sw.state.set_current(gen)
    for r in results:
        if r.bench is not None:
            variant = sw.config.instances[r.name].variant
            sw.state.save_baseline(r.name, BaselineRecord.of(r.bench, gen.number, variant))
    return HostOutcome(
        sw.host,
        "passed",
        gen.number,
        changed=sw.changed,
        gates=results,
        gaps=dict(sw.gaps),
        warm=_warm_records(sw) or {},
    )


def _warm_records(sw: _HostSwitch, final: bool = True) -> dict[str, WarmRecord] | None:
    """What the warm switch kept; at the switch's end (``final``), the files no restart took
    are deleted. Before a rollback they wait: its restart restores them into the previous
    generation, whose caches they are."""
    if sw.warm is None:
        return None
    if final:
        sw.warm.discard()
    return dict(sw.warm.records) or None


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
    warm = _warm_records(sw, final=False)
    gen.save(replace(gen.record, gate=failed_gate, gaps=dict(sw.gaps) or None, warm=warm))
    restored = sw.state.current()
    sw.echo(
        f"{sw.host}: gate failed; restoring generation "
        f"{restored.number if restored else 'none (nothing was installed)'}"
    )
    if restore_config and sw.new_text != sw.old_text:  # _stage left the new text there
        write_config(sw.path, sw.old_text)
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
    _reverse_restarts(sw)
    # Only what was installed before can serve again: an instance the failed generation
    # added (every instance, on a first switch) has nothing to wait for.
    was_installed = sw.old.served_names()
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
    if sw.warm is not None:
        sw.warm.discard()
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


def _confirm(
    sw: _HostSwitch,
    gen: Generation,
    results: list[GateResult],
    outcome: HostOutcome,
    restore_config: bool,
) -> HostOutcome:
    """A, B, A: a switch rolled back for a bench regression alone measures the restored
    baseline again. A candidate that matches that second baseline was judged on a machine that
    moved: the verdict is inconclusive, and --on-drift says whether the switch stands (the
    generation is activated again) or stays rolled back."""
    failed = [r for r in results if not r.passed]
    regressed = [r for r in failed if r.bench is not None and r.bench.decision == "regression"]
    if not regressed or len(regressed) != len(failed) or outcome.restore != "serving again":
        return outcome
    old_config = sw.request.old_config
    if old_config is None:
        return outcome
    # One judged against the last good bench's stored runs may have had no instance serving
    # it before this switch: none to measure again, so the rollback stands (before any other
    # is measured for nothing).
    unserved = [r.name for r in regressed if r.name not in sw.old_targets]
    if unserved:
        sw.echo(
            f"  {unserved[0]}: not served before the switch, so not measured again; "
            "the rollback stands"
        )
        return outcome
    on_drift = sw.opts.drift_action()
    checked: dict[str, GateResult] = {}
    for r in regressed:
        assert r.bench is not None
        sw.echo(f"  {r.name}: confirming the regression: the baseline measured again")
        again = measure_baseline(sw.old_targets[r.name], sw.request.prompts)
        if again is None:
            sw.echo(f"  baseline {r.name}: not answering; the rollback stands")
            return outcome
        sw.echo(
            f"  baseline {r.name} again: {len(again.samples)} runs, decode "
            f"{', '.join(f'{v:.1f}' for v in again.samples)} tok/s"
        )
        verdict = confirm_regression(r.bench, again, on_drift)
        passed = verdict.action == "keep"
        checked[r.name] = GateResult(r.name, r.gate, passed, verdict.note, r.tok_s, bench=verdict)
        said = verdict.note if verdict.drifted else f"{verdict.verdict}: {verdict.note}"
        sw.echo(f"  gate {r.gate} {r.name}: {said}")
    rechecked = [checked.get(r.name, r) for r in results]
    gate = GateRecord("failed", sw.gate, {r.name: r for r in rechecked})
    gen.save(replace(gen.record, gate=gate))
    if not all(r.passed for r in rechecked):
        first = next(r for r in rechecked if not r.passed)
        detail = f"{first.name}: {first.detail}; previous generation serving again"
        return replace(outcome, gates=rechecked, detail=detail)
    return _reapply(sw, gen, rechecked, restore_config)


def _reapply(
    sw: _HostSwitch, gen: Generation, results: list[GateResult], restore_config: bool
) -> HostOutcome:
    """Activate the generation a drifted verdict let stand, once more, and check it serves."""
    sw.echo(
        f"{sw.host}: the baseline moved, not the change (--on-drift keep): activating "
        f"generation {gen.number} again"
    )
    if restore_config and sw.new_text != sw.old_text:
        write_config(sw.path, sw.new_text)
    _reverse_restarts(sw)
    started = time.monotonic()
    try:
        early = sw.manager.activate(sw.runner, sw.new_files, sw.old_files, sw.opts.timeout_s)
        health = _gate_changed(sw, early, "health", {})
    except ExternalCommandError as err:
        health = [GateResult(sw.host, "health", False, str(err))]
    for r in health:
        sw.echo(f"  gate health {r.name}: {'passed' if r.passed else 'FAILED'}: {r.detail}")
    if all(r.passed for r in health):
        outcome = _commit(sw, gen, results)
        return replace(outcome, out_of_service_s=time.monotonic() - started)
    return _restore(sw, gen, health, True, restore_config, started)
