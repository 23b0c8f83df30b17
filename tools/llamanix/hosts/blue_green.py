"""Blue-green switch: the new server serves before the old one stops (``switch --blue-green``).

A plain restart leaves a gap of one model load, which other machines' clients see as refused
requests (the fence, ``external.nft``) unless a gateway sends them elsewhere. Where the host has
room for two copies of the model, a blue-green switch hands the port over instead:

1. a *bridge* starts: the new render of the instance as a runtime unit of its own
   (``/run/systemd/system/llamanix-NAME-bridge.service``: its own port, state and cache
   directories, the same sandbox), and its start waits for its readiness check;
2. new connections from other machines to the instance's port are redirected to the bridge
   (nftables), and new requests on connections open to the old server are refused (its
   fence), so they come back on a new connection, to the bridge; the old server finishes what
   it has (the drain) and stops;
3. the instance's own unit starts with the new render, on its own port, while the bridge
   serves; once it serves, the redirect ends and the bridge is fenced in turn, drained,
   stopped and removed.

Other machines' clients then always find a server. Clients on the host itself (loopback) are not
redirected: they see the old server until it stops and the new one after its load, as with a
restart. A client that keeps a connection open and has a request refused on it must send it
again on a new one, as a gateway does (LiteLLM retries).

**VRAM.** Two copies of the model are loaded at once, for the new server's load time: on a GPU
that is twice the model's VRAM (weights, KV cache, compute buffers). The switch checks that
against the host's GPU (``[hosts.NAME] gpu``) and restarts as usual where it does not fit, or
where the host's GPU is not named, and says why. On the CPU the two copies share the page cache
of one model file (mmap), so only the KV cache and buffers are doubled.
"""

from __future__ import annotations

import shutil
import socket
from dataclasses import dataclass, replace
from pathlib import Path

from llamanix.config.model import Config
from llamanix.core.address import is_loopback
from llamanix.core.errors import UserError
from llamanix.core.gpus import load_gpus
from llamanix.core.schema import BRIDGE_SUFFIX
from llamanix.core.types import child_name
from llamanix.render.units import config_hash, render_instance

SUFFIX = BRIDGE_SUFFIX  # no instance name ends in it (core.schema)
RUNTIME_UNITS = "/run/systemd/system"
GIB = 1 << 30


@dataclass(frozen=True)
class Bridge:
    """The bridge of one instance: its runtime unit and the port it serves on."""

    name: str  # the instance
    unit: str
    unit_text: str
    port: int


def free_port(listen: str) -> int:
    """A port nothing listens on now, on the instance's address."""
    address = "0.0.0.0" if listen in ("0.0.0.0", "::") else listen
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


def why_not(config: Config, name: str, gpu: bool, user: bool) -> str | None:
    """Why the instance cannot switch blue-green here (None: it can)."""
    inst = config.instances[name]
    if user:
        return "user units: the redirect needs root (nftables)"
    if is_loopback(inst.listen):
        return "it listens on loopback, which is not redirected"
    if not gpu:
        return None
    host = config.hosts[inst.host]
    if host.gpu is None:
        return (
            "two copies of the model must fit in VRAM at once, and the host's GPU is not named "
            f"(set hosts.{host.name}.gpu)"
        )
    from llamanix.render.host_render import instance_budget  # reads the model file

    try:
        need = instance_budget(inst)[1].total
    except UserError as err:
        return f"two copies of the model must fit in VRAM, and its size is unknown: {err}"
    card = load_gpus()[host.gpu]
    if 2 * need > card.memory_gib * GIB:
        return (
            f"two copies need {2 * need / GIB:.1f} GiB of VRAM, the {card.label} has "
            f"{card.memory_gib:g} GiB"
        )
    return None


def bridge_for(config: Config, name: str, user: bool) -> Bridge:
    """The new render of instance ``name`` as a bridge: its own unit, port, state and cache."""
    inst = config.instances[name]
    port = free_port(inst.listen)
    twin = replace(inst, name=f"{name}{SUFFIX}", port=port)
    twinned = replace(config, instances={**config.instances, twin.name: twin})
    rendered = render_instance(twinned, twin, None, user, config_hash(config))
    return Bridge(name, rendered.unit, rendered.unit_text, port)


def remove_bridge_directories(bridge: Bridge) -> None:
    """The bridge's own state and cache directories, which systemd keeps after its unit is
    gone (with DynamicUser=, under private/ behind a link)."""
    name = child_name(bridge.unit.removesuffix(".service"))
    if not (name.startswith("llamanix-") and name.endswith(SUFFIX)):
        raise ValueError(f"{bridge.unit} is not a bridge's unit")  # never another unit's state
    for base in (Path("/var/lib"), Path("/var/cache")):
        link = base / name
        if link.is_symlink():
            link.unlink()
        for directory in (base / "private" / name, base / name):
            if directory.is_dir() and not directory.is_symlink():
                shutil.rmtree(directory, ignore_errors=True)
