"""Shell completion of host and instance names, read from the config on the command line.

Enable it with ``eval "$(_LLAMANIX_COMPLETE=bash_source llamanix)"`` (or ``zsh_source``,
``fish_source``). Completion must never fail loudly, so a config that is missing or does not
parse completes nothing.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from pathlib import Path

import click
from click.shell_completion import CompletionItem

from llamanix.config.model import config_table

DEFAULT_CONFIG = Path("llamanix.toml")


def _config_path(ctx: click.Context) -> Path:
    """The config named on the command line being completed, else llamanix.toml."""
    if ctx.params.get("config"):
        return Path(ctx.params["config"])
    # While an option's value is being completed click has not parsed the arguments before it,
    # so read them from the words the shell hands over (every shell click supports sets this).
    try:
        words = shlex.split(os.environ.get("COMP_WORDS", ""))
    except ValueError:
        words = []
    return next((Path(w) for w in words[1:] if w.endswith(".toml")), DEFAULT_CONFIG)


def _table(ctx: click.Context, key: str) -> Mapping[str, object]:
    data = config_table(_config_path(ctx))
    if data is None:
        return {}  # a TAB says nothing: the command itself will say what is wrong
    table = data.get(key)
    return table if isinstance(table, dict) else {}


def complete_hosts(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    hosts = _table(ctx, "hosts")
    # --host of a command that takes several hosts (options.hosts_option) also takes "all".
    several = param.metavar == "NAME|A,B|all"
    names = [*hosts, "all"] if several else hosts
    return [CompletionItem(name) for name in names if name.startswith(incomplete)]


def complete_instances(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    return [
        CompletionItem(name, help=str(inst.get("model", "")) if isinstance(inst, dict) else None)
        for name, inst in _table(ctx, "instances").items()
        if name.startswith(incomplete)
    ]
