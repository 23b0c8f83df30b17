"""switch, rollback and pin: change what a host runs, gate it, and undo it when the gate fails.

A switch renders the changed config in memory (a bad value stops it before anything is
written), records the render as a new numbered generation, writes the config atomically, hands
the render to the host's manager (nixos-rebuild, systemctl, or a running ``llamanix up``), and
runs the gate against every instance that changed. If the gate fails, the config goes back, the
manager restores the previous generation, and the previous instances are checked over HTTP
before the switch reports failure (exit 1).
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol, TypeVar

from llamanix.core.address import connect_url, is_loopback, is_wildcard, url_host
from llamanix.core.api_key import key_if_readable
from llamanix.core.config import Config, Router
from llamanix.core.errors import ExternalCommandError, Problem, UserError
from llamanix.core.host_choice import pick_host
from llamanix.core.probe import commit_of
from llamanix.core.variants import VARIANTS
from llamanix.deploy import gateway_venv
from llamanix.deploy.binary_dialect import refuse_other_dialect
from llamanix.deploy.config_edit import (
    ConfigText,
    apply_sets,
    lenient_parse,
    parse_text,
    read_config,
)
from llamanix.deploy.crash_point import crash_point
from llamanix.deploy.gap_records import GapRecord
from llamanix.deploy.gate import (
    GatePrompts,
    GateTarget,
    measure_baseline,
    run_gate,
)
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
    ManagerKind,
    RollbackRecord,
)
from llamanix.deploy.host_lock import host_lock
from llamanix.deploy.host_render import render_host
from llamanix.deploy.managers import (
    Manager,
    SystemdManager,
    diff_files,
    diff_instances,
    make_manager,
    refuse_router_under_up,
    served_names,
    summary_of,
)
from llamanix.deploy.remote import remote_host, remote_rollback, remote_switch
from llamanix.deploy.restarts import DrainingRestart
from llamanix.deploy.switch_records import Echo as Echo
from llamanix.deploy.switch_records import HostOutcome as HostOutcome
from llamanix.deploy.switch_records import Outcome as Outcome
from llamanix.deploy.switch_records import SwitchOptions as SwitchOptions
from llamanix.external import nix
from llamanix.external.clock import now
from llamanix.external.files import atomic_write
from llamanix.external.llama_server import binary_version_line
from llamanix.external.process import Runner
from llamanix.measure.drain import Endpoint
from llamanix.render.gateway import UNIT_NAME as GATEWAY_UNIT
from llamanix.render.manifest import Render, RenderedInstance, same_unit, unit_name
from llamanix.render.units import ROUTER

# switch's host that means every host of the config, in config order.
ALL_HOSTS = "all"


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


@dataclass(frozen=True)
class SwitchRequest:
    """One switch as read: the config file, the text with --set applied and its parse, the
    hosts it switches (in config order) and the options. Made once, with the hosts' locks held
    (see ``_read_locked``); every stage takes what it needs from here, so nothing reads or parses
    the config again."""

    source: ConfigText  # the file as read: the text a failed gate puts back
    new_text: str
    config: Config  # new_text, parsed
    hosts: tuple[str, ...]
    opts: SwitchOptions
    gate: GateKind

    @staticmethod
    def read(
        path: Path, host: str | None, opts: SwitchOptions, new_text: str | None = None
    ) -> SwitchRequest:
        """Read the file, apply --set and parse (every value checked before anything is
        written); ``host``: a name, ``all``, or None for the config's only host. ``new_text``:
        the text to switch to in place of the file's with --set applied (a remote host's agent
        gets it from the switch that runs there over ssh)."""
        source = read_config(path)
        if new_text is None:
            new_text = apply_sets(path, source.text, opts.sets)
        config = parse_text(path, new_text)
        hosts = tuple(config.hosts) if host == ALL_HOSTS else (pick_host(config, host),)
        return SwitchRequest(source, new_text, config, hosts, opts, opts.gate_kind(str(path)))

    @property
    def path(self) -> Path:
        return self.source.path

    @property
    def old_text(self) -> str:
        return self.source.text

    @functools.cached_property
    def old_config(self) -> Config | None:
        """The config before --set, for the instances it ran (a baseline measured on them, and
        whether they serve again after a failed gate): the one parse when --set changed
        nothing, else that text parsed on first use; None when it is not valid."""
        if self.old_text == self.new_text:
            return self.config
        return lenient_parse(self.path, self.old_text)


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
            sw.opts.bench_prompts(),
        )
    # The gateway's LiteLLM is installed before anything is staged: a failed install leaves
    # the host as it was.
    gateway_venv.ensure_for(sw.runner, sw.manager.name, sw.new_files)
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
    render = with_source_revisions(render_host(config, host), config, manager.runs_flake_packages)
    if not manager.runs_flake_packages:
        refuse_other_dialect(config, host)
    new_files = render.files()
    current = state.current()
    old_files = current.files() if current else manager.installed()
    changed, removed = diff_instances(render, old_files)
    changed, removed = _gateway_changes(render, old_files, changed, removed)
    activate_from, drifted = (
        _as_installed(manager, old_files, new_files) if current else (old_files, [])
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
        new_files=new_files,
        old_files=old_files,
        activate_from=activate_from,
        changed=changed,
        removed=removed,
        file_text=file_text,
    )


def _gateway_changes(
    render: Render, old: dict[str, str], changed: list[str], removed: list[str]
) -> tuple[list[str], list[str]]:
    """The gateway's unit counts as a change of its own (its start check is its gate)."""
    unit = unit_name(GATEWAY_UNIT)
    if render.gateway is not None and not same_unit(old.get(unit), render.gateway.unit_text):
        changed = sorted({*changed, GATEWAY_UNIT})
    if render.gateway is None and unit in old:
        removed = sorted({*removed, GATEWAY_UNIT})
    return changed, removed


