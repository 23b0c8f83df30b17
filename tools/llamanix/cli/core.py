"""llamanix CLI commands: validate, plan (and --argv), render, schema; probe, which `variant`
holds."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from llamanix.cli.host_flag import host_flag
from llamanix.cli.options import (
    DIRECTORY,
    FILE,
    Hosts,
    config_argument,
    exit_with,
    host_option,
    hosts_option,
    instance_argument,
    json_flag,
)
from llamanix.config.argv import dialect_warning, instance_argv
from llamanix.config.model import Config, load_config
from llamanix.config.probe_diff import probe_diff
from llamanix.core import schema
from llamanix.core.errors import Problem, UserError
from llamanix.core.gpus import arch_mismatch, load_gpus
from llamanix.core.json_value import JsonObject
from llamanix.core.probe import Capabilities, load_capabilities
from llamanix.external.files import atomic_write
from llamanix.external.llama_server import probe_binary
from llamanix.hosts.host_kind import refuse_unstated_nixos, unstated_nixos
from llamanix.plan.host_plan import print_plan
from llamanix.plan.plan import arch_warnings, plan_config, unseen
from llamanix.plan.port_check import taken_ports
from llamanix.render.host_render import render_host
from llamanix.render.observability import observability_files
from llamanix.render.paths import open_key_files
from llamanix.render.units import CapabilityMap, write_render
from llamanix.switch.request import parse_hosts

FC = TypeVar("FC", bound=Callable[..., Any])


def _capability_option(multiple: bool) -> Callable[[FC], FC]:
    help_text = (
        "A saved probe (llamanix variant probe BINARY --json > FILE): every rendered flag must "
        "exist in "
        "that binary."
    )
    if multiple:
        help_text += " NAME=FILE applies it to one instance only; repeatable."
    return click.option(
        "--capabilities",
        "capabilities",
        multiple=multiple,
        metavar="[NAME=]FILE",
        help=help_text,
    )


def _load_caps(specs: tuple[str, ...] | str | None, config: Config | None = None) -> CapabilityMap:
    if not specs:
        return {}
    items = (specs,) if isinstance(specs, str) else specs
    out: dict[str, Capabilities] = {}
    for spec in items:
        name, sep, path = spec.partition("=")
        if not sep or "/" in name:  # a plain path (which may itself contain '=')
            name, path = "*", spec
        out[name] = load_capabilities(Path(path))
    return out


def _echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2))


@click.command()
@click.argument("configs", metavar="CONFIG...", nargs=-1, required=True, type=FILE)
@_capability_option(multiple=True)
@click.option(
    "--remote",
    is_flag=True,
    help="The units run on another machine: check only where each path is, as for a host "
    "with a target, not this machine's files nor this llamanix's install.",
)
@json_flag
def validate(
    configs: tuple[Path, ...], capabilities: tuple[str, ...], remote: bool, as_json: bool
) -> None:
    """Check each CONFIG; exit 2 with one line per problem.

    A host without a target is this machine: the paths its units run or read are checked on
    this machine's files (modes, symlinks, the llamanix the readiness check runs). A config
    written for another machine (an example, a box you deploy to by hand) is checked with
    --remote: only where each path is counts there. NixOS hosts get neither check (the module
    puts the programs in the store)."""
    caps = _load_caps(capabilities)
    results: list[JsonObject] = []
    failed: list[UserError] = []
    for config in configs:
        try:
            cfg = _validate_one(config, caps, remote)
        except UserError as err:
            failed.append(err)
            results.append(
                {"config": str(config), "ok": False, "problems": [str(p) for p in err.problems]}
            )
            continue
        results.append({"config": str(config), "ok": True, "instances": [*sorted(cfg.instances)]})
        if not as_json:
            click.echo(
                f"{config}: ok ({_count(len(cfg.instances), 'instance')} on "
                f"{_count(len(cfg.hosts), 'host')})"
            )
    if as_json:
        # One shape however many files: a list, one object per CONFIG.
        _echo_json(results)
        if failed:
            exit_with(2)
        return
    if failed:
        raise UserError([p for err in failed for p in err.problems])


def _count(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _validate_one(config: Path, caps: CapabilityMap, remote: bool) -> Config:
    cfg = load_config(config)
    validate_loaded(cfg, caps, remote)
    return cfg


def validate_loaded(cfg: Config, caps: CapabilityMap, remote: bool) -> None:
    """What validate checks beyond reading the file: UserError with every problem."""
    problems: list[Problem] = []
    for host in cfg.hosts:
        if not cfg.instances_on(host):
            continue
        here = not remote and cfg.hosts[host].target is None
        unstated = unstated_nixos(cfg, host) if here else None
        if unstated is not None:
            problems.append(unstated)
        if here:
            problems += taken_ports(cfg, host)
        try:
            render = render_host(cfg, host, caps)
            problems += unseen(cfg, render, here=not remote)
            problems += _left_out_gpu(cfg, host, any(r.gpu for r in render.instances))
            observability_files(cfg, host, user=cfg.hosts[host].kind == "systemd-user")
        except UserError as err:
            problems += err.problems
    if cfg.gateway is not None:
        from llamanix.render import gateway

        found, warnings = gateway.check(cfg)
        problems += found
        for line in warnings:
            click.echo(f"warning: {line}", err=True)
    if not remote:
        for open_key in open_key_files(cfg):
            click.echo(f"warning: {open_key}", err=True)
    if problems:
        raise UserError(problems)


def _left_out_gpu(cfg: Config, host: str, gpu: bool) -> list[Problem]:
    """A host whose instances use its GPU, and whose cuda_archs build no code for that card:
    the words plan warns with (plan.plan.arch_warnings) and doctor finds, refused here,
    before anything is built."""
    warned = arch_warnings(cfg.hosts[host], gpu)
    if not warned:
        return []
    card = load_gpus()[cfg.hosts[host].gpu or ""]
    mismatch = arch_mismatch(card.label, card.compute_capability, host, cfg.hosts[host].cuda_archs)
    assert mismatch is not None  # arch_warnings said so
    return [Problem(cfg.source, f"hosts.{host}.cuda_archs", mismatch.message, mismatch.fix)]


@click.command()
@config_argument()
@instance_argument(required=False)
@hosts_option()
@_capability_option(multiple=True)
@click.option("--no-security", is_flag=True, help="Skip the systemd-analyze exposure score.")
@click.option(
    "--flake",
    "flake_dir",
    type=DIRECTORY,
    help="Directory of the flake.lock whose pins to show (default: the config's).",
)
@click.option(
    "--previous",
    "previous",
    multiple=True,
    metavar="[NAME=]FILE",
    help="The probe of the build an instance runs now: plan lists, field by field, how its flags "
    "change on the build of --capabilities (respelled, refused with the fix, no longer "
    "rendered), and warns when that build drops something (see variant probe --diff).",
)
@json_flag
@click.option(
    "--argv",
    "argv",
    is_flag=True,
    help="Print only INSTANCE's exact llama-server argv, as a JSON list, program first.",
)
@click.option("--variant", help="With --argv: render for this variant instead (preview a flip).")
def plan(
    config: Path,
    instance: str | None,
    host: Hosts,
    capabilities: tuple[str, ...],
    no_security: bool,
    flake_dir: Path | None,
    previous: tuple[str, ...],
    as_json: bool,
    argv: bool,
    variant: str | None,
) -> None:
    """Per host: each instance's variant, address, speculation and command line.

    With INSTANCE and --argv, only that instance's llama-server argv, as JSON (what `argv`
    printed before it moved here): a plain --capabilities FILE checks it against that probe.
    """
    if argv or instance is not None or variant is not None:
        given: dict[str, object] = {"--host": host.name or host.several, "--previous": previous}
        given |= {"--json": as_json, "--flake": flake_dir, "--no-security": no_security}
        _print_argv(config, instance, argv, variant, capabilities, given)
        return
    cfg = load_config(config)
    hosts: str | tuple[str, ...] | None = host.name
    if host.names is not None:
        hosts = parse_hosts(host.names, tuple(cfg.hosts), str(config))
    result = plan_config(
        cfg,
        _load_caps(capabilities),
        hosts,
        security=not no_security,
        flake_dir=flake_dir,
        previous=_load_caps(previous),
    )
    if as_json:
        _echo_json(result.to_json())
        return
    print_plan(result)


def _print_argv(
    config: Path,
    instance: str | None,
    argv: bool,
    variant: str | None,
    capabilities: tuple[str, ...],
    given: dict[str, object],
) -> None:
    """``plan CONFIG INSTANCE --argv``: INSTANCE's argv as a JSON list, program first."""
    if not argv:
        name = "INSTANCE" if instance is not None else "--variant"
        fix = "add --argv to print INSTANCE's argv, or leave it out"
        raise UserError(Problem("llamanix plan", name, "only taken with --argv", fix))
    if instance is None:
        fix = "name the instance whose argv to print: llamanix plan CONFIG INSTANCE --argv"
        raise UserError(Problem("llamanix plan", "INSTANCE", "missing", fix))
    for name, value in given.items():
        if value:
            fix = f"leave {name} out: --argv prints one instance's argv"
            raise UserError(Problem("llamanix plan", name, "not taken with --argv", fix))
    assert instance is not None
    caps = _load_caps(capabilities)
    other = sorted(set(caps) - {"*", instance})
    if other:
        # A probe of another instance would check nothing here: said, never skipped silently.
        fix = f"give --capabilities FILE or {instance}=FILE: --argv prints {instance}'s argv"
        raise UserError(
            Problem(
                "llamanix plan", "--capabilities", f"a probe of '{other[0]}', not {instance}", fix
            )
        )
    probe = caps.get(instance, caps.get("*"))
    cfg = load_config(config)
    argv_words = instance_argv(cfg, instance, variant, probe)
    warning = dialect_warning(cfg, instance, variant, probe)
    if warning:
        click.echo(f"warning: {warning}", err=True)
    click.echo(json.dumps(argv_words))


