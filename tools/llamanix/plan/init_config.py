"""``llamanix init``: a starter config from what this machine has.

What it looks at, each through one external function: whether this is NixOS and whether systemd
runs it (the host's kind), the ``llama-server`` binaries on ``PATH`` and in the usual places
(each probed: its dialect names the variant it is), the GGUF files of a directory, and the GPUs
``nvidia-smi`` reports (the card's table name and compute capability). The text it returns is a
config in llamanix.toml's own shape, with comments that say where each value came from.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from llamanix.core.errors import ExternalCommandError, UserError
from llamanix.core.gpus import load_gpus
from llamanix.core.schema import HostKind
from llamanix.core.variants import VARIANTS
from llamanix.diagnose.doctor import parse_nvidia_smi
from llamanix.external import machine
from llamanix.external.listeners import listening_ports
from llamanix.external.llama_server import probe_binary
from llamanix.external.nvidia import nvidia_smi_gpus

# Where a llama-server is put by hand besides PATH: the install step of docs/debian.md, a build
# tree under /opt, the roots `llamanix variant build` keeps (external/nix_build).
SEARCH_GLOBS = (
    "/usr/local/bin/llama-server",
    "/usr/bin/llama-server",
    "/opt/*/bin/llama-server",
    "/opt/*/build/bin/llama-server",
    "/var/lib/llamanix/builds/*/bin/llama-server",
)
# A probed dialect -> the variant whose build speaks it (every variant's own dialect).
VARIANT_OF_DIALECT = {v.dialect.name: v.name for v in VARIANTS.values()}
FIRST_PORT = 8080
STARTER_CONTEXT = 8192


@dataclass(frozen=True)
class FoundBinary:
    path: str
    variant: str | None  # None: it could not be run or asked (``why`` says so)
    describe: str  # its version line, or why it is not used
    why: str = ""


@dataclass(frozen=True)
class FoundGpu:
    label: str  # as nvidia-smi names it
    compute_capability: str
    table_name: str | None  # its name in llamanix's GPU table, when it has one


@dataclass(frozen=True)
class Machine:
    """What ``init`` found here."""

    os_name: str
    kind: HostKind
    kind_why: str
    binaries: tuple[FoundBinary, ...]
    models: tuple[Path, ...]
    gpus: tuple[FoundGpu, ...]
    taken_ports: frozenset[int] = field(default_factory=frozenset)


def find_binaries(extra: tuple[Path, ...] = ()) -> list[str]:
    """Every llama-server on PATH, in the usual places and among ``extra``, once each (by
    the file it resolves to), in that order."""
    found: list[str] = []
    seen: set[str] = set()
    candidates = [str(p) for p in extra]
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        if directory:
            candidates.append(os.path.join(directory, "llama-server"))
    for pattern in SEARCH_GLOBS:
        candidates.extend(sorted(glob.glob(pattern)))
    for candidate in candidates:
        path = os.path.abspath(candidate)
        if not os.path.isfile(path) or not os.access(path, os.X_OK):
            continue
        real = os.path.realpath(path)
        if real not in seen:
            seen.add(real)
            found.append(path)
    return found


def probe(path: str) -> FoundBinary:
    try:
        caps = probe_binary(path)
    except (UserError, ExternalCommandError, OSError) as err:
        return FoundBinary(path, None, "", f"not used: {str(err).splitlines()[0]}")
    variant = VARIANT_OF_DIALECT.get(caps.dialect or "")
    version = f"version {caps.version or '?'}, commit {caps.commit or '?'}"
    if variant is None:
        return FoundBinary(
            path,
            None,
            version,
            f"not used: its --help ({version}) speaks no dialect llamanix knows",
        )
    return FoundBinary(path, variant, f"{version}, {caps.dialect} dialect")


def find_models(directory: Path | None) -> list[Path]:
    """The GGUF files of ``directory`` and its subdirectories (a model's shards once, its
    projector files left out: neither is a model of its own)."""
    if directory is None:
        return []
    models = []
    for path in sorted(directory.rglob("*.gguf")):
        name = path.name.lower()
        if "mmproj" in name:
            continue
        shard = re.search(r"-(\d{5})-of-\d{5}\.gguf$", name)
        if shard and shard.group(1) != "00001":
            continue
        models.append(path.absolute())
    return models


def find_gpus() -> list[FoundGpu]:
    text = nvidia_smi_gpus()
    if text is None:
        return []
    by_label = {gpu.label.lower(): name for name, gpu in load_gpus().items()}
    return [
        FoundGpu(g.name, g.compute_capability, by_label.get(g.name.lower()))
        for g in parse_nvidia_smi(text)
    ]


def host_kind() -> tuple[HostKind, str]:
    """The kind this machine's units take, and why."""
    if machine.is_nixos():
        return "nixos", "this machine is NixOS (/etc/NIXOS)"
    if machine.systemd_booted():
        return "systemd", f"{machine.os_pretty_name()}, systemd runs it (/run/systemd/system)"
    return "systemd", (
        f"{machine.os_pretty_name()} without systemd: run the instances with "
        "`llamanix up`, which needs no units"
    )


