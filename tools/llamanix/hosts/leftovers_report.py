"""``doctor``'s ``leftovers`` check: what a switch of a host of the config that did not finish
left on this machine (``hosts.leftovers`` finds it), one finding each. Its own module: only
doctor loads the doctor's records."""

from __future__ import annotations

from pathlib import Path

from llamanix.config.model import Config
from llamanix.core.errors import ExternalCommandError
from llamanix.diagnose.doctor import Finding, FindingCode, Report
from llamanix.hosts.leftovers import LeftoverKind, Scope, look_host, look_machine, scope_of
from llamanix.hosts.managers import make_manager
from llamanix.state.generations import HostState
from llamanix.state.host_lock import LOCK_FILE, holder_of, units_holder

_CODES: dict[LeftoverKind, FindingCode] = {
    "fence": "leftover-fence",
    "redirect": "leftover-redirect",
    "bridge": "leftover-bridge",
    "bridge-files": "leftover-bridge-files",
    "slot-files": "leftover-slot-files",
    "staging": "leftover-staging",
    "temporary-file": "leftover-temporary-file",
    "pending": "leftover-pending",
    "unit-differs": "unit-differs",
    "unit-not-running": "unit-not-running",
}


def _under_way(state: HostState, scope: Scope) -> str | None:
    """Who is switching the host or its units now (what they have up is theirs, not left)."""
    for holder in (holder_of(state.root / LOCK_FILE), units_holder(scope.units_dir)):
        if holder is not None:
            return holder.describe()
    return None


def report_leftovers(report: Report, config: Config, path: Path) -> None:
    """``doctor``'s ``leftovers`` check: for each host of ``config`` switched from this
    machine (it has a state directory beside the config), every thing a switch that did not
    finish left, one error finding each; a tool that fails to say what is there is an error
    too, and what could not be looked at (not root) a warning."""
    several = len(config.hosts) > 1
    for host, table in config.hosts.items():
        state = HostState.beside(path, host)
        if table.target is not None or not state.root.is_dir():
            continue
        manager = make_manager(config, host, state, None, None)
        scope = scope_of(manager)
        busy = _under_way(state, scope)
        if busy is not None:
            report.skipped("leftovers", f"{busy} is under way: what it has up is not left over")
            continue
        fix = f"llamanix tidy {path}{f' --host {host}' if several else ''}"
        try:
            look = look_host(state, path, manager)
            machine = look_machine(scope)
        except ExternalCommandError as err:
            report.ran("leftovers", "finding")
            report.findings.append(
                Finding(
                    "error",
                    "leftovers-unknown",
                    None,
                    f"host {host}: cannot tell what a switch that did not finish left: {err}",
                    "make the command above work, then run doctor again",
                )
            )
            continue
        found = [*machine.found, *look.found]
        for item in found:
            report.findings.append(
                Finding(
                    "error",
                    _CODES[item.kind],
                    item.instance,
                    f"host {host}: {item.what}, left by a switch or rollback that did not finish",
                    f"`{fix}` removes what was left and serves generation(s) as recorded "
                    "(the next switch or rollback removes what was left too)",
                )
            )
        for what in [*machine.unlooked, *look.unlooked]:
            report.findings.append(
                Finding(
                    "warning",
                    "leftovers-unknown",
                    None,
                    f"host {host}: could not look for {what}",
                    "run llamanix doctor as root",
                )
            )
        report.ran("leftovers", "finding" if found else "ok")