@click.command()
@config_argument()
@click.option(
    "--out",
    "out",
    required=True,
    type=DIRECTORY,
    help="Directory for the units, argv files and manifest.json.",
)
@host_option()
@click.option("--user", is_flag=True, help="Render systemd --user units.")
@_capability_option(multiple=True)
def render(
    config: Path, out: Path, host: str | None, user: bool, capabilities: tuple[str, ...]
) -> None:
    """Write llamanix-NAME.service, NAME.argv.json and manifest.json for a host."""
    cfg = load_config(config)
    with host_flag(host):
        result = render_host(cfg, host, _load_caps(capabilities), user=True if user else None)
    refuse_unstated_nixos(cfg, [result.host])
    # The exporter, Prometheus and Grafana files ([metrics]): computed before anything is
    # written, so a mistake there writes nothing either.
    extra = observability_files(cfg, result.host, user=result.kind == "systemd-user")
    for inst in result.instances:
        for warning in inst.warnings:
            click.echo(f"warning: {inst.name}: {warning}", err=True)
    for path in write_render(result, out):
        click.echo(str(path))
    for name, text in extra.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        atomic_write(out / name, text)
        click.echo(str(out / name))


@click.command()
@click.argument("binary", type=FILE, required=False)
@click.option(
    "--diff",
    "diff",
    nargs=2,
    type=FILE,
    metavar="A.json B.json",
    help="Compare two saved probes: what a flip from build A to build B gains or loses.",
)
@json_flag
def probe(binary: Path | None, diff: tuple[Path, Path] | None, as_json: bool) -> None:
    """Read a llama-server's version and every flag it accepts from --version and --help.

    The dialect line says which family of flag spellings the binary's --help shows; rendering
    with --capabilities spells every flag for it.
    """
    if diff:
        _probe_diff(*diff, as_json=as_json)
        return
    if binary is None:
        raise UserError(
            Problem(
                "llamanix variant probe", "BINARY", "missing", "give a llama-server, or --diff A B"
            )
        )
    caps = probe_binary(binary)
    if as_json:
        _echo_json(caps.to_json())
        return
    click.echo(f"binary:      {caps.binary}")
    click.echo(f"dialect:     {caps.dialect or 'unknown (the variant declares it)'}")
    click.echo(f"version:     {caps.version}  build {caps.build}  commit {caps.commit}")
    click.echo(f"cuda:        {'yes' if caps.cuda else 'no'}")
    click.echo(f"flags:       {len(caps.flags)} (removed: {', '.join(caps.removed_flags) or '-'})")
    click.echo(f"spec types:  {', '.join(caps.spec_types) or '?'}")
    click.echo(f"-fa values:  {', '.join(caps.flash_attn_values) or '?'}")
    click.echo(f"cache types: {', '.join(caps.cache_types) or '?'}")


