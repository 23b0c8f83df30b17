"""What the measuring commands print with: a rich console, a progress bar, JSON, sizes.

Imported only by command modules (bench, diagnose, model), never by the group's listing: rich
is one of the libraries ``llamanix --help`` must not load.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

if TYPE_CHECKING:  # a type only: inspect and ceiling load no HTTP client
    from llamanix.bench.bench import ProgressHook


@contextmanager
def progress_bar(console: Console, label: str, total: int) -> Iterator[ProgressHook | None]:
    """A bar on a terminal; None when stdout is a pipe or a file, so logs get no escape codes."""
    if not sys.stdout.isatty():
        yield None
        return
    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task(label, total=total)

        def step(what: str) -> None:
            bar.update(task, advance=1, description=what)

        yield step


# Where no terminal says how wide to draw (a pipe, a file, a CI log), tables are as wide as
# their content: rich would take 80 columns (or $COLUMNS) and cut cells short ("s…").
PIPE_WIDTH = 10_000


def console(stderr: bool = False) -> Console:
    """The console a command prints its tables with: the terminal's width, else unbounded."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(soft_wrap=False, stderr=stderr, width=None if stream.isatty() else PIPE_WIDTH)


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2))


def size(n: float) -> str:
    """Bytes, as 1.23 GB, 4.56 MB, 7.89 kB or 12 B."""
    for unit, factor in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= factor:
            return f"{n / factor:.2f} {unit}"
    return f"{n:.0f} B"


def count(n: float) -> str:
    """A count, as 1.23B, 4.56M, 7.89k or 12."""
    for unit, factor in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= factor:
            return f"{n / factor:.2f}{unit}"
    return f"{n:.0f}"
