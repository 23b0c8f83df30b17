"""The typed render of one host and its manifest: the format of ``manifest.json``, written last
(so a reader that trusts it never sees a half-written set) and read back only from disk, for a
render that was written earlier (``up``, ``render`` checks, switch and rollback)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from llamanix.core import file_reader
from llamanix.core.errors import Problem, UserError
from llamanix.core.json_codec import (
    MUST_READ,
    OMIT_NONE,
    JsonRecord,
    from_json_lenient,
    json_default,
)
from llamanix.core.schema import HostKind

MANIFEST = "manifest.json"


def unit_name(instance: str) -> str:
    """The systemd unit an instance runs as."""
    return f"llamanix-{instance}.service"


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
    # A router only: the config file it reads (carried in its unit) and its members, each with
    # the model name clients ask for.
    config_name: str | None = None
    config_text: str | None = None
    served: Mapping[str, str] = field(default_factory=dict)
    member_variants: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ManifestInstance(JsonRecord):
    """One instance's entry in the manifest. Read back, only ``unit`` is sure to be there: a
    set of installed units without a manifest has nothing else to say (a field missing or of
    the wrong type takes its default; the unit, the instance's own)."""

    unit: str = field(metadata=json_default(of_key=unit_name, if_empty=True))
    variant: str | None = None
    source_revision: str | None = None
    version: str | None = None
    argv: tuple[str, ...] = ()
    environment: Mapping[str, str] = field(default_factory=dict)
    listen: str | None = None
    port: int | None = None
    alias: str | None = None
    gpu: bool = False

    @staticmethod
    def of(r: RenderedInstance) -> ManifestInstance:
        return ManifestInstance(
            unit=r.unit,
            variant=r.variant,
            source_revision=r.source_revision,
            version=r.version,
            argv=r.argv,
            environment=r.environment,
            listen=r.listen,
            port=r.port,
            alias=r.alias,
            gpu=r.gpu,
        )


# What a router's or gateway's entry read back takes where a field is missing: the defaults of
# its kind of unit (only the port has none).
_LISTEN = json_default("127.0.0.1", if_empty=True)


@dataclass(frozen=True)
class ManifestRouter(JsonRecord):
    """The router's entry: its unit, kind and endpoint, and the members behind it."""

    unit: str = field(metadata=json_default(unit_name("router"), if_empty=True))
    kind: str = field(metadata=json_default(""))
    argv: tuple[str, ...] = field(metadata=json_default(()))
    listen: str = field(metadata=_LISTEN)
    port: int
    # member instance -> the model name clients ask for
    served: Mapping[str, str] = field(metadata=json_default({}))
    config_name: str | None = None
    variants: Mapping[str, str] = field(default_factory=dict)  # member -> its variant

    @staticmethod
    def of(r: RenderedInstance) -> ManifestRouter:
        return ManifestRouter(
            r.unit,
            r.variant,
            r.argv,
            r.listen,
            r.port,
            dict(r.served),
            r.config_name,
            dict(r.member_variants),
        )


@dataclass(frozen=True)
class ManifestGateway(JsonRecord):
    """The gateway's entry: its unit, the LiteLLM release it runs and its endpoint."""

    unit: str = field(metadata=json_default(unit_name("gateway"), if_empty=True))
    version: str = field(metadata=json_default(""))
    argv: tuple[str, ...] = field(metadata=json_default(()))
    listen: str = field(metadata=_LISTEN)
    port: int
    config_name: str | None = None

    @staticmethod
    def of(r: RenderedInstance) -> ManifestGateway:
        return ManifestGateway(r.unit, r.version or "", r.argv, r.listen, r.port, r.config_name)


@dataclass(frozen=True)
class Manifest(JsonRecord):
    """``manifest.json``: which instances a render holds, and what each runs (a host without a
    router has no ``router`` key). Read leniently (``parse``): each entry takes the defaults of
    its own kind of unit; a kind this version does not know, an entry that is not a table or
    a router or gateway without a port is no manifest."""

    config_hash: str = field(metadata=json_default(""))
    host: str = field(metadata=json_default(""))
    kind: HostKind
    instances: Mapping[str, ManifestInstance] = field(metadata=MUST_READ)
    router: ManifestRouter | None = field(default=None, metadata={**OMIT_NONE, **MUST_READ})
    gateway: ManifestGateway | None = field(default=None, metadata={**OMIT_NONE, **MUST_READ})

    def text(self) -> str:
        return json.dumps(self.to_json(), indent=2) + "\n"

    @staticmethod
    def parse(text: str) -> Manifest:
        """The manifest in ``text``; ValueError when it is not one."""
        try:
            data = file_reader.parse_json(text, MANIFEST)
        except file_reader.FileRefused as err:
            raise ValueError(err.problems[0].message) from None
        return from_json_lenient(Manifest, data)

    @staticmethod
    def load(out: Path, fix: str = "run llamanix render CONFIG --out DIR first") -> Manifest:
        """The manifest of the render in ``out``; UserError when there is none (``fix``: what
        to do then)."""
        path = out / MANIFEST
        text = file_reader.text_if_present(path, source=str(path))
        if text is None:
            raise UserError(Problem(str(path), "", "no render here", fix))
        return Manifest.read(text, path)

    @staticmethod
    def read(text: str, path: Path, fix: str = "") -> Manifest:
        """The manifest ``text`` read from ``path``; UserError naming it when it is not one.
        The one place a manifest read back is parsed."""
        try:
            return Manifest.parse(text)
        except ValueError as err:
            raise UserError(
                Problem(str(path), "", f"not a llamanix manifest: {err}", fix)
            ) from None


@dataclass(frozen=True)
class Render:
    """A host's render, immutable: switch receives it typed and serialises it only where files
    are written (``files()``)."""

    host: str
    kind: HostKind
    config_hash: str
    instances: tuple[RenderedInstance, ...] = ()
    router: RenderedInstance | None = None
    # The gateway's unit, on the host that runs it (docs/gateway.md).
    gateway: RenderedInstance | None = None

    def manifest(self) -> Manifest:
        return Manifest(
            config_hash=self.config_hash,
            host=self.host,
            kind=self.kind,
            instances={r.name: ManifestInstance.of(r) for r in self.instances},
            router=None if self.router is None else ManifestRouter.of(self.router),
            gateway=None if self.gateway is None else ManifestGateway.of(self.gateway),
        )

    def files(self) -> dict[str, str]:
        out: dict[str, str] = {}
        carriers = [r for r in (self.router, self.gateway) if r is not None]
        for r in (*self.instances, *carriers):
            out[r.unit] = r.unit_text
            out[f"{r.name}.argv.json"] = json.dumps(list(r.argv), indent=2) + "\n"
        for r in carriers:
            if r.config_name:
                # For reading only: the unit carries the same text as its credential.
                out[r.config_name] = r.config_text or ""
        out[MANIFEST] = self.manifest().text()
        return out

    def names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.instances)