@click.command("schema")
@json_flag
@click.option(
    "--markdown", is_flag=True, help="Print the config reference (docs/configuration.md)."
)
def schema_cmd(as_json: bool, markdown: bool) -> None:
    """Print the config schema (what the NixOS module's options are made from)."""
    if as_json:
        click.echo(schema.schema_json_text(), nl=False)
        return
    if markdown:
        click.echo(schema.schema_markdown(), nl=False)
        return
    for table, fields in (
        ("hosts.NAME", schema.HOST_FIELDS),
        ("hosts.NAME.router", schema.ROUTER_FIELDS),
        ("instances.NAME / defaults", schema.INSTANCE_FIELDS),
        ("instances.NAME.speculative", schema.SPECULATIVE_FIELDS),
    ):
        click.echo(f"[{table}]")
        for f in fields:
            default = "absent" if f.default is None else json.dumps(f.default)
            click.echo(f"  {f.name:<18} {f.kind:<9} default {default:<12} {f.doc}")


def _probe_diff(a: Path, b: Path, as_json: bool) -> None:
    diff = probe_diff(load_capabilities(a), load_capabilities(b))
    if as_json:
        _echo_json(diff.to_json())
        return
    for what, gained, lost in (
        ("config keys", diff.gained_keys, diff.lost_keys),
        ("speculative types", diff.gained_spec_types, diff.lost_spec_types),
        ("cache types", diff.gained_cache_types, diff.lost_cache_types),
    ):
        click.echo(f"{what}: gains {', '.join(gained) or '-'}; loses {', '.join(lost) or '-'}")


def register(group: click.Group) -> None:
    for command in (validate, plan, render, schema_cmd):
        group.add_command(command)
