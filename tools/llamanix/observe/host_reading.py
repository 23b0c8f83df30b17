"""One look at every instance of a host: what the exporter serves and ``llamanix top`` shows.

A ``HostReader`` keeps one HTTP client per address and each instance's previous counters, so a
reading's rates cover the window since the previous one (``observe.live_figures``). It reads the
config again when the file changes (a switch edits it), and the generation records when they
change. Nothing an instance does raises here: its row says what happened.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from llamanix.config.host_choice import pick_host
from llamanix.config.model import Config, load_config
from llamanix.core.errors import UserError
from llamanix.core.observability import UNKNOWN_BUILD
from llamanix.core.state_dir import host_state_root
from llamanix.observe.live_figures import Counters, Figures, figures
from llamanix.observe.metrics_targets import (
    MetricsTarget,
    host_targets,
    read_target_key,
    serving_builds,
)
from llamanix.observe.scrape import Scrape, http_client, scrape
from llamanix.observe.switch_figures import SwitchFigures, switch_figures
from llamanix.state.generations import HostState

if TYPE_CHECKING:
    import httpx

# The build is asked of /props at the first answer, after a restart, and at least this often.
PROPS_EVERY_S = 300.0
# Instances read at once.
WORKERS = 8


@dataclass(frozen=True)
class InstanceReading:
    target: MetricsTarget
    scrape: Scrape
    build: str
    figures: Figures | None  # None unless the scrape is ok

    @property
    def ceiling_share(self) -> float | None:
        if self.figures is None:
            return None
        return self.figures.ceiling_share(self.target.ceiling_tok_s)


@dataclass(frozen=True)
class HostReading:
    host: str
    instances: tuple[InstanceReading, ...]
    switches: SwitchFigures
    seconds: float  # how long reading every instance took
    notes: tuple[str, ...] = ()  # what could not be read besides the instances


@dataclass
class _Seen:
    counters: Counters | None = None
    build: str | None = None
    props_at: float = 0.0


@dataclass
class _Loaded:
    config: Config
    host: str
    mtime_ns: int
    targets: list[MetricsTarget]
    notes: list[str] = field(default_factory=list)


class HostReader:
    """Reads ``host`` of the config at ``config_path`` (None: its only host), and the host's
    generation records in ``state_dir`` (None: ``.llamanix-state/HOST`` beside the config)."""

    def __init__(
        self,
        config_path: Path,
        host: str | None = None,
        *,
        warn: Callable[[str], None] | None = None,
        state_dir: Path | None = None,
    ) -> None:
        self.config_path = config_path
        self._host_arg = host
        self._state_dir = state_dir
        self._warn = warn or (lambda line: print(f"llamanix: {line}", file=sys.stderr))
        self._loaded = self._load()
        self._clients: dict[tuple[str, str | None], httpx.Client] = {}
        self._key_problems: dict[tuple[str, str | None], str] = {}
        self._seen: dict[str, _Seen] = {}
        self._records_stamp: tuple[int, ...] | None = None
        self._switches = SwitchFigures()

    @property
    def host(self) -> str:
        return self._loaded.host

    @property
    def config(self) -> Config:
        return self._loaded.config

    def _state(self, host: str) -> HostState:
        root = self._state_dir or host_state_root(self.config_path, host)
        return HostState(root, host)

    def _load(self) -> _Loaded:
        """The config and its targets; UserError when it is wrong (at start: the command's
        one line)."""
        mtime = self.config_path.stat().st_mtime_ns if self.config_path.exists() else 0
        config = load_config(self.config_path)
        host = pick_host(config, self._host_arg)
        targets = host_targets(config, host, serving_builds(self._state(host)))
        notes = [t.ceiling_note for t in targets if t.ceiling_note]
        for note in notes:
            self._warn(note)
        return _Loaded(config, host, mtime, targets, notes)

    def _reload_if_changed(self) -> None:
        try:
            mtime = self.config_path.stat().st_mtime_ns
        except OSError:
            return
        if mtime == self._loaded.mtime_ns:
            return
        try:
            self._loaded = self._load()
        except UserError as err:
            # The config was edited into something invalid: keep reading what it said before.
            self._loaded.mtime_ns = mtime
            self._warn(f"config changed but does not load; still reading the old one: {err}")
            return
        self.close_clients()

    def _client(self, target: MetricsTarget) -> httpx.Client | str:
        """The target's client, or why there is none (its key cannot be read)."""
        key = target.client_key
        if key in self._key_problems:
            return self._key_problems[key]
        client = self._clients.get(key)
        if client is None:
            try:
                api_key = read_target_key(target)
            except UserError as err:
                self._key_problems[key] = str(err)
                return str(err)
            client = self._clients[key] = http_client(api_key)
        return client

    def _read_one(self, target: MetricsTarget, client: httpx.Client | str) -> InstanceReading:
        seen = self._seen[target.instance]
        if isinstance(client, str):
            found = Scrape("refused", f"the key cannot be read: {client}")
            return InstanceReading(target, found, self._build(target, seen), None)
        now = time.monotonic()
        want_props = seen.build is None or now - seen.props_at > PROPS_EVERY_S
        found = scrape(client, target.endpoint, props=want_props)
        if not found.ok or found.snapshot is None:
            return InstanceReading(target, found, self._build(target, seen), None)
        counters = Counters.of(found.snapshot)
        before = seen.counters
        if before is not None and counters.restarted_since(before) and not want_props:
            # A new server process: its build may be another (read again next time).
            seen.props_at = 0.0
        if want_props:
            seen.props_at = now
            if found.build is not None:
                seen.build = found.build
        seen.counters = counters
        return InstanceReading(
            target,
            found,
            self._build(target, seen),
            figures(counters, before),
        )

    @staticmethod
    def _build(target: MetricsTarget, seen: _Seen) -> str:
        return seen.build or target.manifest_build or UNKNOWN_BUILD

    def _read_switches(self) -> SwitchFigures:
        """The host's switch figures, read again only when its records changed."""
        stamp = self._state(self.host).records_stamp()
        if stamp != self._records_stamp:
            self._switches = switch_figures(self._state(self.host))
            self._records_stamp = stamp
        return self._switches

    def read(self) -> HostReading:
        """Every instance of the host, now."""
        self._reload_if_changed()
        started = time.perf_counter()
        targets = self._loaded.targets
        # Clients and state first, in this thread: two members of a router share a client.
        clients = [self._client(t) for t in targets]
        for t in targets:
            self._seen.setdefault(t.instance, _Seen())
        if len(targets) <= 1:
            readings = [self._read_one(t, c) for t, c in zip(targets, clients, strict=True)]
        else:
            with ThreadPoolExecutor(max_workers=min(WORKERS, len(targets))) as pool:
                readings = list(
                    pool.map(
                        lambda tc: self._read_one(tc[0], tc[1]),
                        zip(targets, clients, strict=True),
                    )
                )
        seconds = time.perf_counter() - started
        notes = list(self._loaded.notes)
        try:
            switches = self._read_switches()
        except OSError as err:
            switches = SwitchFigures()
            notes.append(f"the generation records cannot be read: {err}")
        return HostReading(self.host, tuple(readings), switches, seconds, tuple(notes))

    def close_clients(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()
        self._key_problems.clear()

    def close(self) -> None:
        self.close_clients()
