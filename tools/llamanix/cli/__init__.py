"""The ``llamanix`` command line (click).

Commands live in one module per concern (core, testbed, measure, checks, deploy); each exposes
``register(group)``. User mistakes become one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from llamanix import __version__
from llamanix.core.errors import ExternalCommandError, UserError


class LlamanixGroup(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
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

    for module in (core, testbed, measure, deploy, checks):
        module.register(main)


_register_all()
