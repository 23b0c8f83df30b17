"""rollback: serve an earlier generation of a host of this machine again, and put its config
back; from a request already read and locked (switch.request). A remote plain-systemd host
rolls back by its own llamanix (fleet)."""

from __future__ import annotations

from dataclasses import replace

from llamanix.core import file_reader
from llamanix.core.errors import ExternalCommandError, Problem, UserError
from llamanix.external.clock import now
from llamanix.external.process import Runner
from llamanix.hosts.leftovers import scope_of, tidy_machine
from llamanix.hosts.managers import as_installed, make_manager
from llamanix.render.changes import diff_files
from llamanix.state.config_edit import write_config
from llamanix.state.crash_point import crash_point
from llamanix.state.generations import Generation, HostState
from llamanix.switch.request import RollbackRequest
from llamanix.switch.serving import check_serving
from llamanix.switch.switch_records import Echo


def rollback_host(request: RollbackRequest, runner: Runner, echo: Echo) -> Generation:
    """Serve ``opts.to`` (None: the newest good generation before the current) again."""
    path, name, opts = request.path, request.host, request.opts
    timeout_s = opts.timeout_s
    state = HostState.beside(path, name)
    current = state.current()
    found = (
        state.get(opts.to)
        if opts.to is not None
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
    manager = make_manager(request.config, name, state, opts.manager, opts.units_dir)
    manager.preflight(runner)
    new = target.render_files()
    new_files = new.files
    recorded = current.render_files() if current else manager.installed()
    old, _ = as_installed(manager, recorded, new_files)
    old_files = old.files
    snapshot = target.config_snapshot()
    snapshot_text = (
        file_reader.read_text(snapshot, source=str(snapshot)) if snapshot is not None else None
    )
    echo(f"{name}: rolling back to generation {target.number} via {manager.name}")
    if not runner.dry_run:
        # What a switch that did not finish left with these units (fences, redirects, a
        # bridge, slot files) goes first: the lock is ours, no switch is under way.
        for line in tidy_machine(scope_of(manager), runner):
            echo(f"  {line}")
    if runner.dry_run:
        if snapshot_text is not None:
            runner.note(f"write {path}")
    elif snapshot_text is not None:
        write_config(path, snapshot_text)
        crash_point("rollback:config-written")
    if manager.restores_the_previous_generation and opts.to is None:
        manager.restore(runner, new_files, old_files, timeout_s)
    else:
        failed = manager.activate(runner, new_files, old_files, timeout_s)
        if failed:
            raise ExternalCommandError(f"generation {target.number} did not start: {failed}")
        crash_point("rollback:activated")
    changed, _ = diff_files(new, old)
    if runner.dry_run:
        # The steps after the commands, as a real rollback takes them.
        runner.note(f"check {', '.join(changed) or 'nothing'}: serving again (health, one chat)")
        runner.note(f"record generation {target.number} as the current one")
        return target
    # The generation's config is parsed only when an instance changed (to reach it).
    target_config = request.config_of(snapshot_text) if snapshot_text and changed else None
    serving, _ = check_serving(target_config, changed, timeout_s, echo)
    state.set_current(target)
    target.save(replace(target.record, activated_again=now()))
    if not serving:
        raise ExternalCommandError(f"generation {target.number} is installed but not answering")
    return target
