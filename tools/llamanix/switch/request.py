"""A switch or a rollback as read: the config file once, its parse, the hosts it touches and the
options, with those hosts' locks held.

Every stage of a switch (switch.transaction here, fleet over ssh) and of a rollback
(switch.rollback) takes what it needs from the request, so nothing reads or parses the config
again.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol, Self, TypeVar

from llamanix.config.host_choice import pick_host
from llamanix.config.model import Config, suggest
from llamanix.core.errors import Problem, UserError
from llamanix.hosts.leftovers import Scope, local_scope
from llamanix.render.host_render import render_known_host
from llamanix.render.manifest import Render
from llamanix.state.config_edit import (
    ConfigText,
    apply_sets,
    lenient_parse,
    parse_text,
    read_config,
    rewrite_problem,
)
from llamanix.state.gate_records import GateKind
from llamanix.state.generations import HostState
from llamanix.state.host_lock import host_lock, units_lock
from llamanix.switch.gate import GatePrompts
from llamanix.switch.switch_records import Echo, RollbackOptions, SwitchOptions


@dataclass(frozen=True)
class SwitchRequest:
    """One switch as read: the config file, the text with --set applied and its parse, the
    hosts it switches (in config order) and the options. Made once, with the hosts' locks held
    (see ``locked``)."""

    source: ConfigText  # the file as read: the text a failed gate puts back
    new_text: str
    config: Config  # new_text, parsed
    hosts: tuple[str, ...]  # in config order: the order their locks are taken in
    order: tuple[str, ...]  # the order they are switched in (--hosts' own)
    opts: SwitchOptions
    gate: GateKind
    # Each host this machine switches, rendered once (a remote plain-systemd host renders
    # its own): a bad value of any host stops the switch before anything is written.
    renders: Mapping[str, Render]
    # The bench gate's prompts (--gate-prompts), loaded once; None: the default.
    prompts: GatePrompts | None
    # How it was read, so that read_again reads it the same way: the hosts asked for, and the
    # text given in place of the file's (None: the file's with --set applied).
    which: HostChoice
    given_text: str | None

    @staticmethod
    def read(
        path: Path, which: HostChoice, opts: SwitchOptions, given_text: str | None = None
    ) -> SwitchRequest:
        """Read the file, apply --set, parse and render (every value checked before anything
        is written). ``given_text``: the text to switch to in place of the file's with --set
        applied (a remote host's agent gets it from the switch that runs there over ssh)."""
        # Bad options: one line before anything is read or locked.
        gate, prompts = opts.gate_of(str(path))
        source = read_config(path)
        new_text = apply_sets(path, source.text, opts.sets) if given_text is None else given_text
        config = parse_text(path, new_text)
        if new_text != source.text:
            cannot = rewrite_problem(path)
            if cannot is not None:
                raise UserError(cannot)
        order = which.hosts_of(config)
        renders = {
            h: render_known_host(config, h) for h in order if not config.hosts[h].runs_own_switch
        }
        hosts = tuple(h for h in config.hosts if h in order)
        return SwitchRequest(
            source, new_text, config, hosts, order, opts, gate, renders, prompts, which, given_text
        )

    def read_again(self) -> SwitchRequest:
        """The request read anew from the file (another command wrote it meanwhile)."""
        return SwitchRequest.read(self.path, self.which, self.opts, self.given_text)

    @property
    def path(self) -> Path:
        return self.source.path

    def units_scope(self, host: str) -> Scope | None:
        """The units on this machine that switching ``host`` changes (None: another
        machine's)."""
        return local_scope(self.path, self.config, host, self.opts.manager, self.opts.units_dir)

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


@dataclass(frozen=True)
class HostChoice:
    """Which hosts a command works on: ``--host`` (a name, or None for the config's only
    host), or ``--hosts a,b`` (in the order given; None with ``--all-hosts``, or
    ``--host all``)."""

    host: str | None = None
    hosts: str | None = None
    several: bool = False  # --hosts or --all-hosts

    def hosts_of(self, config: Config) -> tuple[str, ...]:
        """The hosts, in the order they are worked on."""
        if self.several:
            every = tuple(config.hosts)
            return every if self.hosts is None else parse_hosts(self.hosts, every, config.source)
        return (pick_host(config, self.host),)


def parse_hosts(text: str, known: Sequence[str], source: str) -> tuple[str, ...]:
    """``--host a,b,c``: names of the config's hosts, each once, in the order given."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise UserError(Problem(source, "--host", "names no host", "e.g. --host gpu1,gpu2"))
    for name in names:
        if name not in known:
            raise UserError(
                Problem(
                    source,
                    "--host",
                    f"no host '{name}' in the config",
                    suggest(name, tuple(known)),
                )
            )
    seen = [n for i, n in enumerate(names) if n in names[:i]]
    if seen:
        raise UserError(
            Problem(source, "--host", f"'{seen[0]}' is named twice", "name each host once")
        )
    return names


@dataclass(frozen=True)
class RollbackRequest:
    """One rollback as read: the config file, its parse, the hosts (in config order; one, but
    for ``rollback --hosts``) and the options. Made once, with the hosts' locks held (see
    ``locked``)."""

    source: ConfigText
    config: Config
    hosts: tuple[str, ...]  # in config order: the order their locks are taken in
    order: tuple[str, ...]  # the order they are rolled back in
    opts: RollbackOptions
    which: HostChoice  # how the hosts were asked for, so that read_again asks the same way

    @staticmethod
    def read(path: Path, which: HostChoice, opts: RollbackOptions) -> RollbackRequest:
        source = read_config(path)
        config = parse_text(path, source.text)
        order = which.hosts_of(config)
        hosts = tuple(h for h in config.hosts if h in order)
        return RollbackRequest(source, config, hosts, order, opts, which)

    def read_again(self) -> RollbackRequest:
        """The request read anew from the file (another command wrote it meanwhile)."""
        return RollbackRequest.read(self.path, self.which, self.opts)

    @property
    def host(self) -> str:
        """The host of a rollback of one."""
        return self.hosts[0]

    def of(self, host: str) -> RollbackRequest:
        """The rollback of ``host`` alone."""
        return replace(self, hosts=(host,), order=(host,), which=HostChoice(host))

    @property
    def path(self) -> Path:
        return self.source.path

    def units_scope(self, host: str) -> Scope | None:
        """The units on this machine that rolling ``host`` back changes (None: another
        machine's)."""
        return local_scope(self.path, self.config, host, self.opts.manager, self.opts.units_dir)

    def config_of(self, text: str) -> Config | None:
        """A generation's config: the parse already made when it is the file's text, else
        ``text`` parsed (None when it is not valid)."""
        return self.config if text == self.source.text else lenient_parse(self.path, text)


def _recover(state: HostState, echo: Echo) -> None:
    """Tidy what a killed switch or rollback of this host left (the caller holds the lock)."""
    for note in state.recover():
        echo(f"{state.host}: {note}")


class _Request(Protocol):
    """What ``locked`` needs of a request: the file as read, the hosts to lock, and how to
    read it again."""

    @property
    def source(self) -> ConfigText: ...

    @property
    def hosts(self) -> tuple[str, ...]: ...

    def units_scope(self, host: str) -> Scope | None: ...

    def read_again(self) -> Self: ...


_R = TypeVar("_R", bound=_Request)


@contextmanager
def locked(request: _R, *, dry_run: bool, wait_s: float, command: str, echo: Echo) -> Iterator[_R]:
    """The request with its hosts' (and their units') locks held while the block runs; a dry
    run changes nothing and takes no lock. Every command that changes a host (switch,
    rollback, tidy, one host or several) goes through here::

        request = SwitchRequest.read(path, HostChoice(host), opts)
        with locked(request, dry_run=False, wait_s=0, command="switch", echo=echo) as request:
            ...  # switch it

    Which locks to take follows from the config (``all``, or its only host when none is
    named), so the request is read before them: with the locks held, the file's stamp says
    whether it still holds the text read, and only when another command wrote it meanwhile
    (the switch a --wait waited for) is it read again, its hosts' locks taken anew. So an
    uncontended switch or rollback reads and parses the config once, and none works from a
    text the file no longer holds once the locks are held.
    """
    if dry_run:
        yield request
        return
    # Units' locks are released first, and taken after the hosts', so nobody waits for a
    # host's lock while holding units.
    with ExitStack() as host_locks, ExitStack() as unit_locks:
        held_hosts: tuple[str, ...] = ()
        held_units: tuple[Path, ...] = ()
        while True:
            if request.hosts != held_hosts:
                unit_locks.close()
                host_locks.close()
                held_units = ()
                _lock_hosts(request, host_locks, wait_s, command, echo)
                held_hosts = request.hosts
            # The units follow from the config too (a host's kind, its units_dir): a text
            # written meanwhile may name others for the same hosts.
            units = _units_dirs(request)
            if units != held_units:
                unit_locks.close()
                for units_dir in units:
                    unit_locks.enter_context(
                        units_lock(units_dir, str(request.source.path), wait_s, command=command)
                    )
                held_units = units
            if request.source.unchanged():
                break
            request = request.read_again()
        yield request


def _lock_hosts(
    request: _Request, locks: ExitStack, wait_s: float, command: str, echo: Echo
) -> None:
    """Take the request's hosts' locks (in ``locks``), and tidy what a killed command left in
    the hosts' state."""
    path = request.source.path
    for name in request.hosts:  # always in config order, so two callers cannot deadlock
        state = HostState.beside(path, name)
        locks.enter_context(
            host_lock(state.root, f"host {name}", str(path), wait_s, command=command)
        )
        _recover(state, echo)


def _units_dirs(request: _Request) -> tuple[Path, ...]:
    """The units on this machine that the request's hosts change, whatever config names them
    (the fleet agent's copy, a local file), in one order: the order their locks are taken in."""
    units = {s.units_dir.resolve() for h in request.hosts if (s := request.units_scope(h))}
    return tuple(sorted(units))
