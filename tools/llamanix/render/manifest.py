"""The typed render of one host and its manifest: the format of ``manifest.json``, written last
(so a reader that trusts it never sees a half-written set) and read back only from disk, for a
render that was written earlier (``up``, ``render`` checks, rollback)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llamanix.core.errors import Problem, UserError
from llamanix.core.schema import HostKind

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class RenderedInstance:
    """One instance as rendered: its unit text and exact argv, and what the manifest says."""

    name: str
    unit: str
    unit_text: str
    argv: tuple[str, ...]
    variant: str
    source_revision: str | None
    version: str | None
    environment: Mapping[str, str]
    listen: str
    port: int
    alias: str | None
    gpu: bool
    # What the renderer wants the user to know (e.g. the binary speaks another dialect than
    # its variant declares); printed by `llamanix render`, not written to any file.
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class Render:
    """A host's render, immutable: switch receives it typed and serialises it only where files
    are written (``files()``)."""

    host: str
    kind: HostKind
    config_hash: str
    instances: tuple[RenderedInstance, ...] = ()

    def manifest(self) -> dict[str, Any]:
        return {
            "config_hash": self.config_hash,
            "host": self.host,
            "kind": self.kind,
            "instances": {
                r.name: {
                    "unit": r.unit,
                    "variant": r.variant,
                    "source_revision": r.source_revision,
                    "version": r.version,
                    "argv": list(r.argv),
                    "environment": dict(r.environment),
                    "listen": r.listen,
                    "port": r.port,
                    "alias": r.alias,
                    "gpu": r.gpu,
                }
                for r in self.instances
            },
        }

    def files(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for r in self.instances:
            out[r.unit] = r.unit_text
            out[f"{r.name}.argv.json"] = json.dumps(list(r.argv), indent=2) + "\n"
        out[MANIFEST] = json.dumps(self.manifest(), indent=2) + "\n"
        return out

    def names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.instances)


def read_manifest(out: Path) -> dict[str, Any]:
    path = out / MANIFEST
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(
            Problem(str(path), "", "no render here", "run llamanix render CONFIG --out DIR first")
        ) from None
    except json.JSONDecodeError as err:
        raise UserError(Problem(str(path), "", f"not a llamanix manifest: {err}")) from None
    if not isinstance(data, dict):
        raise UserError(Problem(str(path), "", "not a llamanix manifest"))
    return data