def _dry_run(sw: _HostSwitch) -> HostOutcome:
    if sw.file_text != sw.new_text:
        sw.runner.note(f"write {sw.path}")
    gateway_venv.ensure_for(sw.runner, sw.manager.name, sw.new_files)
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
            unit = ROUTER if _router_for(sw.config, name) else name
            if unit in early:
                results.append(GateResult(name, sw.gate, False, f"did not start: {early[unit]}"))
                continue
            limits = sw.opts.thresholds(baselines.get(name))
            target = gate_target(sw.config, name)
            results.append(run_gate(sw.gate, target, sw.opts.timeout_s, limits))
    except ExternalCommandError as err:
        results.append(GateResult(sw.host, sw.gate, False, str(err)))
    return results, activated_s


def _endpoints(config: Config | None, host: str) -> dict[str, Endpoint]:
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


def _draining_restart(sw: _HostSwitch) -> DrainingRestart | None:
    """The systemd manager restarts the changed servers one by one, each drained first."""
    if not isinstance(sw.manager, SystemdManager) or sw.runner.dry_run:
        return None
    sw.manager.restarts = DrainingRestart(
        old=_endpoints(sw.request.old_config, sw.host),
        new=_endpoints(sw.config, sw.host),
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
        return HostOutcome(sw.host, "failed", gen.number, detail, sw.changed, results, None, 0.0)
    crash_point("switch:restoring")
    # Only what was installed before can serve again: an instance the failed generation
    # added (every instance, on a first switch) has nothing to wait for.
    was_installed = served_names(sw.old_files)
    to_serve = sorted(n for n in set(sw.changed) | set(sw.removed) if n in was_installed)
    try:
        sw.manager.restore(sw.runner, sw.old_files, sw.new_files, sw.opts.timeout_s)
        # The config before --set is parsed only when something is to serve again.
        old_config = sw.request.old_config if to_serve else None
        serving, _ = _check_serving(old_config, to_serve, sw.opts.timeout_s, sw.echo)
    except ExternalCommandError as err:
        sw.echo(f"  restore failed: {err}")
        serving = False
    gen.save(replace(gen.record, rollback=RollbackRecord(serving)))
    if not was_installed:
        again = "none (nothing was installed), so nothing serves"
    else:
        again = "serving again" if serving else "NOT answering"
    detail = f"{failed.name}: {failed.detail}; previous generation {again}"
    back_s = time.monotonic() - started if was_installed and serving else None
    return HostOutcome(
        sw.host, "failed", gen.number, detail, sw.changed, results, None, back_s, dict(sw.gaps)
    )


def _recover(state: HostState, echo: Echo) -> None:
    """Tidy what a killed switch or rollback of this host left (the caller holds the lock)."""
    for note in state.recover():
        echo(f"{state.host}: {note}")


class _Request(Protocol):
    """What ``_read_locked`` needs of a request: the file as read, and the hosts to lock."""

    @property
    def source(self) -> ConfigText: ...

    @property
    def hosts(self) -> tuple[str, ...]: ...


_R = TypeVar("_R", bound=_Request)


def _read_locked(
    read: Callable[[], _R], locks: ExitStack, wait_s: float, command: str, echo: Echo
) -> _R:
    """The request, read once, with its hosts' locks held (in ``locks``) and what a killed
    command left tidied.

    Which locks to take follows from the config (``all``, or its only host when none is
    named), so the request is read before them: with the locks held, the file's stamp says
    whether it still holds the text read, and only when another command wrote it meanwhile
    (the switch a --wait waited for) is it read again, its hosts' locks taken anew. So an
    uncontended switch or rollback reads and parses the config once, and none works from a
    text the file no longer holds once the locks are held.
    """
    request = read()
    locked: tuple[str, ...] = ()
    while True:
        if request.hosts != locked:
            locks.close()
            path = request.source.path
            for name in request.hosts:  # always in config order, so two callers cannot deadlock
                state = HostState.beside(path, name)
                locks.enter_context(
                    host_lock(state.root, f"host {name}", str(path), wait_s, command=command)
                )
                _recover(state, echo)
            locked = request.hosts
        if request.source.unchanged():
            return request
        request = read()


def switch(
    path: Path,
    host: str | None,
    opts: SwitchOptions,
    runner: Runner,
    echo: Echo,
    new_text: str | None = None,
) -> list[HostOutcome]:
    """Switch one host (None: the config's only one), or every host in order (``all``),
    stopping at the first failure. ``new_text``: switch to this text instead of the file's
    with --set applied.

    Each host's lock is held for the whole switch (--wait: how long to wait for another
    switch, rollback or pin to finish), the config read under it (see ``_read_locked``); a dry
    run changes nothing and locks nothing."""
    opts.gate_kind(str(path))  # bad options: one line before anything is read or locked

    def read() -> SwitchRequest:
        return SwitchRequest.read(path, host, opts, new_text)

    if runner.dry_run:
        return _switch_hosts(read(), runner, echo)
    with ExitStack() as locks:
        request = _read_locked(read, locks, opts.wait_s, "switch", echo)
        return _switch_hosts(request, runner, echo)


def _switch_hosts(request: SwitchRequest, runner: Runner, echo: Echo) -> list[HostOutcome]:
    outcomes: list[HostOutcome] = []
    for name in request.hosts:
        first = not any(o.result == "passed" for o in outcomes)
        # The file holds the text read until a host's switch passes with the new one.
        file_text = request.old_text if first else request.new_text
        outcome = switch_any_host(request, name, file_text, runner, echo, restore_config=first)
        outcomes.append(outcome)
        if not outcome.ok:
            if not first:
                echo(
                    f"note: {request.path} keeps the change: hosts "
                    f"{', '.join(o.host for o in outcomes if o.result == 'passed')} run it; "
                    f"fix it and switch {name} again"
                )
            break
    return outcomes


def switch_any_host(
    request: SwitchRequest,
    name: str,
    file_text: str,
    runner: Runner,
    echo: Echo,
    restore_config: bool = True,
) -> HostOutcome:
    """Switch one host, here (``switch_host``) or, for a remote plain-systemd host, by its own
    llamanix over ssh (``remote_switch``: it keeps its generations and restores itself when
    its gate fails). Once a remote host passes, the config file gets the new text, as a local
    host's switch writes it; one that fails leaves the file alone, so ``restore_config`` has
    nothing to put back. ``RemoteUnreachable`` when ssh cannot reach the host."""
    rh = remote_host(request.config, name)
    if rh is None:
        return switch_host(request, name, file_text, runner, echo, restore_config)
    outcome = remote_switch(rh, request.new_text, request.opts, runner, echo)
    if file_text != request.new_text:
        if runner.dry_run:
            runner.note(f"write {request.path} once {name} passes")
        elif outcome.result == "passed":
            atomic_write(request.path, request.new_text)
    return outcome


# --- rollback --------------------------------------------------------------------------------


@dataclass(frozen=True)
class RollbackRequest:
    """One rollback as read: the config file, its parse, the host and the options. Made once,
    with the host's lock held (see ``_read_locked``)."""

    source: ConfigText
    config: Config
    host: str
    to: int | None
    manager: ManagerKind | None
    units_dir: Path | None
    timeout_s: float

    @staticmethod
    def read(
        path: Path,
        host: str | None,
        to: int | None,
        manager: ManagerKind | None,
        units_dir: Path | None,
        timeout_s: float,
    ) -> RollbackRequest:
        source = read_config(path)
        config = parse_text(path, source.text)
        return RollbackRequest(
            source, config, pick_host(config, host), to, manager, units_dir, timeout_s
        )

    @property
    def hosts(self) -> tuple[str, ...]:
        return (self.host,)

    @property
    def path(self) -> Path:
        return self.source.path

    def config_of(self, text: str) -> Config | None:
        """A generation's config: the parse already made when it is the file's text, else
        ``text`` parsed (None when it is not valid)."""
        return self.config if text == self.source.text else lenient_parse(self.path, text)


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
) -> int | None:
    """Serve an earlier generation again (``to``; None: the newest good one before the
    current) and put its config back: the generation now serving (None after a dry run of a
    remote host's)."""

    def read() -> RollbackRequest:
        return RollbackRequest.read(path, host, to, manager_name, units_dir, timeout_s)

    if runner.dry_run:
        return _rollback_any(read(), runner, echo)
    with ExitStack() as locks:
        return _rollback_any(_read_locked(read, locks, wait_s, "rollback", echo), runner, echo)


