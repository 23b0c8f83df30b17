"""``llamanix tidy``: after a switch or rollback that did not finish (SIGKILL, the OOM killer,
a reboot), remove everything it left and serve the host's current generation again.

Under the host's lock and its units' lock (so no switch is under way), in this order:

1. the host's state: a generation's staging directory, atomic writes' temporary files (the
   config's too), a generation still "pending" marked "interrupted" (``HostState.recover``);
2. the machine's, with these units: fences and redirects, a blue-green bridge (stopped, its
   unit file and directories removed), warm-switch slot files (``leftovers.tidy_machine``);
3. the units: those a killed switch installed or added are written back as the current
   generation records them, and every unit of it that does not run is started
   (``leftovers.restore_current``); then each instance touched must answer over HTTP.

It never changes the config: one a killed switch wrote holds the change it was making, which
the next ``switch`` applies (or ``rollback --to N`` puts back); tidy says which.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llamanix.config.model import Config
from llamanix.core.errors import ExternalCommandError, Problem, UserError
from llamanix.external.process import Runner
from llamanix.hosts.leftovers import Scope, local_scope, restore_current, tidy_host, tidy_machine
from llamanix.hosts.managers import make_manager
from llamanix.state.config_edit import ConfigText, lenient_parse, parse_text, read_config
from llamanix.state.generations import HostState
from llamanix.switch.request import HostChoice, locked
from llamanix.switch.serving import check_serving
from llamanix.switch.switch_records import Echo


@dataclass(frozen=True)
class TidyRequest:
    """One tidy as read: the config file, its parse and the host (one)."""

    source: ConfigText
    config: Config
    hosts: tuple[str, ...]
    which: HostChoice  # how the host was asked for, so that read_again asks the same way

    @staticmethod
    def read(path: Path, which: HostChoice) -> TidyRequest:
        source = read_config(path)
        config = parse_text(path, source.text)
        hosts = which.hosts_of(config)
        target = config.hosts[hosts[0]].target
        if target is not None:
            raise UserError(
                Problem(
                    str(path),
                    f"hosts.{hosts[0]}.target",
                    "tidy works on this machine's units, and this host's are on "
                    f"{target.destination}",
                    f"run llamanix tidy on {target.destination}",
                )
            )
        return TidyRequest(source, config, hosts, which)

    def read_again(self) -> TidyRequest:
        """The request read anew from the file (another command wrote it meanwhile)."""
        return TidyRequest.read(self.path, self.which)

    @property
    def path(self) -> Path:
        return self.source.path

    @property
    def host(self) -> str:
        return self.hosts[0]

    def units_scope(self, host: str) -> Scope | None:
        return local_scope(self.path, self.config, host)


def tidy(
    path: Path, host: str | None, timeout_s: float, wait_s: float, runner: Runner, echo: Echo
) -> bool:
    """Tidy one host of this machine (None: the config's only one); whether its current
    generation serves after."""

    # locked takes the locks and already tidies the host's state (step 1).
    request = TidyRequest.read(path, HostChoice(host))
    with locked(request, dry_run=False, wait_s=wait_s, command="tidy", echo=echo) as request:
        return _tidy_locked(request, timeout_s, runner, echo)


def _tidy_locked(request: TidyRequest, timeout_s: float, runner: Runner, echo: Echo) -> bool:
    name = request.host
    state = HostState.beside(request.path, name)
    scope = request.units_scope(name)
    assert scope is not None  # TidyRequest.read refused a host of another machine
    for note in tidy_host(state, request.path):
        echo(f"{name}: {note}")
    for line in tidy_machine(scope, runner):
        echo(f"{name}: {line}")
    manager = make_manager(request.config, name, state, None, None)
    restored = restore_current(state, manager, runner, timeout_s)
    for line in restored.lines:
        echo(f"{name}: {line}")
    current = restored.generation
    if current is None:
        return True
    serving = True
    if restored.touched:
        snapshot = current.config_snapshot()
        text = snapshot.read_text() if snapshot is not None else None
        config = lenient_parse(request.path, text) if text is not None else None
        try:
            serving, _ = check_serving(config, list(restored.touched), timeout_s, echo)
        except ExternalCommandError as err:
            echo(f"{name}: {err}")
            serving = False
    snapshot = current.config_snapshot()
    if snapshot is not None and snapshot.read_text() != request.source.text:
        echo(
            f"{name}: {request.path} holds a change generation {current.number} does not have "
            f"(`llamanix switch {request.path}` applies it, `llamanix rollback {request.path} "
            f"--to {current.number}` puts it back)"
        )
    said = "serving" if serving else "NOT answering"
    echo(f"{name}: generation {current.number} is current, {said}")
    return serving
