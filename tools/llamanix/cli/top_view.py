"""``llamanix top``: the table, drawn once or redrawn in place with rich.

Local hosts are read here (``observe.host_reading``); remote ones by their own llamanix over ssh
(``observe.top_rows.remote_top``), each in a thread of its own so a slow host does not hold the
others' redraw.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from llamanix.cli.console import console as make_console
from llamanix.cli.options import Hosts
from llamanix.config.host_choice import pick_host
from llamanix.config.model import Config, load_config
from llamanix.external import interrupt
from llamanix.external.process import Runner
from llamanix.observe.host_reading import HostReader
from llamanix.observe.top_rows import TopHost, TopRow, is_remote, remote_top, top_host, top_json
from llamanix.switch.request import parse_hosts

# In the live view, the window over which a remote host's own llamanix takes its rates (it reads
# its instances twice, this far apart, for each redraw its row gets).
REMOTE_WINDOW_S = 1.0


def _hosts(config: Config, host: Hosts) -> list[str]:
    """--host's hosts: one, several in the order given, or (all, or left out) every host that
    runs an instance."""
    if host.names is not None:
        return list(parse_hosts(host.names, tuple(config.hosts), config.source))
    if host.name is not None:
        return [pick_host(config, host.name)]
    return [name for name in config.hosts if config.instances_on(name)]


def _quiet(_line: str) -> None:
    pass


class _Fleet:
    """The hosts top reads: a reader for each local one, ssh for each remote one."""

    def __init__(self, path: Path, config: Config, names: list[str]) -> None:
        self.config = config
        self.names = names
        self.readers = {
            n: HostReader(path, n, warn=_quiet) for n in names if not is_remote(config, n)
        }
        remote = [n for n in names if is_remote(config, n)]
        self.pool = ThreadPoolExecutor(max_workers=max(1, len(remote))) if remote else None
        self.pending: dict[str, Future[TopHost]] = {}
        self.last: dict[str, TopHost] = {n: TopHost(n, "ok", "reading over ssh...") for n in remote}

    def _remote(self, name: str, window: float) -> TopHost:
        runner = Runner(echo=_quiet)
        return remote_top(self.config, name, runner, window)

    def read(self, window: float, wait: bool) -> list[TopHost]:
        """Every host's rows: local ones now, remote ones as their ssh returned (``wait``:
        until every one did)."""
        if self.pool is not None:
            for name in self.last:
                if name not in self.pending:
                    self.pending[name] = self.pool.submit(self._remote, name, window)
        out: dict[str, TopHost] = {
            name: top_host(reader.read()) for name, reader in self.readers.items()
        }
        for name, future in list(self.pending.items()):
            if wait or future.done():
                self.last[name] = future.result()
                del self.pending[name]
        out.update(self.last)
        return [out[n] for n in self.names]

    def close(self) -> None:
        for reader in self.readers.values():
            reader.close()
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)


def run_top(
    path: Path,
    host: Hosts,
    *,
    once: bool,
    as_json: bool,
    interval: float,
    window: float,
) -> int:
    config = load_config(path)
    fleet = _Fleet(path, config, _hosts(config, host))
    try:
        if once:
            hosts = fleet.read(window, wait=True)
            if window > 0:
                time.sleep(window)
                hosts = fleet.read(window, wait=True)
            if as_json:
                print(top_json(hosts))
            else:
                make_console().print(top_table(hosts))
            return 0
        _live(fleet, interval)
        return 0
    finally:
        fleet.close()


def _live(fleet: _Fleet, interval: float) -> None:
    console = make_console()
    try:
        with Live(console=console, auto_refresh=False, screen=False) as live:
            while True:
                hosts = fleet.read(REMOTE_WINDOW_S, wait=False)
                stamp = Text(time.strftime("%H:%M:%S") + "  (Ctrl-C quits)", style="dim")
                live.update(Group(top_table(hosts), stamp), refresh=True)
                time.sleep(interval)
    except interrupt.Interrupted:
        return


def _num(value: float | None, fmt: str, unit: str = "") -> str:
    return "-" if value is None else f"{value:{fmt}}{unit}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


_STATE_STYLE = {"ok": "green", "unloaded": "yellow"}
COLUMNS = (
    ("host", "left", 4),
    ("instance", "left", 8),
    ("state", "left", 12),
    ("variant / spec", "left", 8),
    ("build", "left", 7),
    ("in flight", "right", 4),
    ("decode tok/s", "right", 7),
    ("TTFT/1k", "right", 6),
    ("accept (gate)", "right", 6),
    ("of ceiling", "right", 5),
    ("cache", "right", 5),
    ("last restart", "left", 8),
)


def _restart(row: TopRow) -> str:
    parts = []
    if row.last_switch_generation is not None:
        parts.append(f"gen {row.last_switch_generation}")
    if row.last_gap_s is not None:
        parts.append(f"gap {row.last_gap_s:.2f}s")
    if row.last_load_s is not None:
        parts.append(f"load {row.last_load_s:.1f}s")
    return ", ".join(parts) or "-"


def _host_summary(host: TopHost) -> str:
    if host.newest_generation is None:
        return ""
    serving = f"serving gen {host.generation}" if host.generation is not None else "none serving"
    rollbacks = host.rollbacks or 0
    return (
        f"{serving}; newest gen {host.newest_generation}: {host.newest_verdict}; "
        f"{host.switches} switch(es), {rollbacks} rollback(s)"
    )


def _cells(row: TopRow) -> list[str | Text]:
    state = Text(row.state, style=_STATE_STYLE.get(row.state, "bold red"))
    if row.state != "ok":
        state.append(f": {row.detail}", style="red")
    deferred = f" (+{row.deferred:.0f})" if row.deferred else ""
    decode = _num(row.decode_tok_s, ".1f")
    if row.decode_basis == "since start":
        decode += "*"
    accept = _pct(row.acceptance)
    if row.gate_acceptance is not None:
        accept += f" ({_pct(row.gate_acceptance)})"
    return [
        row.instance,
        state,
        f"{row.variant} / {row.spec_type}",
        row.build or "-",
        _num(row.in_flight, ".0f") + deferred,
        decode,
        _num(row.ttft_1k_s, ".2f", "s"),
        accept,
        _pct(row.ceiling_share),
        _pct(row.cache_reuse),
        _restart(row),
    ]


def top_table(hosts: list[TopHost]) -> Table:
    table = Table(title="llamanix top", title_justify="left", expand=False)
    for name, justify, width in COLUMNS:
        # Only the state wraps (its detail says why a row is marked); the figures stay whole.
        table.add_column(
            name,
            justify=justify,  # type: ignore[arg-type]
            min_width=width,
            no_wrap=name != "state",
            overflow="fold" if name == "state" else "ellipsis",
        )
    blank = [""] * (len(COLUMNS) - 1)
    since_start = False
    summaries = []
    for host in hosts:
        if host.state != "ok":
            failed = Text(f"{host.state}: {host.detail}", style="bold red")
            table.add_row(host.host, "-", failed, *blank[2:])
            continue
        if not host.rows:
            table.add_row(host.host, "-", Text(host.detail or "no instances", style="dim"))
        for i, row in enumerate(host.rows):
            table.add_row(host.host if i == 0 else "", *_cells(row))
            since_start = since_start or row.decode_basis == "since start"
        summary = _host_summary(host)
        if summary:
            summaries.append(f"{host.host}: {summary}")
    notes = [
        *summaries,
        "TTFT/1k: to the first token of a 1,000-token prompt, at the prefill rate",
    ]
    if since_start:
        notes.append("* nothing decoded since the last look: the rate since the server started")
    table.caption = "\n".join(notes)
    table.caption_justify = "left"
    return table
