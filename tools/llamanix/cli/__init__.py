"""The ``llamanix`` command line (click).

Commands live in one module per concern (core, testbed, bench, diagnose, model, checks, deploy,
readiness); each exposes ``register(group)``. A module is imported only when one of its commands
runs: the listing (``--help``) and completing a command name come from ``COMMANDS`` below, so
they load no command module and none of the libraries those import (gguf, numpy, httpx, rich,
jinja2).
User mistakes become one line on stderr and exit code 2, never a traceback; SIGINT, SIGTERM and
SIGHUP stop what the command started, then exit 128 + the signal's number.
"""

from __future__ import annotations

import importlib
import json
from typing import Any, NoReturn

import click
from click.shell_completion import CompletionItem
from click.utils import make_default_short_help

from llamanix import __version__
from llamanix.cli.options import exit_with
from llamanix.core.errors import ExternalCommandError, UserError
from llamanix.external import interrupt

# `llamanix --help` lists commands by job, in this order; a command missing here is listed
# under "Other commands" so nothing is hidden.
COMMAND_GROUPS: dict[str, tuple[str, ...]] = {
    "Serve and deploy": (
        "init",
        "plan",
        "validate",
        "render",
        "schema",
        "switch",
        "rollback",
        "tidy",
        "generations",
        "variant",
        "up",
        "readiness",
    ),
    "Measure and diagnose": ("top", "metrics", "bench", "check", "model", "doctor"),
    "Test bed": ("testbed",),
}

# Each command: the module under llamanix.cli that defines it, and the first sentence of its
# help, which `--help` and completion show without importing that module. tests/test_cli.py
# checks both against the commands themselves.
COMMANDS: dict[str, tuple[str, str]] = {
    "init": (
        "init",
        "Write a starter config (default ./llamanix.toml) from what this machine has.",
    ),
    "validate": ("core", "Check each CONFIG; exit 2 with one line per problem."),
    "plan": ("core", "Per host: each instance's variant, address, speculation and command line."),
    "render": (
        "core",
        "Write llamanix-NAME.service, NAME.argv.json and manifest.json for a host.",
    ),
    "schema": (
        "core",
        "Print the config schema (what the NixOS module's options are made from).",
    ),
    "variant": (
        "variant",
        "A variant's build: pin its source, build it with Nix, probe what it accepts.",
    ),
    "testbed": (
        "testbed",
        "The test bed: the CPU llama-server, the real and synthetic models, the demo, test hosts.",
    ),
    "bench": (
        "bench",
        "Benchmark a running llama-server: TTFT, prefill and decode, server and client clocks.",
    ),
    "check": (
        "checks",
        "Does a build serve on the GPU (smoke)? Does speculation answer alike (lossless)?",
    ),
    "model": (
        "model",
        "What a GGUF holds (inspect), and the decode roofline it allows on a GPU (ceiling).",
    ),
    "doctor": (
        "diagnose",
        "Find what silently costs speed or memory; exit 1 on any error finding.",
    ),
    "up": (
        "deploy",
        "Run a host's instances in the foreground, restarting them like their units say.",
    ),
    "switch": (
        "deploy",
        "Change what a host runs, gate it, and roll back when the gate fails (exit 1).",
    ),
    "rollback": ("deploy", "Serve an earlier generation again (and put its config back)."),
    "tidy": (
        "deploy",
        "Remove what a killed switch left, and serve the current generation again (exit 1 if not).",
    ),
    "generations": (
        "deploy",
        "List a host's generations: date, variant and source revision per instance, gate.",
    ),
    "readiness": (
        "readiness",
        "Exit 0 once a llama-server serves: /health is 200 and a one-token completion answers.",
    ),
    "metrics": (
        "observe",
        "Serve a host's Prometheus exporter: every local llama-server's /metrics, labelled.",
    ),
    "top": (
        "observe",
        "A live view of every instance: in flight, decode tok/s, TTFT, acceptance, ceiling share.",
    ),
    "fleet-agent": (
        "fleet_agent",
        "The remote side of a fleet switch over ssh: llamanix runs it, not a person.",
    ),
    "gateway": (
        "gateway",
        "The gateway unit's side: start its LiteLLM (exec), wait until it answers (ready).",
    ),
}
# Commands llamanix itself runs (over ssh, or as the gateway's unit): left out of `--help` and
# of completion.
HIDDEN = frozenset({"fleet-agent", "gateway"})

# Commands that moved into a group: each old name still runs the new command for a release,
# hidden, after one line on stderr that names the new spelling. A moved command whose arguments
# changed order keeps its old grammar in the module of its group (OLD_GRAMMAR there).
MOVED: dict[str, str] = {
    "build-server": "testbed build-server",
    "fetch-model": "testbed fetch-model",
    "synth-model": "testbed synth-model",
    "demo": "testbed demo",
    "host-shell": "testbed host-shell",
    "inspect": "model inspect",
    "ceiling": "model ceiling",
    "pin": "variant pin",
    "build": "variant build",
    "probe": "variant probe",
    "smoke": "check smoke",
    "lossless": "check lossless",
    "argv": "plan --argv",
    "gateway-exec": "gateway exec",
    "gateway-ready": "gateway ready",
}
# The names the gateway's unit runs. Units keep rendering them: a unit whose ExecStart= changed
# counts as changed, so a new spelling would restart the gateway (and drop its requests) on the
# first switch after an upgrade. They say nothing, since nobody reads a unit's stderr, and stay
# as long as units render them.
MOVED_QUIETLY = frozenset({"gateway-exec", "gateway-ready"})


class LlamanixGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *self.commands})

    def _shown(self, ctx: click.Context) -> list[str]:
        return [name for name in self.list_commands(ctx) if name not in HIDDEN]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            _load(self, COMMANDS[cmd_name][0])
        return self.commands.get(cmd_name)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        if args and args[0] in MOVED and args[0] not in self.commands:
            return _moved(self, ctx, args[0], args[1:])
        return super().resolve_command(ctx, args)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        names = self._shown(ctx)
        width = formatter.width - 6 - max((len(name) for name in names), default=0)
        grouped = {name for names in COMMAND_GROUPS.values() for name in names}
        sections = [
            (title, [name for name in group if name in names])
            for title, group in COMMAND_GROUPS.items()
        ]
        sections.append(("Other commands", sorted(set(names) - grouped)))
        for title, section in sections:
            if not section:
                continue
            rows = [(name, _short_help(self, ctx, name, width)) for name in section]
            with formatter.section(title):
                formatter.write_dl(rows)

    def shell_complete(self, ctx: click.Context, incomplete: str) -> list[CompletionItem]:
        # A command name completes from COMMANDS alone: one TAB imports no command module.
        names = [name for name in self._shown(ctx) if name.startswith(incomplete)]
        results = [CompletionItem(name, help=_short_help(self, ctx, name, 45)) for name in names]
        results.extend(click.Command.shell_complete(self, ctx, incomplete))
        return results

    def invoke(self, ctx: click.Context) -> Any:
        # SIGTERM and SIGHUP take Ctrl-C's path: the command's cleanup stops every
        # llama-server it started, then one line and the shell's 128 + N exit code.
        as_json = _json_requested(ctx)
        with interrupt.handled():
            try:
                return super().invoke(ctx)
            except interrupt.Interrupted as err:
                _failed([f"llamanix: stopped by {err.name}"], err.exit_code, as_json)
            except UserError as err:
                _failed([str(problem) for problem in err.problems], err.exit_code, as_json)
            except ExternalCommandError as err:
                _failed([f"llamanix: {err}"], err.exit_code, as_json)
            except click.ClickException as err:
                # A usage mistake (a missing argument, an unknown option): click's own text,
                # and with --json the same as JSON on stdout.
                if not as_json:
                    raise
                err.show()
                _failed([f"llamanix: {err.format_message()}"], err.exit_code, as_json, False)
            except Exception as err:
                # A server that drops a connection mid-command is one line too; httpx is
                # matched by module so that listing commands never imports it.
                if not type(err).__module__.startswith("httpx"):
                    raise
                line = f"llamanix: HTTP: {type(err).__name__}: {err}"
                _failed([line], ExternalCommandError.exit_code, as_json)


def _json_requested(ctx: click.Context) -> bool:
    """Whether the command line asks for JSON: read from the words after the group's own, so
    that a mistake click finds while it reads them is answered in JSON too."""
    # Click 8.2 renamed protected_args (still there, deprecated) to _protected_args.
    protected = ctx._protected_args if hasattr(ctx, "_protected_args") else ctx.protected_args
    words = [*protected, *ctx.args]
    return "--json" in words


def _failed(lines: list[str], code: int, as_json: bool, to_stderr: bool = True) -> NoReturn:
    """A command that failed before it printed its result: its lines on stderr and, where
    --json was asked for, ``{"error": ..., "problems": [...], "exit_code": N}`` on stdout, so
    that a script reading stdout always reads JSON."""
    if to_stderr:
        for line in lines:
            click.echo(line, err=True)
    if as_json:
        error = {"error": "\n".join(lines), "problems": lines, "exit_code": code}
        click.echo(json.dumps(error, indent=2))
    exit_with(code)


@click.group(cls=LlamanixGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="llamanix")
def main() -> None:
    """Build, serve, switch, measure and roll back llama.cpp variants."""


def _short_help(group: click.Group, ctx: click.Context, name: str, width: int) -> str:
    if name in COMMANDS and name not in group.commands:
        return make_default_short_help(COMMANDS[name][1], width)
    command = group.get_command(ctx, name)
    return command.get_short_help_str(width) if command is not None else ""


def _moved(
    group: click.Group, ctx: click.Context, old: str, args: list[str]
) -> tuple[str, click.Command, list[str]]:
    """An old command name: its one line on stderr (not while a TAB completes), then the
    command it moved to, under the name typed. The words of the new spelling that are not
    commands (``plan --argv``) go before the rest of the command line."""
    new = MOVED[old]
    if not ctx.resilient_parsing and old not in MOVED_QUIETLY:
        click.echo(f"llamanix: {old} is `llamanix {new}` now", err=True)
    first, *rest = new.split()
    command = group.get_command(ctx, first)
    assert command is not None, new  # tests/test_cli.py runs every entry
    module = importlib.import_module(f"llamanix.cli.{COMMANDS[first][0]}")
    old_grammar: dict[str, click.Command] = getattr(module, "OLD_GRAMMAR", {})
    if old in old_grammar:
        return old, old_grammar[old], args
    while rest and isinstance(command, click.Group) and rest[0] in command.commands:
        command = command.commands[rest.pop(0)]
    return old, command, [*rest, *args]


def _load(group: click.Group, module_name: str) -> None:
    """Import llamanix.cli.MODULE and add its commands (with their examples) to ``group``."""
    from llamanix.cli.examples import with_examples

    module = importlib.import_module(f"llamanix.cli.{module_name}")
    loaded = click.Group()
    module.register(loaded)
    for name, command in loaded.commands.items():
        with_examples(command, name)
        group.add_command(command, name)


def load_all() -> dict[str, click.Command]:
    """Every command, loaded (for tests and tools that walk the whole command tree)."""
    for module_name in sorted({module for module, _ in COMMANDS.values()}):
        _load(main, module_name)
    return dict(main.commands)
