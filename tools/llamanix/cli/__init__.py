"""The ``llamanix`` command line (click).

Commands live in one module per concern (core, testbed, measure, checks, deploy); each exposes
``register(group)``. User mistakes become one line on stderr and exit code 2, never a traceback;
SIGINT, SIGTERM and SIGHUP stop what the command started, then exit 128 + the signal's number.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from llamanix import __version__
from llamanix.core.errors import ExternalCommandError, UserError
from llamanix.external import interrupt

# `llamanix --help` lists commands by job, in this order; a command missing here is listed
# under "Other commands" so nothing is hidden.
COMMAND_GROUPS: dict[str, tuple[str, ...]] = {
    "Serve and deploy": (
        "plan",
        "validate",
        "render",
        "argv",
        "probe",
        "schema",
        "switch",
        "rollback",
        "generations",
        "pin",
        "up",
        "readiness",
    ),
    "Measure and diagnose": (
        "bench",
        "lossless",
        "ceiling",
        "inspect",
        "doctor",
        "smoke",
    ),
    "Test bed": ("build-server", "synth-model", "demo", "host-shell"),
}


class LlamanixGroup(click.Group):
    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        commands = {
            name: cmd
            for name in self.list_commands(ctx)
            if (cmd := self.get_command(ctx, name)) is not None and not cmd.hidden
        }
        width = formatter.width - 6 - max((len(name) for name in commands), default=0)
        grouped = {name for names in COMMAND_GROUPS.values() for name in names}
        sections = [
            (title, [name for name in names if name in commands])
            for title, names in COMMAND_GROUPS.items()
        ]
        sections.append(("Other commands", sorted(set(commands) - grouped)))
        for title, names in sections:
            if not names:
                continue
            rows = [(name, commands[name].get_short_help_str(width)) for name in names]
            with formatter.section(title):
                formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> Any:
        # SIGTERM and SIGHUP take Ctrl-C's path: the command's cleanup stops every
        # llama-server it started, then one line and the shell's 128 + N exit code.
        with interrupt.handled():
            try:
                return super().invoke(ctx)
            except interrupt.Interrupted as err:
                click.echo(f"llamanix: stopped by {err.name}", err=True)
                sys.exit(err.exit_code)
            except UserError as err:
                for problem in err.problems:
                    click.echo(str(problem), err=True)
                sys.exit(err.exit_code)
            except ExternalCommandError as err:
                click.echo(f"llamanix: {err}", err=True)
                sys.exit(err.exit_code)


@click.group(cls=LlamanixGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="llamanix")
def main() -> None:
    """Build, serve, switch, measure and roll back llama.cpp variants."""


def _register_all() -> None:
    from llamanix.cli import checks, core, deploy, measure, testbed
    from llamanix.cli.examples import with_examples

    for module in (core, testbed, measure, deploy, checks):
        module.register(main)
    for name, command in main.commands.items():
        with_examples(command, name)


_register_all()
