"""What changed between two of a host's renders: the instances a switch or rollback restarts
and gates, those it removes, and what a set of render files serves.

One side is what is installed or recorded, read back from its files (their manifest); the new
side of a switch is its typed Render. Pure functions of what they are given: no file is read.
"""

from __future__ import annotations

from collections.abc import Mapping

from llamanix.render.gateway import UNIT_NAME as GATEWAY_UNIT
from llamanix.render.manifest import (
    MANIFEST,
    Manifest,
    ManifestInstance,
    ManifestRouter,
    Render,
    same_unit,
    unit_name,
)


def manifest_instances(files: Mapping[str, str]) -> dict[str, ManifestInstance]:
    """The instances a set of render files holds, by the manifest among them."""
    if MANIFEST not in files:
        # A bare set of installed units (no manifest): one entry per unit file.
        return {
            n[len("llamanix-") : -len(".service")]: ManifestInstance(unit=n)
            for n in files
            if n.startswith("llamanix-") and n.endswith(".service")
        }
    return dict(Manifest.parse(files[MANIFEST]).instances)


def routed_members(files: Mapping[str, str]) -> tuple[str, dict[str, str]] | None:
    """(the router's unit, its members) of a set of render files; None without a router."""
    router = manifest_router(files)
    return None if router is None else (router.unit, dict(router.served))


def router_changes(new: Mapping[str, str], old: Mapping[str, str]) -> list[str]:
    """The members to gate again: all of them when the router's unit changed (its config, and
    so any member's flags, is in the unit), none otherwise."""
    routed = routed_members(new)
    if routed is None:
        return []
    unit, served = routed
    return sorted(served) if not same_unit(old.get(unit), new.get(unit)) else []


def diff_files(new: dict[str, str], old: dict[str, str]) -> tuple[list[str], list[str]]:
    """(changed or added, removed) instance names between two sets of files from disk (a
    recorded generation against what is installed: rollback)."""
    new_i, old_i = manifest_instances(new), manifest_instances(old)
    changed = []
    for name, entry in new_i.items():
        unit, argv = entry.unit, f"{name}.argv.json"
        if (
            name not in old_i
            or not same_unit(old.get(unit), new.get(unit))
            or (argv in old and new.get(argv) != old.get(argv))
        ):
            changed.append(name)
    changed += router_changes(new, old)
    serving = set(new_i) | set((routed_members(new) or ("", {}))[1])
    return sorted(set(changed)), sorted(set(old_i) - serving)


def diff_instances(
    new: Render, new_files: Mapping[str, str], old: Mapping[str, str]
) -> tuple[list[str], list[str]]:
    """(changed or added, removed) instance names: the typed new render (and ``new_files``,
    its files) against the files of what is installed or recorded (the only side read back
    from text)."""
    old_i = manifest_instances(old)
    changed = []
    for inst in new.instances:
        argv = f"{inst.name}.argv.json"
        if (
            inst.name not in old_i
            or not same_unit(old.get(inst.unit), inst.unit_text)
            or (argv in old and new_files[argv] != old.get(argv))
        ):
            changed.append(inst.name)
    router = new.router
    # A router's unit carries its config, and so every member's flags: all are gated again.
    if router is not None and not same_unit(old.get(router.unit), router.unit_text):
        changed += router.served
    serving = set(new.names()) | set(router.served if router else {})
    return sorted(set(changed)), sorted(set(old_i) - serving)


def served_names(files: Mapping[str, str]) -> set[str]:
    """Every instance a set of render files serves: its own units' and the router's members."""
    return set(manifest_instances(files)) | set((routed_members(files) or ("", {}))[1])


def manifest_router(files: Mapping[str, str]) -> ManifestRouter | None:
    """The router a set of render files holds (their manifest was checked when they were
    read: ``check_manifest``)."""
    if MANIFEST not in files:
        return None
    return Manifest.parse(files[MANIFEST]).router


def gateway_changes(
    render: Render, old: Mapping[str, str], changed: list[str], removed: list[str]
) -> tuple[list[str], list[str]]:
    """The gateway's unit counts as a change of its own (its start check is its gate)."""
    unit = unit_name(GATEWAY_UNIT)
    if render.gateway is not None and not same_unit(old.get(unit), render.gateway.unit_text):
        changed = sorted({*changed, GATEWAY_UNIT})
    if render.gateway is None and unit in old:
        removed = sorted({*removed, GATEWAY_UNIT})
    return changed, removed


def render_changes(
    new: Render, new_files: Mapping[str, str], old: Mapping[str, str]
) -> tuple[list[str], list[str]]:
    """(changed or added, removed) of a switch: ``diff_instances``, the gateway's unit a change
    of its own."""
    changed, removed = diff_instances(new, new_files, old)
    return gateway_changes(new, old, changed, removed)