def _rollback_any(request: RollbackRequest, runner: Runner, echo: Echo) -> int | None:
    """The generation now serving (None: a dry run of a remote host's rollback). A remote
    plain-systemd host rolls back by its own llamanix over ssh, from its own generations; the
    config file here is left as it is (it names every host, the generation's copy there
    names that one as local)."""
    rh = remote_host(request.config, request.host)
    if rh is None:
        return _rollback(request, runner, echo).number
    if request.manager is not None or request.units_dir is not None:
        raise UserError(
            Problem(
                str(request.path),
                f"hosts.{rh.name}.target",
                "--manager and --units-dir are for hosts switched from this machine; "
                f"{rh.name} is rolled back by its own llamanix over ssh",
                "leave them out",
            )
        )
    outcome = remote_rollback(rh, request.to, request.timeout_s, runner, echo)
    if runner.dry_run:
        return None
    if not outcome.ok:
        raise ExternalCommandError(f"{rh.name}: {outcome.detail}")
    return outcome.generation


def _rollback(request: RollbackRequest, runner: Runner, echo: Echo) -> Generation:
    path, name, timeout_s = request.path, request.host, request.timeout_s
    state = HostState.beside(path, name)
    current = state.current()
    found = (
        state.get(request.to)
        if request.to is not None
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
    manager = make_manager(request.config, name, state, request.manager, request.units_dir)
    manager.preflight(runner)
    new_files = target.files()
    old_files = current.files() if current else manager.installed()
    old_files, _ = _as_installed(manager, old_files, new_files)
    snapshot = target.config_snapshot()
    snapshot_text = snapshot.read_text() if snapshot is not None else None
    echo(f"{name}: rolling back to generation {target.number} via {manager.name}")
    if runner.dry_run:
        if snapshot_text is not None:
            runner.note(f"write {path}")
    elif snapshot_text is not None:
        atomic_write(path, snapshot_text)
        crash_point("rollback:config-written")
    if manager.restores_the_previous_generation and request.to is None:
        manager.restore(runner, new_files, old_files, timeout_s)
    else:
        failed = manager.activate(runner, new_files, old_files, timeout_s)
        if failed:
            raise ExternalCommandError(f"generation {target.number} did not start: {failed}")
        crash_point("rollback:activated")
    if runner.dry_run:
        return target
    changed, _ = diff_files(new_files, old_files)
    # The generation's config is parsed only when an instance changed (to reach it).
    target_config = request.config_of(snapshot_text) if snapshot_text and changed else None
    serving, _ = _check_serving(target_config, changed, timeout_s, echo)
    state.set_current(target)
    target.save(replace(target.record, activated_again=now()))
    if not serving:
        raise ExternalCommandError(f"generation {target.number} is installed but not answering")
    return target


# The rolling switch (deploy.fleet) reads and locks its hosts as switch and rollback do, and
# rolls hosts back under the locks it holds.
read_locked = _read_locked
rollback_locked = _rollback
