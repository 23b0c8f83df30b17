"""Render a host's instances into hardened systemd units, argv files and a manifest.

Everything is computed in memory first, so a bad config writes nothing; then the previous render
moves to ``DIR/.previous/`` (the rollback point) and each new file is written atomically, the
manifest last, so a reader that trusts the manifest never sees a half-written set.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import llamanix
from llamanix.config.argv import (
    SLOT_SAVE_FLAG,
    dialect_warning,
    flatten,
    instance_arg_pieces,
    resolve_variant,
    state_dir_spec,
)
from llamanix.config.host_choice import pick_host
from llamanix.config.model import Config, Host, Instance, suggest
from llamanix.core.address import connect_url, is_loopback
from llamanix.core.errors import Problem, UserError
from llamanix.core.probe import Capabilities
from llamanix.core.readiness import start_timeout_s
from llamanix.core.residency import Residency
from llamanix.core.types import child_name
from llamanix.core.visibility import protect_home
from llamanix.external.files import atomic_write
from llamanix.external.paths import script_interpreter
from llamanix.render import gateway as gateways
from llamanix.render import router as routing
from llamanix.render import systemd
from llamanix.render.manifest import MANIFEST, Manifest, Render, RenderedInstance, unit_name
from llamanix.render.unit_templates import unit_template

PREVIOUS = ".previous"
# The unit name of a host's router (an instance may not take it on a routed host).
ROUTER = "router"
# The NVIDIA device nodes CUDA opens (control, per-GPU, UVM and capability nodes), bound into the
# private /dev of a GPU system unit with gpu_sandbox = "private-dev", the way container runtimes
# do. "-": a node absent on this machine (a GPU index beyond the installed ones, nvidia-caps
# without MIG) is skipped; the control and UVM nodes are required, so a host that has not created
# them fails the start with the missing path.
NVIDIA_NODES = (
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "-/dev/nvidia-uvm-tools",
    "-/dev/nvidia-caps",
    *(f"-/dev/nvidia{i}" for i in range(16)),
)
CREDENTIAL = "api-key"
# systemd's specifier for $CREDENTIALS_DIRECTORY: the key file is read there by llama-server,
# so neither the key nor its source path needs to be in argv.
_CREDENTIAL_PATH = f"%d/{CREDENTIAL}"


def systemd_escape_arg(arg: str) -> str:
    """One ExecStart word (render/systemd.py's ``exec_word``)."""
    return systemd.exec_word(arg)


def llamanix_command() -> list[str]:
    """How a unit runs llamanix itself (its readiness check): the running llamanix, resolved now.

    The running interpreter's own script first, so a venv that is not on PATH (``sudo`` resets
    PATH) names its own ``bin/llamanix``; else the command on PATH, resolved (in the NixOS
    module's build that is the llamanix package's store path); else this interpreter by the path
    it was started with, never resolved through its symlink, or a venv's python would lose its
    venv.
    """
    own = Path(sys.executable).parent / "llamanix"
    if sys.executable and own.is_file() and os.access(own, os.X_OK):
        return [str(own.resolve())]
    found = shutil.which("llamanix")
    if found:
        return [str(Path(found).resolve())]
    return [str(Path(sys.executable).absolute()), "-m", "llamanix"]


def llamanix_paths() -> list[str]:
    """What of llamanix the unit's readiness check must see: the command, the interpreter its
    ``#!`` line names (a venv's python, which may be a symlink elsewhere) and the package.

    The package is this process's: the command on PATH is assumed to be the same install.
    """
    command = llamanix_command()[0]
    interpreter = script_interpreter(command)
    package = str(Path(llamanix.__file__).resolve().parent)
    return [command, *([interpreter] if interpreter else []), package]


def home_paths(inst: Instance, program: str) -> list[str]:
    """The paths of an instance's unit that ProtectHome= must leave visible: what it runs (the
    server and llamanix itself, the readiness check) and the models it reads."""
    return [program, inst.model, inst.speculative.draft_model or "", llamanix_command()[0]]


def _readiness_line(inst: Instance, api_key: bool) -> systemd.UnitText:
    words = [*llamanix_command(), "readiness", "--url", connect_url(inst.listen, inst.port)]
    for path in (inst.model, inst.speculative.draft_model):
        if path:
            words += ["--model", path]
    # A unit's control process cannot read its credentials before systemd 256 (system units
    # with DynamicUser=, and user units, whose sandbox is a mount namespace): "+" starts the
    # check outside the sandbox, as root in a system unit and as the user in a user unit; it
    # reads the key as the server sees it and becomes the server's user before any request
    # (llamanix.server.readiness says why that is safe).
    if api_key:
        words += ["--api-key-file", _CREDENTIAL_PATH, "--as-server-user"]
    # systemd substitutes the main process's pid: the check stops as soon as the server exits.
    words += ["--pid", "$MAINPID"]
    return systemd.exec_line(
        words, keep=(_CREDENTIAL_PATH, "$MAINPID"), prefix="+" if api_key else ""
    )


# Peers a listener on a wildcard or private address is meant for: loopback, link-local, RFC 1918,
# shared address space (RFC 6598, used by overlay VPNs) and IPv6 unique-local. A server bound to a
# public address gets no IP filter: it was put there to be reached from anywhere.
LOCAL_NETWORKS = (
    "localhost",
    "link-local",
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "100.64.0.0/10",
    "fc00::/7",
)
_LOCAL_NETS = [ipaddress.ip_network(n) for n in LOCAL_NETWORKS[2:]] + [
    ipaddress.ip_network("169.254.0.0/16"),
    ipaddress.ip_network("fe80::/10"),
]
# llama-server flags (and OpenMP variables) that pin threads, change their priority or their
# NUMA policy: these need the @resources system calls (sched_setaffinity, setpriority, mbind).
_RESOURCE_FLAGS = frozenset(
    {
        "-C", "--cpu-mask", "-Cr", "--cpu-range", "--cpu-strict", "--prio",
        "-Cb", "--cpu-mask-batch", "-Crb", "--cpu-range-batch", "--cpu-strict-batch",
        "--prio-batch", "--numa",
    }
)  # fmt: skip
# llama-server flags that download a model at start: such an instance talks to the internet, so
# it gets no IP filter.
_DOWNLOAD_FLAGS = frozenset(
    {"-hf", "-hfr", "--hf-repo", "-hfd", "-hfrd", "--hf-repo-draft", "-mu", "--model-url",
     "-hfv", "-hfrv", "--hf-repo-v", "-hffv", "--hf-file-v", "--docker-repo", "-dr"}
)  # fmt: skip
_RESOURCE_ENV = frozenset({"GOMP_CPU_AFFINITY", "OMP_PROC_BIND", "OMP_PLACES", "KMP_AFFINITY"})


def ip_allow_list(listen: str) -> tuple[str, ...] | None:
    """IPAddressAllow= for a listen address (with IPAddressDeny=any), or None for no IP filter.

    Loopback listeners only ever talk to this machine; wildcard and private listeners to this
    machine and the local networks; a public address to anyone, so it gets no filter.
    """
    if is_loopback(listen):
        return ("localhost",)
    try:
        addr = ipaddress.ip_address(listen)
    except ValueError:
        return None  # a host name: which addresses it stands for is not known when rendering
    local = any(addr in net for net in _LOCAL_NETS if net.version == addr.version)
    if addr.is_unspecified or local:
        return LOCAL_NETWORKS
    return None


def _flags(argv: list[str]) -> set[str]:
    """The flag names in argv (``--x=v`` counts as ``--x``)."""
    return {token.split("=", 1)[0] for token in argv}


def downloads(argv: list[str]) -> bool:
    return bool(_flags(argv) & _DOWNLOAD_FLAGS)


def wants_network(listen: str, download: bool) -> bool:
    """Whether a unit waits for network-online.target: only a server reachable beyond loopback,
    or one that downloads its model at start, needs the network up. Every other unit orders
    after network.target alone, as nixpkgs' llama-cpp and llama-swap modules do, so booting
    does not wait for the network for a loopback listener."""
    return download or not is_loopback(listen)


def uses_gpu(host: Host, inst: Instance, caps: Capabilities | None) -> bool:
    """Whether an instance's unit opens the NVIDIA devices: the host names a GPU or CUDA archs,
    or the probe of its own build says CUDA (a NixOS instance with its own cudaArchs or
    package on a host without either); gpu_layers = 0 keeps it on the CPU even then."""
    return (host.has_gpu or (caps is not None and caps.cuda)) and inst.gpu_layers != 0


def needs_resource_syscalls(argv: list[str], environment: Mapping[str, str]) -> bool:
    """Whether the instance pins threads or sets priorities/NUMA policy (the @resources group)."""
    return bool(_flags(argv) & _RESOURCE_FLAGS) or bool(set(environment) & _RESOURCE_ENV)


def _environment_lines(state: str, own: Mapping[str, str]) -> list[systemd.UnitText]:
    """The unit's Environment= lines: HOME and LLAMA_CACHE in its cache directory, then the
    config's own variables. HOME is the server's to write, and a keyed unit's readiness check
    runs as root under the same environment: PYTHONNOUSERSITE keeps that Python from loading
    anything from HOME (a config can set no PYTHON* variable)."""
    return [
        systemd.assignment("HOME", f"%C/{state}", expand=True),
        systemd.assignment("LLAMA_CACHE", f"%C/{state}", expand=True),
        systemd.assignment("PYTHONNOUSERSITE", "1"),
        *(systemd.assignment(k, v) for k, v in sorted(own.items())),
    ]


def config_hash(config: Config) -> str:
    canonical = json.dumps(config.raw, sort_keys=True, separators=(",", ":"), default=str)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


CapabilityMap = Mapping[str, Capabilities]


def capabilities_for(caps: CapabilityMap, instance: str) -> Capabilities | None:
    """Per-instance probe if one was given for it, else the one given for all ("*")."""
    return caps.get(instance, caps.get("*"))


def render_instance(
    config: Config, inst: Instance, caps: Capabilities | None, user: bool, digest: str
) -> RenderedInstance:
    host = config.host_of(inst)
    variant = resolve_variant(inst, None, config.source)
    pieces = instance_arg_pieces(config, inst.name, None, caps)
    argv = flatten(pieces)
    unit_pieces = instance_arg_pieces(config, inst.name, None, caps, api_key_path=_CREDENTIAL_PATH)
    # The credential's and the state directory's specifiers are systemd's to expand.
    unescaped = (_CREDENTIAL_PATH, state_dir_spec(inst.name))
    exec_start = systemd.exec_line(flatten(unit_pieces), keep=unescaped)
    environment = _environment_lines(f"llamanix-{inst.name}", inst.environment)
    gpu = uses_gpu(host, inst, caps)
    download = downloads(argv)
    # Models and builds often live in a home directory on desktop machines; read-only keeps
    # them readable. llamanix itself (the readiness check) may be installed there, too.
    home = protect_home(home_paths(inst, argv[0]), user)
    model_files = [p for p in (inst.model, inst.speculative.draft_model) if p]
    text = unit_template("llamanix.service.j2").render(
        source=systemd.comment(Path(config.source).name),
        config_hash=digest[:19],
        name=inst.name,
        variant=variant.name,
        exec_start=exec_start,
        exec_start_post=_readiness_line(inst, inst.api_key_file is not None),
        timeout_start_s=start_timeout_s(model_files),
        environment=environment,
        api_key_file=_key_credential(inst.api_key_file),
        user=user,
        gpu=gpu,
        protect_home=home,
        ip_allow=None if download else ip_allow_list(inst.listen),
        network_online=wants_network(inst.listen, download),
        proc_all_reason=None,
        resources=gpu or needs_resource_syscalls(argv, inst.environment),
        gpu_sandbox=host.gpu_sandbox,
        nvidia_nodes=NVIDIA_NODES,
        wanted_by="default.target" if user else "multi-user.target",
        credentials=[],
    )
    return RenderedInstance(
        name=inst.name,
        unit=unit_name(inst.name),
        unit_text=text,
        argv=tuple(argv),
        variant=variant.name,
        source_revision=caps.commit if caps else None,
        version=caps.version if caps else None,
        environment=dict(inst.environment),
        listen=inst.listen,
        port=inst.port,
        alias=inst.alias,
        gpu=gpu,
        warnings=tuple(
            w
            for w in [dialect_warning(config, inst.name, None, caps), _warm_warning(inst, argv)]
            if w
        ),
    )


def _warm_warning(inst: Instance, argv: list[str]) -> str | None:
    """One line when warm_switch is on and the probed build has no slot API."""
    if not inst.warm_switch or SLOT_SAVE_FLAG in argv:
        return None
    return (
        f"instances.{inst.name}.warm_switch: {argv[0]} has no {SLOT_SAVE_FLAG}, so its "
        "switches are cold"
    )


def render_host(
    config: Config,
    host: str | None,
    caps: CapabilityMap | None = None,
    user: bool | None = None,
    vram: Mapping[str, int | None] | None = None,
) -> Render:
    """Render in memory; raises UserError (nothing written) when anything is wrong.

    ``vram``: each router member's VRAM need, for the router's residency (None: unknown, as
    for a host without a GPU). Commands call ``render.host_render.render_host``, which reads
    the needs from the model files (a render stays a pure function of what it is given)."""
    name = pick_host(config, host)
    kind = config.hosts[name].kind
    as_user = (kind == "systemd-user") if user is None else user
    digest = config_hash(config)
    caps = caps or {}
    for key in caps:
        if key != "*" and key not in config.instances:
            raise UserError(
                Problem(
                    config.source,
                    "--capabilities",
                    f"no instance '{key}'",
                    suggest(key, tuple(config.instances)),
                )
            )
    problems: list[Problem] = []
    rendered: list[RenderedInstance] = []
    router = config.hosts[name].router
    members = router.members if router else ()
    for inst in config.instances_on(name):
        if inst.name in members:
            continue  # a child of the router's unit, not a unit of its own
        try:
            rendered.append(
                render_instance(config, inst, capabilities_for(caps, inst.name), as_user, digest)
            )
        except UserError as err:
            problems.extend(err.problems)
    routed = None
    if router is not None:
        try:
            routed = render_router(config, name, caps, as_user, digest, vram)
        except UserError as err:
            problems.extend(err.problems)
    gateway = None
    if config.gateway is not None and config.gateway.host == name and kind == "systemd":
        # A NixOS host runs nixpkgs' services.litellm, configured by the module instead.
        gateway = gateways.render_unit(config, digest, llamanix_command())
    if problems:
        raise UserError(problems)
    return Render(
        host=name,
        kind="systemd-user" if as_user else kind,
        config_hash=digest,
        instances=tuple(rendered),
        router=routed,
        gateway=gateway,
    )


def _key_credential(api_key_file: str | None) -> systemd.UnitText | None:
    """LoadCredential='s value for a key file: systemd reads it, llama-server gets %d/api-key."""
    return None if api_key_file is None else systemd.credential_path(CREDENTIAL, api_key_file)


@dataclass(frozen=True)
class _RouterProgram:
    """What the router runs, per kind: its config file (name and text), its command line and
    the environment its members share."""

    config_name: str
    config_text: str
    argv: list[str]
    environment: Mapping[str, str]


def _llama_server_router(
    config: Config,
    host_name: str,
    members: list[routing.Member],
    insts: list[Instance],
    plan: Residency,
    key_path: str | None,
) -> _RouterProgram:
    """llama-server in router mode: the members as sections of its preset file."""
    config_name = routing.PRESET_FILE
    config_text = routing.preset_ini(config, host_name, members)
    argv = routing.llama_server_router_argv(
        config, host_name, members, plan, f"%d/{config_name}", key_path
    )
    environment_of = insts[0].environment  # equal for all members (config.model checks)
    return _RouterProgram(config_name, config_text, argv, environment_of)


def _llama_swap_router(
    config: Config,
    host_name: str,
    members: list[routing.Member],
    plan: Residency,
    model_files: list[str],
) -> _RouterProgram:
    """llama-swap: refused without its path or with a key file; the members in its YAML."""
    host = config.hosts[host_name]
    router = routing.router_of(config, host_name)
    where = f"hosts.{host_name}.router"
    binary = router.binary or ("llama-swap" if host.kind == "nixos" else None)
    if binary is None:
        raise UserError(
            Problem(
                config.source,
                f"{where}.binary",
                "missing: llamanix needs llama-swap's path on this host",
                'set binary = "/usr/local/bin/llama-swap"',
            )
        )
    if router.api_key_file:
        raise UserError(
            Problem(
                config.source,
                f"{where}.api_key_file",
                "a llama-swap router cannot take a key file yet (its apiKeys would put the "
                "key into its config)",
                'leave it out and keep the router on loopback, or use kind = "llama-server"',
            )
        )
    config_name = routing.SWAP_FILE
    config_text = routing.swap_yaml(config, host_name, members, plan, start_timeout_s(model_files))
    # On NixOS the module names nixpkgs' llama-swap (services.llamanix.router.package).
    argv = [binary, "--config", f"%d/{config_name}"]
    argv += ["--listen", f"{router.listen}:{router.port}"]
    return _RouterProgram(config_name, config_text, argv, {})


def _router_program(
    config: Config,
    host_name: str,
    members: list[routing.Member],
    insts: list[Instance],
    plan: Residency,
    model_files: list[str],
    key_path: str | None,
) -> _RouterProgram:
    """The router's program for its kind: llama-server's router mode or llama-swap."""
    if routing.router_of(config, host_name).kind == "llama-server":
        return _llama_server_router(config, host_name, members, insts, plan, key_path)
    return _llama_swap_router(config, host_name, members, plan, model_files)


def render_router(
    config: Config,
    host_name: str,
    caps: CapabilityMap,
    user: bool,
    digest: str,
    vram: Mapping[str, int | None] | None = None,
) -> RenderedInstance:
    """The router's one unit: llama-server in router mode, or llama-swap, with the members as
    its children and its config carried in the unit as a credential."""
    host = config.hosts[host_name]
    router = routing.router_of(config, host_name)
    members = routing.members(config, host_name, caps)
    insts = [config.instances[m.name] for m in members]
    plan = routing.residency(config, host_name, vram, _gpu_memory(host.gpu))
    model_files = [p for i in insts for p in (i.model, i.speculative.draft_model) if p]
    key_path = _CREDENTIAL_PATH if router.api_key_file else None
    program = _router_program(config, host_name, members, insts, plan, model_files, key_path)
    argv = program.argv
    environment = _environment_lines("llamanix-router", program.environment)
    # Decided per member as for an instance of its own: a member whose build's probe says CUDA
    # needs the devices even on a host that names no GPU.
    gpu = any(uses_gpu(host, i, capabilities_for(caps, i.name)) for i in insts)
    # A member that downloads its model talks to the internet: no IP filter, as for an instance.
    download = any(downloads(m.argv) for m in members)
    programs = [m.pieces[0].tokens[0] for m in members]
    home = protect_home([argv[0], *programs, *model_files, llamanix_command()[0]], user)
    text = unit_template("llamanix.service.j2").render(
        source=systemd.comment(Path(config.source).name),
        config_hash=digest[:19],
        name=ROUTER,
        variant=router.kind,
        exec_start=systemd.exec_line(argv, keep=[w for w in argv if w.startswith("%d/")]),
        exec_start_post=_router_readiness_line(
            router.listen, router.port, members, model_files, key_path
        ),
        timeout_start_s=start_timeout_s(model_files),
        environment=environment,
        api_key_file=_key_credential(router.api_key_file),
        user=user,
        gpu=gpu,
        protect_home=home,
        ip_allow=None if download else ip_allow_list(router.listen),
        network_online=wants_network(router.listen, download),
        # llama-swap reads /proc/meminfo (nixpkgs' services.llama-swap dropped ProcSubset=pid for
        # it); a GPU unit has ProcSubset=all anyway.
        proc_all_reason=systemd.comment(
            "llama-swap reads /proc/meminfo, which ProcSubset=pid would hide."
        )
        if router.kind == "llama-swap"
        else None,
        resources=gpu
        or any(
            needs_resource_syscalls(m.argv, i.environment)
            for m, i in zip(members, insts, strict=True)
        ),
        gpu_sandbox=host.gpu_sandbox,
        nvidia_nodes=NVIDIA_NODES,
        wanted_by="default.target" if user else "multi-user.target",
        credentials=[systemd.credential(program.config_name, program.config_text)],
    )
    return RenderedInstance(
        name=ROUTER,
        unit=unit_name(ROUTER),
        unit_text=text,
        argv=tuple(argv),
        variant=router.kind,
        source_revision=None,
        version=None,
        environment=dict(program.environment),
        listen=router.listen,
        port=router.port,
        alias=None,
        gpu=gpu,
        config_name=program.config_name,
        config_text=program.config_text,
        served={m.name: m.served_as for m in members},
        member_variants={i.name: i.variant for i in insts},
    )


def member_entries(
    config: Config, render: Render, caps: CapabilityMap | None = None
) -> list[RenderedInstance]:
    """The router's members as instances of their own: each with its own argv, run by the
    router's unit (what plan shows and what the path checks look at)."""
    routed = render.router
    if routed is None:
        return []
    out: list[RenderedInstance] = []
    for name in routed.served:
        inst = config.instances[name]
        probe = capabilities_for(caps or {}, name)
        out.append(
            replace(
                routed,
                name=name,
                argv=tuple(flatten(instance_arg_pieces(config, name, None, probe))),
                variant=inst.variant,
                alias=inst.alias,
                warnings=tuple(w for w in [dialect_warning(config, name, None, probe)] if w),
            )
        )
    return out


def _gpu_memory(gpu: str | None) -> int | None:
    if gpu is None:
        return None
    from llamanix.core.gpus import load_gpus

    return round(load_gpus()[gpu].memory_gib * 2**30)


def _router_readiness_line(
    listen: str,
    port: int,
    members: list[routing.Member],
    model_files: list[str],
    key_path: str | None,
) -> systemd.UnitText:
    """Started means every member answers through the router, each loaded in turn."""
    words = [*llamanix_command(), "readiness", "--url", connect_url(listen, port)]
    for m in members:
        words += ["--served-model", m.served_as]
    for path in model_files:
        words += ["--model", path]
    if key_path:
        words += ["--api-key-file", key_path, "--as-server-user"]
    words += ["--pid", "$MAINPID"]
    keep = ("$MAINPID", *([key_path] if key_path else []))
    return systemd.exec_line(words, keep=keep, prefix="+" if key_path else "")


def write_render(render: Render, out: Path) -> list[Path]:
    """Keep the current render as .previous, then write the new one file by file, atomically."""
    out.mkdir(parents=True, exist_ok=True)
    current = _rendered_files(out)
    for name in current:
        _inside(out, name)
    if current:
        staging = out / f"{PREVIOUS}.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        for name in current:
            shutil.copy2(out / name, staging / name)
        old = out / f"{PREVIOUS}.old"
        shutil.rmtree(old, ignore_errors=True)
        if (out / PREVIOUS).exists():
            (out / PREVIOUS).rename(old)
        staging.rename(out / PREVIOUS)
        shutil.rmtree(old, ignore_errors=True)
    files = render.files()
    for name in files:
        _inside(out, name)
    written: list[Path] = []
    for name, text in files.items():
        if name == MANIFEST:
            continue
        atomic_write(out / name, text)
        written.append(out / name)
    atomic_write(out / MANIFEST, files[MANIFEST])
    written.append(out / MANIFEST)
    for name in set(current) - set(files):
        (out / name).unlink(missing_ok=True)
    return written


def _inside(out: Path, name: str) -> Path:
    """``out/name``, or UserError when the name would leave ``out`` (a name in a manifest read
    back from disk is as untrusted as one from a config)."""
    try:
        return out / child_name(name)
    except ValueError as err:
        raise UserError(
            Problem(str(out), "", f"refused to write or remove {err}", "check the manifest")
        ) from None


def _rendered_files(out: Path) -> list[str]:
    try:
        found: Manifest | None = Manifest.load(out)
    except UserError:
        found = None
    if found is None:
        return []
    names = [MANIFEST]
    for name, entry in found.instances.items():
        names += [entry.unit, f"{name}.argv.json"]
    return [n for n in names if (out / n).exists()]
