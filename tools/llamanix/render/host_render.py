"""The one way a command renders a host: ``render.units`` with each router member's VRAM need.

A router's residency (which members stay loaded together, which take turns) follows from what
each member needs in VRAM, and that comes from its model file, which only ``measure`` reads;
``render`` sits below ``measure`` and stays a pure function of what it is given. So the need is
computed here, once per render, and validate, render, plan, up, switch and the test bed all
call this ``render_host``: a routed host renders the same whichever command renders it.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from llamanix.config.host_choice import pick_host
from llamanix.config.model import Config, Instance
from llamanix.core.errors import ExternalCommandError, UserError
from llamanix.core.probe import commit_of
from llamanix.core.variants import VARIANTS
from llamanix.external import nix
from llamanix.external.llama_server import binary_version_line
from llamanix.render import units
from llamanix.render.manifest import Render, RenderedInstance
from llamanix.render.units import CapabilityMap

if TYPE_CHECKING:
    from llamanix.model.ceiling import VramBudget
    from llamanix.model.gguf_info import GgufInfo


def instance_budget(inst: Instance) -> tuple[GgufInfo, VramBudget]:
    """The instance's model and the VRAM it needs with every layer offloaded (its draft and
    cache included); UserError when a model file is not readable here."""
    # Loaded only for a host with a GPU: some 40 ms (2-core machine) that a plan, validate or
    # render of any other host does not pay.
    from llamanix.model.ceiling import vram_breakdown
    from llamanix.model.gguf_info import read_gguf

    model = read_gguf(Path(inst.model))
    draft = (
        read_gguf(Path(inst.speculative.draft_model))
        if inst.speculative.draft_model and inst.speculative.enabled
        else None
    )
    context = inst.context or model.context_length or 4096
    budget = vram_breakdown(
        model,
        draft,
        context,
        inst.parallel or 1,
        inst.cache_type_k,
        inst.cache_type_v,
        inst.ubatch,
    )
    return model, budget


def member_vram(config: Config, host: str) -> dict[str, int | None] | None:
    """Each router member's VRAM need where its model is readable here (None otherwise), for
    the router's residency; None when the host has no router or no GPU table entry."""
    router = config.hosts[host].router
    if router is None or config.hosts[host].gpu is None:
        return None
    out: dict[str, int | None] = {}
    for name in router.members:
        try:
            out[name] = instance_budget(config.instances[name])[1].total
        except UserError:
            out[name] = None
    return out


def render_host(
    config: Config, host: str | None, caps: CapabilityMap | None = None, user: bool | None = None
) -> Render:
    """Render ``host`` (None: the config's only host) in memory; UserError, nothing written,
    when anything is wrong."""
    return render_known_host(config, pick_host(config, host), caps, user)


def render_known_host(
    config: Config, name: str, caps: CapabilityMap | None = None, user: bool | None = None
) -> Render:
    """Render the host ``name`` of the config, already resolved (``render_host`` resolves a
    name the user gave, or none)."""
    return units.render_host(config, name, caps, user, vram=member_vram(config, name))


def with_source_revisions(render: Render, config: Config, from_flake: bool) -> Render:
    """The render with each instance's source, where the probe did not already say: the
    flake.lock pin when the units run the flake's packages (NixOS), else the binary's
    --version."""
    locked = nix.locked_revisions(Path(config.source).resolve().parent) if from_flake else {}

    def revision(inst: RenderedInstance) -> str | None:
        if inst.source_revision:
            return inst.source_revision
        if from_flake:
            return locked.get(VARIANTS[inst.variant].flake_input or "nixpkgs")
        program = Path(inst.argv[0])
        if program.is_absolute() and os.access(program, os.X_OK):
            try:
                return commit_of(binary_version_line(program))
            except (ExternalCommandError, OSError, ValueError):
                return None
        return None

    return replace(
        render,
        instances=tuple(replace(i, source_revision=revision(i)) for i in render.instances),
    )