def look(models_dir: Path | None, binaries: tuple[Path, ...]) -> Machine:
    kind, why = host_kind()
    return Machine(
        os_name=machine.os_pretty_name(),
        kind=kind,
        kind_why=why,
        binaries=tuple(probe(path) for path in find_binaries(binaries)),
        models=tuple(find_models(models_dir)),
        gpus=tuple(find_gpus()),
        taken_ports=listening_ports(),
    )


def host_name_here() -> str:
    """This machine's name as a config key: lower case letters, digits and dashes."""
    name = re.sub(r"[^a-z0-9-]+", "-", machine.hostname().lower()).strip("-")
    return name or "box"


def _q(value: str) -> str:
    return json.dumps(value)


def config_text(found: Machine, host: str, instance: str, models_dir: Path | None) -> str:
    """The starter config: one host (this machine), one instance on the first model found."""
    lines = [
        "# llamanix.toml, written by `llamanix init` from what this machine has. Edit it, then",
        "# check it: llamanix validate FILE; see what it would run: llamanix plan FILE.",
        "",
        f"[hosts.{host}]",
        f"# {found.kind_why}",
        f"kind = {_q(found.kind)}",
    ]
    gpu = found.gpus[0] if found.gpus else None
    if gpu is not None:
        if gpu.table_name is not None:
            lines.append(f"gpu = {_q(gpu.table_name)}  # {gpu.label}, from nvidia-smi")
        else:
            lines.append(
                f"# nvidia-smi names {gpu.label}, which llamanix's GPU table lacks "
                "(llamanix model ceiling --list): no gpu key, so plan shows no VRAM fit"
            )
        lines.append(f"cuda_archs = [{_q(gpu.compute_capability)}]  # its compute capability")
        for other in found.gpus[1:]:
            lines.append(f"# also found: {other.label} ({other.compute_capability})")
    else:
        lines.append("# no GPU found (no nvidia-smi, or it answered nothing): a CPU server")
    usable: dict[str, FoundBinary] = {}
    for binary in found.binaries:
        if binary.variant is not None:
            usable.setdefault(binary.variant, binary)
    if found.kind != "nixos":
        entries = ", ".join(f"{v} = {_q(b.path)}" for v, b in usable.items())
        for binary in found.binaries:
            said = f"{binary.variant}: {binary.describe}" if binary.variant else binary.why
            lines.append(f"# {binary.path}: {said}")
        if not found.binaries:
            lines.append(
                "# no llama-server found on PATH or in /usr/local/bin, /opt: build one "
                "(docs/debian.md, `llamanix variant build`) and name it here"
            )
        lines.append(f"binaries = {{ {entries} }}")
    lines.append("")
    model = found.models[0] if found.models else None
    variant = next(iter(usable), "upstream") if found.kind != "nixos" else "upstream"
    port = next(p for p in range(FIRST_PORT, 65536) if p not in found.taken_ports)
    lines += [f"[instances.{instance}]", f"host = {_q(host)}", f"variant = {_q(variant)}"]
    if model is not None:
        lines.append(f"model = {_q(str(model))}")
    else:
        where = f"in {models_dir}" if models_dir is not None else "(no --models DIR given)"
        lines.append(f"# no GGUF file found {where}: name yours")
        lines.append('model = "/srv/models/MODEL.gguf"')
    lines.append(f"port = {port}" + ("" if port == FIRST_PORT else "  # 8080 is taken here"))
    lines.append(f"context = {STARTER_CONTEXT}  # the model's own may be larger: plan shows VRAM")
    if gpu is not None:
        lines.append('gpu_layers = "all"')
    for more in found.models[1:]:
        lines.append(f"# also found: {more} (another [instances.NAME] with its own port)")
    return "\n".join(lines) + "\n"


def llamanix_command() -> str:
    """How the user ran llamanix, for the next command to print: the installed script's path
    (sudo's PATH may not have it), else plain ``llamanix``."""
    import sys

    argv0 = sys.argv[0]
    if os.path.basename(argv0) == "llamanix" and os.path.isabs(argv0):
        return argv0
    return shutil.which("llamanix") or "llamanix"
