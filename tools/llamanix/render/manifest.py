"""The typed render of one host and its manifest: the format of ``manifest.json``, written last
(so a reader that trusts it never sees a half-written set) and read back only from disk, for a
render that was written earlier (``up``, ``render`` checks, switch and rollback)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from llamanix.core import file_reader, json_codec
from llamanix.core import json_fields as jf
from llamanix.core.errors import Problem, UserError
from llamanix.core.json_codec import OMIT_NONE, from_json_lenient
from llamanix.core.json_value import JsonObject
from llamanix.core.schema import HOST_KINDS, HostKind

MANIFEST = "manifest.json"


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
class ManifestInstance:
    """One instance's entry in the manifest. Read back, only ``unit`` is sure to be there: a
    set of installed units without a manifest has nothing else to say."""

    unit: str
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

    @staticmethod
    def from_json_entry(name: str, data: object) -> ManifestInstance:
        """The entry for instance ``name``, read leniently (a field missing or of the wrong type
        takes its default; the unit, the instance's own)."""
        if not isinstance(data, dict):
            raise ValueError(f"instance {name!r} is not a table")
        unit = jf.text(data.get("unit")) or unit_name(name)
        return from_json_lenient(ManifestInstance, {**data, "unit": unit}, f"instances.{name}")


@dataclass(frozen=True)
class ManifestRouter:
    """The router's entry: its unit, kind and endpoint, and the members behind it."""

    unit: str
    kind: str
    argv: tuple[str, ...]
    listen: str
    port: int
    served: Mapping[str, str]  # member instance -> the model name clients ask for
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

    # Hand-written: a router's unit, listen and kind take a router's defaults.
    @staticmethod
    def from_json_entry(data: object) -> ManifestRouter:
        """The router's entry, read leniently, with the defaults of a router's unit."""
        if not isinstance(data, dict):
            raise ValueError("router is not a table")
        served = jf.table(data.get("served"))
        variants = jf.table(data.get("variants"))
        port = jf.integer(data.get("port"))
        if port is None:
            raise ValueError("router has no port")
        return ManifestRouter(
            unit=jf.text(data.get("unit")) or unit_name("router"),
            kind=jf.text(data.get("kind")) or "",
            argv=jf.texts(data.get("argv")),
            listen=jf.text(data.get("listen")) or "127.0.0.1",
            port=port,
            served={k: v for k, v in served.items() if isinstance(v, str)},
            config_name=jf.text(data.get("config_name")),
            variants={k: v for k, v in variants.items() if isinstance(v, str)},
        )


@dataclass(frozen=True)
class ManifestGateway:
    """The gateway's entry: its unit, the LiteLLM release it runs and its endpoint."""

    unit: str
    version: str
    argv: tuple[str, ...]
    listen: str
    port: int
    config_name: str | None = None

    @staticmethod
    def of(r: RenderedInstance) -> ManifestGateway:
        return ManifestGateway(r.unit, r.version or "", r.argv, r.listen, r.port, r.config_name)

    # Hand-written: the gateway's unit and listen take a gateway's defaults.
    @staticmethod
    def from_json_entry(data: object) -> ManifestGateway:
        if not isinstance(data, dict):
            raise ValueError("gateway is not a table")
        port = jf.integer(data.get("port"))
        if port is None:
            raise ValueError("gateway has no port")
        return ManifestGateway(
            unit=jf.text(data.get("unit")) or unit_name("gateway"),
            version=jf.text(data.get("version")) or "",
            argv=jf.texts(data.get("argv")),
            listen=jf.text(data.get("listen")) or "127.0.0.1",
            port=port,
            config_name=jf.text(data.get("config_name")),
        )


@dataclass(frozen=True)
class Manifest:
    """``manifest.json``: which instances a render holds, and what each runs (a host without a
    router has no ``router`` key)."""

    config_hash: str
    host: str
    kind: HostKind
    instances: Mapping[str, ManifestInstance]
    router: ManifestRouter | None = field(default=None, metadata=OMIT_NONE)
    gateway: ManifestGateway | None = field(default=None, metadata=OMIT_NONE)

    def to_json(self) -> JsonObject:
        return json_codec.to_json(self)

    def text(self) -> str:
        return json.dumps(self.to_json(), indent=2) + "\n"

    # Hand-written reader: each entry takes the defaults of its own kind of unit.
    @staticmethod
    def from_json(text: str) -> Manifest:
        """The manifest in ``text``; ValueError when it is not one."""
        try:
            data = file_reader.parse_json(text, MANIFEST)
        except file_reader.FileRefused as err:
            raise ValueError(err.problems[0].message) from None
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        instances = data.get("instances")
        if not isinstance(instances, dict):
            raise ValueError("no instances table")
        kind = jf.choice(data.get("kind"), HOST_KINDS)
        if kind is None:
            raise ValueError(f"unknown host kind {data.get('kind')!r}")
        return Manifest(
            config_hash=jf.text(data.get("config_hash")) or "",
            host=jf.text(data.get("host")) or "",
            kind=kind,
            instances={
                str(name): ManifestInstance.from_json_entry(str(name), entry)
                for name, entry in instances.items()
            },
            router=None
            if data.get("router") is None
            else ManifestRouter.from_json_entry(data["router"]),
            gateway=None
            if data.get("gateway") is None
            else ManifestGateway.from_json_entry(data["gateway"]),
        )

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
            return Manifest.from_json(text)
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
