"""Options several commands share, declared once: one spelling and one help text each.

Time options have one name per meaning: ``--timeout`` is how long a server may take to serve
(switch, rollback, up, readiness), ``--wait`` how long to wait for another switch of the same
host. A renamed option keeps its old spelling for a release, hidden from ``--help``; using it
prints one line on stderr naming the new one (``deprecated``). Only click here: every command
module imports this one, and ``llamanix --help`` must stay quick.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

if TYPE_CHECKING:
    from click.shell_completion import CompletionItem

F = TypeVar("F", bound=Callable[..., Any])

FILE = click.Path(path_type=Path, dir_okay=False)
DIRECTORY = click.Path(path_type=Path, file_okay=False)

HOST_HELP = "The host (may be left out when the config has one)."
HOSTS_HELP = (
    "A host NAME, several A,B (in that order) or all (in config order); may be left out when "
    "the config has one host (plan and top: every host)."
)
# --host's value that names every host of the config, in config order: config.model.ALL_HOSTS,
# which no host may be named (spelled again here so that --help imports no config module; a
# test holds the two equal).
ALL_HOSTS = "all"


def _complete_hosts(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    # Completion reads the config (tomllib): imported on a TAB after an option, not on --help.
    from llamanix.cli.completion import complete_hosts

    return complete_hosts(ctx, param, incomplete)


def _complete_instances(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    from llamanix.cli.completion import complete_instances

    return complete_instances(ctx, param, incomplete)


def refuse_swapped(command: str, config: Path, variant: str) -> None:
    """``llamanix COMMAND VARIANT CONFIG``, the two swapped: one line that gives the order
    (else it reads as a missing file or an unknown variant)."""
    import shlex

    from llamanix.core.errors import Problem, UserError
    from llamanix.core.variants import VARIANTS

    if str(config) not in VARIANTS or variant in VARIANTS:
        return
    try:
        swapped = Path(variant).is_file()
    except OSError:  # a name too long, a folder not ours: not a config either
        return
    if swapped:
        # A file named like an option is given as ./NAME, so the line stays a file.
        given = variant if not variant.startswith("-") else f"./{variant}"
        raise UserError(
            Problem(
                f"llamanix {command}",
                "CONFIG",
                f"'{config}' is a variant, and the config comes first",
                f"llamanix {command} {shlex.quote(given)} {shlex.quote(str(config))}, "
                "with the rest as you gave it",
            )
        )


def config_argument(default: str | None = None) -> Callable[[F], F]:
    """``CONFIG``: the llamanix.toml a command reads (``default``: the file taken when left
    out). Its parameter is ``config``, where completion looks for it."""
    if default is None:
        return click.argument("config", type=FILE)
    return click.argument("config", type=FILE, default=default)


def config_option(help: str, *, hidden: bool = False) -> Callable[[F], F]:
    """``--config FILE``: a config for a command whose arguments are something else."""
    return click.option("--config", "config", type=FILE, hidden=hidden, help=help)


def host_option(help: str | None = None) -> Callable[[F], F]:
    """``--host NAME``: one host, completed from the config's hosts. ``help``: only for a
    command where the host is not a selector (init: the name to write)."""
    return click.option(
        "--host", metavar="NAME", shell_complete=_complete_hosts, help=help or HOST_HELP
    )


@dataclass(frozen=True)
class Hosts:
    """What ``--host`` named on a command that takes several: one host (``name``; None: the
    config's only host, or every host where the command says so), or ``several`` hosts:
    ``names`` (``A,B`` as given, checked against the config by the command) or, None, every
    host in config order (``all``)."""

    name: str | None = None
    names: str | None = None
    several: bool = False

    @staticmethod
    def of(text: str | None) -> Hosts:
        """``NAME``, ``A,B`` or ``all``."""
        if text is None:
            return Hosts()
        if text == ALL_HOSTS:
            return Hosts(several=True)
        if "," in text:
            return Hosts(names=text, several=True)
        return Hosts(name=text)


def hosts_option(*, old: tuple[str, ...] = ()) -> Callable[[F], F]:
    """``--host NAME|A,B|all``: one host, several in that order, or every host; the command
    gets ``host: Hosts``. ``old``: the spellings it took before (``--hosts A,B``,
    ``--all-hosts``), still taken for a release, hidden, each with one line on stderr."""

    def decorate(f: F) -> F:
        @functools.wraps(f)
        def with_hosts(*args: Any, **kwargs: Any) -> Any:
            text = kwargs.pop("host")
            listed = kwargs.pop("old_hosts", None)
            every = kwargs.pop("old_all_hosts", False)
            kwargs["host"] = _hosts_given(text, listed, every)
            return f(*args, **kwargs)

        decorated: Any = with_hosts
        if "--all-hosts" in old:
            decorated = click.option("--all-hosts", "old_all_hosts", is_flag=True, hidden=True)(
                decorated
            )
        if "--hosts" in old:
            decorated = click.option("--hosts", "old_hosts", hidden=True)(decorated)
        decorated = click.option(
            "--host",
            metavar="NAME|A,B|all",
            shell_complete=_complete_hosts,
            help=HOSTS_HELP,
        )(decorated)
        return decorated  # type: ignore[no-any-return]

    return decorate


def _hosts_given(text: str | None, listed: str | None, every: bool) -> Hosts:
    """--host's value, or what an old spelling gave (one line on stderr naming --host)."""
    given = [o for o, v in (("--host", text), ("--hosts", listed), ("--all-hosts", every)) if v]
    if len(given) > 1:
        from llamanix.core.errors import Problem, UserError

        raise UserError(
            Problem(
                "llamanix",
                given[1],
                f"and {given[0]} both name hosts",
                "name them once: --host NAME, --host A,B or --host all",
            )
        )
    if listed is not None:
        moved_note("--hosts", "--host", "--host A,B")
        # --hosts A named a rollout of one host: still one.
        return Hosts(names=listed, several=True)
    if every:
        moved_note("--all-hosts", "--host", "--host all")
        return Hosts(several=True)
    return Hosts.of(text)


def dry_run_flag(help: str) -> Callable[[F], F]:
    """``--dry-run``: say what a real run would do, and change nothing."""
    return click.option("--dry-run", is_flag=True, help=help)


def instance_argument(*, required: bool = True) -> Callable[[F], F]:
    """``INSTANCE``, completed from the config's instances."""
    return click.argument("instance", required=required, shell_complete=_complete_instances)


def instance_option(help: str, *, hidden: bool = False) -> Callable[[F], F]:
    """``--instance NAME``, completed from the config's instances."""
    return click.option("--instance", shell_complete=_complete_instances, hidden=hidden, help=help)


def json_flag(f: F) -> F:
    """``--json``: the result as JSON on stdout (progress, if any, goes to stderr)."""
    return click.option(
        "--json", "as_json", is_flag=True, help="Print JSON instead of a table or text."
    )(f)


def output_option(what: str) -> Callable[[F], F]:
    """``-o/--output FILE``: also write ``what`` as JSON to FILE (atomically)."""
    return click.option(
        "-o", "--output", "json_out", type=FILE, help=f"Also write {what} as JSON to this file."
    )


def api_key_file_option(f: F) -> F:
    return click.option(
        "--api-key-file",
        type=FILE,
        help="File holding the server's API key (sent as a bearer token; never on argv).",
    )(f)


def url_option(*, required: bool = False, help: str | None = None) -> Callable[[F], F]:
    return click.option(
        "--url",
        required=required,
        help=help or "Base URL of a running llama-server, e.g. http://127.0.0.1:8080.",
    )


def runs_option(default: int, what: str, type: Any = int) -> Callable[[F], F]:
    return click.option("--runs", type=type, default=default, show_default=True, help=what)


def timeout_option(default: float | None, what: str) -> Callable[[F], F]:
    """``--timeout SECONDS``: how long a server may take to serve. ``default`` None: the
    command works it out (readiness: from the model's size)."""
    return click.option(
        "--timeout",
        "timeout_s",
        type=click.FloatRange(min=0),
        default=default,
        show_default=default is not None,
        metavar="SECONDS",
        help=what,
    )


def hidden_alias(old: str, dest: str, type: Any = None, is_flag: bool = False) -> Callable[[F], F]:
    """The old spelling of a renamed option, still accepted for a release (see deprecated)."""
    return click.option(old, dest, type=type, is_flag=is_flag, default=None, hidden=True)


def deprecated(new_value: Any, old_value: Any, old: str, new: str) -> Any:
    """The option's value whichever spelling gave it; the old spelling says so on stderr. The
    new spelling wins when both are on the command line; the old one beats the new one's
    default."""
    if old_value is None:
        return new_value
    deprecation_note(old, new)
    ctx = click.get_current_context(silent=True)
    if ctx is not None and new_value is not None:
        given_on_command_line = click.core.ParameterSource.COMMANDLINE
        for param in ctx.command.params:
            if (
                new in getattr(param, "opts", ())
                and param.name is not None
                and ctx.get_parameter_source(param.name) is given_on_command_line
            ):
                return new_value
    return old_value


def deprecation_note(old: str, new: str) -> None:
    """The one line an old spelling prints on stderr, naming the new one."""
    click.echo(f"llamanix: {old} is deprecated, use {new}", err=True)


def moved_note(old: str, new: str, example: str) -> None:
    """The one line a moved option or command prints on stderr: ``llamanix: --hosts is --host
    now (--host A,B)``."""
    click.echo(f"llamanix: {old} is {new} now ({example})", err=True)


def exit_with(code: int) -> NoReturn:
    """The one way a command ends with a code other than 0 once it has said why: 1 for a
    failure it found (a gate, a check, a finding), 2 for a user mistake (UserError, which
    the main group turns into its one line and this), 128 + N for a signal."""
    sys.exit(code)


def fail(message: str, code: int = 1) -> NoReturn:
    """One line on stderr, then ``exit_with(code)``."""
    click.echo(message, err=True)
    exit_with(code)


class OneOf(click.Choice):  # type: ignore[type-arg]
    """A closed set of values, refused like every other bad input: one line naming the option
    and the closest value, exit 2 (a plain click.Choice prints a usage error instead)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter:
            from llamanix.config.model import suggest
            from llamanix.core.errors import Problem, UserError

            # The command as typed under its group (llamanix check smoke), the root left out.
            path: list[str] = []
            while ctx is not None and ctx.parent is not None:
                path.insert(0, ctx.info_name or "")
                ctx = ctx.parent
            where = " ".join(["llamanix", *path])
            name = param.opts[0] if param is not None and param.opts else "value"
            choices = tuple(str(c) for c in self.choices)
            raise UserError(
                Problem(where, name, f"unknown value {value!r}", suggest(str(value), choices))
            ) from None
