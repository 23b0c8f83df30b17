"""What changed between two of a host's renders: the instances a switch or rollback restarts
and gates, those it removes, and what a set of render files serves.

One side is what is installed or recorded, read back from its files (``RenderFiles``: the
files and their manifest, parsed once); the new side of a switch is its typed Render. Pure
functions of what they are given: no file is read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from llamanix.render.gateway import UNIT_NAME as GATEWAY_UNIT
from llamanix.render.manifest import (
    MANIFEST,
    Manifest,
    ManifestInstance,
    ManifestRouter,
    Render,
    unit_name,
)


def unit_settings(text: str) -> list[str]:
    """A unit's lines as systemd reads them: comments (``#``, ``;``) and blank lines out. Each
    unit's header names the config it came from and that config's hash, so any change to the
    config changes every unit's text; only a change here is a change to the service."""
    return [
        line
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith(("#", ";"))
    ]


def same_unit(old: str | None, new: str | None) -> bool:
    """Whether two unit texts configure the same service (comments aside)."""
    if old is None or new is None:
        return old is new
    return unit_settings(old) == unit_settings(new)


# A manifest read back that does not read is named, never taken for a set of units of another.
_MANIFEST_FIX = "restore it from a backup, or remove this generation's directory"


@dataclass(frozen=True)
class RenderFiles:
    """A set of render files read back (a generation's, or what a manager finds installed)
    with their manifest, parsed once (None: a bare set of installed units, no manifest)."""

    files: dict[str, str]
    manifest: Manifest | None = None

    @staticmethod
    def read_back(files: dict[str, str], folder: Path) -> RenderFiles:
        """``files`` as read from ``folder``; a manifest among them that does not read is one
        line naming it (what each switch and rollback compares with must be what it says)."""
        text = files.get(MANIFEST)
        if text is None:
            return RenderFiles(files)
        return RenderFiles(files, Manifest.read(text, folder / MANIFEST, _MANIFEST_FIX))

    def instances(self) -> dict[str, ManifestInstance]:
        """The instances the files hold, by their manifest."""
        if self.manifest is None:
            # A bare set of installed units (no manifest): one entry per unit file.
            return {
                n[len("llamanix-") : -len(".service")]: ManifestInstance(unit=n)
                for n in self.files
                if n.startswith("llamanix-") and n.endswith(".service")
            }
        return dict(self.manifest.instances)

    @property
    def router(self) -> ManifestRouter | None:
        return None if self.manifest is None else self.manifest.router

    def routed_members(self) -> tuple[str, dict[str, str]] | None:
        """(the router's unit, its members); None without a router."""
        router = self.router
        return None if router is None else (router.unit, dict(router.served))

    def served_names(self) -> set[str]:
        """Every instance the files serve: their own units' and the router's members."""
        return set(self.instances()) | set((self.routed_members() or ("", {}))[1])


def router_changes(new: RenderFiles, old: Mapping[str, str]) -> list[str]:
    """The members to gate again: all of them when the router's unit changed (its config, and
    so any member's flags, is in the unit), none otherwise."""
    routed = new.routed_members()
    if routed is None:
        return []
    unit, served = routed
    return sorted(served) if not same_unit(old.get(unit), new.files.get(unit)) else []


def diff_files(new: RenderFiles, old: RenderFiles) -> tuple[list[str], list[str]]:
    """(changed or added, removed) instance names between two sets of files from disk (a
    recorded generation against what is installed: rollback)."""
    new_i, old_i = new.instances(), old.instances()
    changed = []
    for name, entry in new_i.items():
        unit, argv = entry.unit, f"{name}.argv.json"
        if (
            name not in old_i
            or not same_unit(old.files.get(unit), new.files.get(unit))
            or (argv in old.files and new.files.get(argv) != old.files.get(argv))
        ):
            changed.append(name)
    changed += router_changes(new, old.files)
    serving = set(new_i) | set((new.routed_members() or ("", {}))[1])
    return sorted(set(changed)), sorted(set(old_i) - serving)


def diff_instances(
    new: Render, new_files: Mapping[str, str], old: RenderFiles
) -> tuple[list[str], list[str]]:
    """(changed or added, removed) instance names: the typed new render (and ``new_files``,
    its files) against the files of what is installed or recorded (the only side read back
    from text)."""
    old_i = old.instances()
    changed = []
    for inst in new.instances:
        argv = f"{inst.name}.argv.json"
        if (
            inst.name not in old_i
            or not same_unit(old.files.get(inst.unit), inst.unit_text)
            or (argv in old.files and new_files[argv] != old.files.get(argv))
        ):
            changed.append(inst.name)
    router = new.router
    # A router's unit carries its config, and so every member's flags: all are gated again.
    if router is not None and not same_unit(old.files.get(router.unit), router.unit_text):
        changed += router.served
    serving = set(new.names()) | set(router.served if router else {})
    return sorted(set(changed)), sorted(set(old_i) - serving)


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
    new: Render, new_files: Mapping[str, str], old: RenderFiles
) -> tuple[list[str], list[str]]:
    """(changed or added, removed) of a switch: ``diff_instances``, the gateway's unit a change
    of its own."""
    changed, removed = diff_instances(new, new_files, old)
    return gateway_changes(new, old.files, changed, removed)
