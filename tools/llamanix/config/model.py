"""The config model: llamanix.toml (or the same shape as JSON) read, checked and typed.

Every problem is collected as a ``Problem`` naming the file and the field, so one run of
``llamanix validate`` lists them all; nothing downstream ever sees an invalid config.
Values the user left out stay ``None`` here: the renderer decides what "absent" means for each
variant (usually: not rendered, so the binary's own default applies).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeAlias, TypeVar, cast

from llamanix.core import file_reader, schema
from llamanix.core.address import SshTarget, is_loopback, parse_target
from llamanix.core.api_key import key_env
from llamanix.core.errors import Problem, UserError, one_line
from llamanix.core.gpus import load_gpus
from llamanix.core.schema import (
    SPEC_DRAFTERS,
    SPEC_TYPES_WITH_DRAFT_MODEL,
    Field,
    GatewayKind,
    GpuSandbox,
    HostKind,
    NixosSudo,
    RouterKind,
    RoutingStrategy,
    VariantName,
)
from llamanix.core.types import TYPES, TextKind, shown, text_problem
from llamanix.core.variants import DRAFTER_SETTINGS, VARIANTS, Variant, variant_for_other_name

IMPLICIT_HOST = "local"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# llama-swap's config schema: a model's env entries match ^[A-Z_][A-Z0-9_]*=.
_SWAP_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
# The host name --host gives to mean every host of a config, so no host may take it.
ALL_HOSTS = "all"
_CUDA_ARCH = re.compile(r"^\d+\.\d+[af]?$")
# Environment variables through which llama-server would read a key: a key there would end up
# in the unit text, so it is refused in favour of api_key_file.
_SECRET_ENV = ("LLAMA_API_KEY", "LLAMA_ARG_API_KEY")


# Speculative parameters besides type and the draft model, in the order argv renders them. They
# belong to the first type of a chain.
SPEC_PARAMS = ("n_max", "n_min", "p_min", "draft_ctx_size", "dflash_max_slots", "dflash_cross_ctx")

# What a field's check (_Checker.value) gives back, by the schema's kind: a string (str, path,
# enum, a layer word), a number, a boolean, a tuple of strings (list_str, enum_list) or a table
# of strings (dict_str).
FieldValue: TypeAlias = str | int | float | bool | tuple[str, ...] | dict[str, str]
_Number = TypeVar("_Number", int, float)
_Record = TypeVar("_Record")


@dataclass(frozen=True)
class Speculative:
    # One type, or a chain (TOML: a string or a list); ("none",) = no speculation.
    types: tuple[str, ...] = ("none",)
    draft_model: str | None = None
    draft_gpu_layers: int | str | None = None
    draft_cache_type_k: str | None = None
    draft_cache_type_v: str | None = None
    draft_device: str | None = None
    draft_cpu_moe: bool | None = None
    n_max: int | None = None
    n_min: int | None = None
    p_min: float | None = None
    draft_ctx_size: int | None = None
    dflash_max_slots: int | None = None
    dflash_cross_ctx: int | None = None

    @property
    def type(self) -> str:
        """The first type of the chain: the one the parameters belong to."""
        return self.types[0]

    @property
    def enabled(self) -> bool:
        return self.types != ("none",)

    @property
    def chain(self) -> bool:
        return len(self.types) > 1

    @property
    def label(self) -> str:
        """The chain as the config says it: "mtp" or "mtp+ngram-mod"."""
        return "+".join(self.types)


@dataclass(frozen=True)
class Router:
    """One endpoint in front of some of a host's instances (``[hosts.NAME.router]``)."""

    kind: RouterKind
    members: tuple[str, ...]
    listen: str = "127.0.0.1"
    port: int = 8080
    idle_ttl: int = 0  # seconds; 0 = never unloaded
    max_loaded: int | None = None  # None: what fits together (plan), else all
    api_key_file: str | None = None
    keyless: bool = False  # open beyond loopback without a key, on purpose
    binary: str | None = None  # llama-swap on systemd hosts


@dataclass(frozen=True)
class Gateway:
    """One endpoint in front of the instances of every host (``[gateway]``, docs/gateway.md)."""

    kind: GatewayKind
    host: str
    api_key_file: str
    listen: str = "127.0.0.1"
    port: int = 4000
    version: str = schema.LITELLM_VERSION
    routing_strategy: RoutingStrategy = "simple-shuffle"
    retries: int = 8
    health_check_interval: int = 5
    affinity: bool = True
    no_affinity: tuple[str, ...] = ()
    conversations: int = 4096

    def affinity_of(self, group: str) -> bool:
        """Whether a model group's conversations keep their replica."""
        return self.affinity and group not in self.no_affinity


@dataclass(frozen=True)
class Metrics:
    """Each host's exporter and the alerts rendered for it (``[metrics]``,
    docs/observability.md)."""

    listen: str = "127.0.0.1"
    allow_remote: bool = False
    port: int = 9465
    scrape_interval: int = 15
    min_ceiling_share: float = 0.25
    min_acceptance_share: float = 0.8


@dataclass(frozen=True)
class Host:
    name: str
    kind: HostKind = "nixos"
    target: SshTarget | None = None
    gpu: str | None = None
    cuda_archs: tuple[str, ...] = ()
    binaries: dict[str, str] = field(default_factory=dict)
    gpu_sandbox: GpuSandbox = "device-allow"
    router: Router | None = None
    # NixOS hosts: where nixos-rebuild builds, and how it gets root on the target.
    build_host: str | None = None
    sudo: NixosSudo = "auto"
    # False where the config does not say the kind (no [hosts] table at all, or a table without
    # kind): "nixos" is then a default, which a command acting on this machine checks.
    kind_stated: bool = True

    @property
    def has_gpu(self) -> bool:
        return self.gpu is not None or bool(self.cuda_archs)

    @property
    def runs_own_switch(self) -> bool:
        """A remote plain-systemd host: switched by its own llamanix over ssh. A NixOS host
        with a target is switched from here (nixos-rebuild --target-host)."""
        return self.target is not None and self.kind in ("systemd", "systemd-user")


@dataclass(frozen=True)
class Instance:
    name: str
    host: str
    model: str
    variant: VariantName = "upstream"
    binary: str | None = None
    alias: str | None = None
    listen: str = "127.0.0.1"
    port: int = 8080
    context: int | None = None
    gpu_layers: int | str | None = None
    flash_attn: str | None = None
    cache_type_k: str | None = None
    cache_type_v: str | None = None
    parallel: int | None = None
    batch: int | None = None
    ubatch: int | None = None
    threads: int | None = None
    jinja: bool | None = None  # None: absent, llamanix wants the template on (schema default)
    reasoning_budget: int | None = None
    metrics: bool = True
    warm_switch: bool = False
    api_key_file: str | None = None
    keyless: bool = False  # open beyond loopback without a key, on purpose
    extra_args: tuple[str, ...] = ()
    environment: dict[str, str] = field(default_factory=dict)
    speculative: Speculative = field(default_factory=Speculative)


@dataclass(frozen=True)
class Config:
    source: str
    hosts: dict[str, Host]
    instances: dict[str, Instance]
    raw: Mapping[str, object]
    gateway: Gateway | None = None
    metrics: Metrics | None = None

    def host_of(self, instance: Instance) -> Host:
        return self.hosts[instance.host]

    def instances_on(self, host: str) -> list[Instance]:
        return [i for i in self.instances.values() if i.host == host]


def suggest(word: str, choices: list[str] | tuple[str, ...]) -> str:
    """The closest known name (a typo's fix), else the names there are."""
    from rapidfuzz import fuzz, process

    other = variant_for_other_name(word)
    if other is not None and other.name in choices:
        return f"did you mean '{other.name}'? variant {other.name} is {other.description}"
    close = process.extract(word, list(choices), scorer=fuzz.ratio, score_cutoff=60, limit=None)
    if close:
        # Of equally close names the last in sort order, as difflib chose before.
        return f"did you mean '{max(close, key=lambda m: (m[1], m[0]))[0]}'?"
    return "known: " + ", ".join(choices)


class _Checker:
    """Collects problems while converting raw TOML values to typed ones."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.problems: list[Problem] = []

    def add(self, where: str, message: str, fix: str = "") -> None:
        self.problems.append(Problem(self.source, where, message, fix))

    def table(self, where: str, value: object) -> Mapping[str, object]:
        if isinstance(value, dict):
            return value
        self.add(where, f"must be a table, got {_describe(value)}", f"write [{where}]")
        return {}

    def unknown_keys(self, where: str, data: Mapping[str, object], known: tuple[str, ...]) -> None:
        for key in data:
            if key not in known:
                self.add(f"{where}.{key}", "unknown key", suggest(key, known))

    def table_values(
        self,
        where: str,
        raw: object,
        fields: Mapping[str, Field],
        missing: Mapping[str, str],
    ) -> dict[str, FieldValue | None] | None:
        """A table of ``fields`` (``[gateway]``, a host's router, ``[metrics]``): each value
        given, checked; a required one not given is named with its fix from ``missing``. None
        when any is wrong or missing (each named)."""
        table = self.table(where, raw)
        self.unknown_keys(where, table, tuple(fields))
        values: dict[str, FieldValue | None] = {}
        for key, f in fields.items():
            if key in table:
                values[key] = self.value(f"{where}.{key}", f, table[key])
            elif f.required:
                self.add(f"{where}.{key}", "missing", missing[key])
                values[key] = None
        return None if any(v is None for v in values.values()) else values

    def value(
        self, where: str, f: Field, value: object, variants: tuple[str, ...] = ()
    ) -> FieldValue | None:
        """Check one value against its field; returns the value or None when wrong."""
        kind = f.kind
        if kind in (schema.STR, schema.PATH):
            if not isinstance(value, str) or not value:
                self.add(where, f"must be a non-empty string, got {_describe(value)}")
                return None
            if kind == schema.PATH and not value.startswith("/"):
                self.add(where, f"{shown(value)} is a relative path", "use an absolute path")
                return None
            return self.text(where, f, value)
        if kind == schema.BOOL:
            if not isinstance(value, bool):
                self.add(where, f"must be true or false, got {_describe(value)}")
                return None
            return value
        if kind == schema.INT:
            if isinstance(value, bool) or not isinstance(value, int):
                self.add(where, f"must be an integer, got {_describe(value)}")
                return None
            return self._bounds(where, f, value)
        if kind == schema.FLOAT:
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
            ):
                self.add(where, f"must be a number, got {_describe(value)}")
                return None
            return self._bounds(where, f, float(value))
        if kind == schema.ENUM_LIST:
            return self._enum_list(where, f, value)
        if kind == schema.ENUM:
            choices = variants if (f.name == "variant" and variants) else f.values
            if not isinstance(value, str) or value not in choices:
                given = one_line(value) if isinstance(value, str) else _describe(value)
                self.add(where, f"unknown value '{given}'", suggest(str(given), choices))
                return None
            return value
        if kind == schema.LAYERS:
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                if f.maximum is not None and value > f.maximum:
                    self.add(
                        where,
                        f"{value} is above the maximum {_number(f.maximum)}",
                        'write "all" to offload every layer',
                    )
                    return None
                return value
            if isinstance(value, str) and value in ("all", "auto"):
                return value
            self.add(
                where,
                f'must be a non-negative integer, "all" or "auto", got {_describe(value)}',
            )
            return None
        if kind == schema.LIST_STR:
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                bad = _first_not_str(value)
                self.add(where, f"must be a list of strings, got {bad}", _quote_fix(value))
                return None
            items = [self.text(f"{where}[{i}]", f, v) for i, v in enumerate(value)]
            return None if None in items else tuple(value)
        if kind == schema.DICT_STR:
            if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
                bad = _first_not_str(value)
                self.add(where, f"must be a table of strings, got {bad}", _quote_fix(value))
                return None
            ok = True
            for key, item in value.items():
                assert f.keys is not None  # a table of strings declares its keys' type
                if (
                    self.name(f"{where}.{_key(key)}", key, f.keys) is None
                    or self.text(f"{where}.{_key(key)}", f, item) is None
                ):
                    ok = False
            return dict(value) if ok else None
        raise AssertionError(f"schema kind {kind!r} has no check")  # a bug in schema.py

    def text(self, where: str, f: Field, value: str) -> str | None:
        """A string checked against its field's declared type (core.types)."""
        assert f.text is not None  # every string field declares one (core.schema)
        if f.text == "ssh_target":
            # ssh's own reading says more precisely what is wrong than the pattern does.
            try:
                parse_target(value)
            except ValueError as err:
                self.add(where, f"{shown(value)} {err}", TARGET_FIX)
                return None
        problem = text_problem(f.text, value)
        if problem is not None:
            self.add(where, problem, TYPES[f.text].fix)
            return None
        return value

    def name(self, where: str, value: str, kind: TextKind = schema.TABLE_NAME) -> str | None:
        """A table's name (or a table of strings' key) checked against its type."""
        problem = text_problem(kind, value)
        if problem is not None:
            self.add(where, problem, TYPES[kind].fix)
            return None
        return value

    def _enum_list(self, where: str, f: Field, value: object) -> tuple[str, ...] | None:
        given_items: list[object] = value if isinstance(value, list) else [value]
        if not given_items:
            self.add(where, "is an empty list", f'write one value, e.g. "{f.values[0]}"')
            return None
        items: list[str] = []
        for item in given_items:
            if not isinstance(item, str) or item not in f.values:
                given = one_line(item) if isinstance(item, str) else _describe(item)
                self.add(where, f"unknown value '{given}'", suggest(str(given), f.values))
                return None
            items.append(item)
        if len(items) > 1 and "none" in items:
            self.add(where, "'none' in a chain", 'write "none" alone, or leave it out')
            return None
        if len(set(items)) < len(items):
            self.add(where, "names a type twice", "name each type once")
            return None
        return tuple(items)

    def _bounds(self, where: str, f: Field, value: _Number) -> _Number | None:
        if f.minimum is not None and value < f.minimum:
            self.add(
                where,
                f"{_number(value)} is below the minimum {_number(f.minimum)}",
                _range_fix(f),
            )
            return None
        if f.maximum is not None and value > f.maximum:
            self.add(
                where,
                f"{_number(value)} is above the maximum {_number(f.maximum)}",
                _range_fix(f),
            )
            return None
        return value


# A checked value read back as its kind's type. The check made it so: anything else is a bug in
# core/schema.py, never in the file.


def _text(value: FieldValue | None) -> str | None:
    """A string field's value; None when absent or refused."""
    if value is None or isinstance(value, str):
        return value
    raise AssertionError(f"checked value {value!r} is not a string")


def _texts(value: FieldValue | None) -> tuple[str, ...]:
    """A list of strings' value; () when absent or refused."""
    if value is None or isinstance(value, tuple):
        return value or ()
    raise AssertionError(f"checked value {value!r} is not a tuple of strings")


def _text_table(value: FieldValue | None) -> dict[str, str]:
    """A table of strings' value; {} when absent or refused."""
    if value is None or isinstance(value, dict):
        return value or {}
    raise AssertionError(f"checked value {value!r} is not a table of strings")


def _record(record: Callable[..., _Record], values: Mapping[str, object]) -> _Record:
    """A config record from its checked values, by field name (a key left out keeps the
    record's default). The one place the schema's kinds meet the records' annotations, which
    mypy cannot follow through a table: tests/test_schema.py checks each field's kind against
    the annotation of the record field it fills."""
    return record(**values)


def _number(value: float) -> str:
    """A bound or a value as the user writes it: integers whole (never 1e+26), others short."""
    if isinstance(value, int):
        return str(value)
    return f"{value:g}"


def _range_fix(f: Field) -> str:
    lo = None if f.minimum is None else _number(f.minimum)
    hi = None if f.maximum is None else _number(f.maximum)
    if lo is not None and hi is not None:
        return f"use a value from {lo} to {hi}"
    if lo is not None:
        return f"use a value of at least {lo}"
    return f"use a value of at most {hi}"


def _first_not_str(value: object) -> str:
    """What a list or table of strings holds that is not a string: the item itself (an
    integer, a table...), with its key, so the message points at what to change."""
    if isinstance(value, list):
        for i, item in enumerate(value):
            if not isinstance(item, str):
                return f"{_describe(item)} at [{i}]"
    elif isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(item, str):
                return f"{_describe(item)} for {_key(key)}"
    return _describe(value)


def _quote_fix(value: object) -> str:
    """How to write the first item of a list or table of strings that is not one: a number or
    a boolean quoted (an environment variable's 1 is "1"), anything else as a string."""
    items: list[tuple[str | None, object]] = []
    if isinstance(value, dict):
        items = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, list):
        items = [(None, v) for v in value]
    for key, item in items:
        if isinstance(item, str):
            continue
        if isinstance(item, bool | int | float):
            quoted = json.dumps(json.dumps(item))
            return f"quote it: {_key(key)} = {quoted}" if key is not None else f"quote it: {quoted}"
        return "write it as a string"
    return ""


def _key(key: str) -> str:
    """A key as a dotted path writes it: bare where TOML allows, else quoted."""
    if _BARE_KEY.fullmatch(key):
        return key
    return '"' + one_line(key.replace("\\", "\\\\").replace('"', '\\"')) + '"'


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _describe(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return shown(value)
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "a list"
    return repr(value)


def config_text(data: bytes, source: str) -> str:
    """A config file's bytes as text: UTF-8, with or without the byte order mark some Windows
    editors write; anything else is refused at its line."""
    return file_reader.decode_utf8(data, source)


def read_config_text(path: Path) -> str:
    """The config file's text (see config_text); UserError when it cannot be read: through
    the one bounded reader, so a FIFO, a device or a symlink loop is one line, not a hang."""
    return file_reader.read_text(path)


def config_data(text: str, source: str, is_json: bool) -> dict[str, object]:
    """A config's text as the table ``parse_config`` checks: JSON (a key given twice refused)
    or TOML, nesting bounded, and no string or key holding a NUL byte (no path, name or
    argument can hold one: the kernel, systemd and argv all end a string there)."""
    data: object = (
        file_reader.parse_json(text, source) if is_json else file_reader.parse_toml(text, source)
    )
    if not isinstance(data, dict):
        raise UserError(Problem(source, "", "the top level must be a table"))
    nul = _nul_field(data)
    if nul is not None:
        raise UserError(
            Problem(source, nul, "holds a NUL byte", "remove it: no path, name or flag holds one")
        )
    return data


def _nul_field(data: Mapping[str, object]) -> str | None:
    """The dotted name of the first key or string value that holds a NUL byte, else None."""
    stack: list[tuple[str, object]] = [("", data)]
    while stack:
        where, node = stack.pop()
        if isinstance(node, str):
            if "\x00" in node:
                return where
        elif isinstance(node, dict):
            for key, value in node.items():
                name = f"{where}.{key}" if where else str(key)
                if "\x00" in str(key):
                    return name.replace("\x00", "\\x00")
                stack.append((name, value))
        elif isinstance(node, list):
            stack.extend((f"{where}[{i}]", item) for i, item in enumerate(node))
    return None


def load_config(path: Path) -> Config:
    """Read llamanix.toml (or a .json of the same shape, which the NixOS module writes)."""
    source = str(path)
    text = read_config_text(path)
    return parse_config(config_data(text, source, path.suffix == ".json"), source)


def config_table(path: Path) -> Mapping[str, object] | None:
    """The config's table as ``load_config`` decodes it, unchecked; None when the file cannot
    be read or decoded (shell completion: a TAB never fails, the command itself says what is
    wrong)."""
    try:
        return config_data(read_config_text(path), str(path), path.suffix == ".json")
    except UserError:
        return None


def parse_config(data: Mapping[str, object], source: str) -> Config:
    """Check and type a config; raises UserError listing every problem found."""
    c = _Checker(source)
    for key in data:
        if key not in schema.TOP_LEVEL:
            c.add(key, "unknown top-level table", suggest(key, schema.TOP_LEVEL))
    variants = tuple(VARIANTS)

    hosts = _parse_hosts(c, c.table("hosts", data.get("hosts", {})))
    defaults = c.table("defaults", data.get("defaults", {}))
    c.unknown_keys("defaults", defaults, (*schema.INSTANCE, *schema.INSTANCE_TABLES))
    instances_raw = c.table("instances", data.get("instances", {}))
    if not instances_raw and not c.problems:
        c.add("instances", "no instances defined", "add an [instances.NAME] table")
    if not hosts:
        hosts[IMPLICIT_HOST] = Host(IMPLICIT_HOST, kind_stated=False)

    instances: dict[str, Instance] = {}
    for name, raw in instances_raw.items():
        if c.name(f"instances.{_key(name)}", name) is None or not _free_name(c, name):
            continue
        inst = _parse_instance(
            c, name, defaults, c.table(f"instances.{name}", raw), hosts, variants
        )
        if inst is not None:
            instances[name] = inst

    _check_ports(c, instances, hosts)
    _check_routers(c, hosts, instances)
    _check_keys(c, hosts, instances)
    gateway = None
    if "gateway" in data:
        gateway = _parse_gateway(c, data["gateway"], hosts)
        if gateway is not None:
            _check_gateway(c, gateway, hosts, instances)
    metrics = None
    if "metrics" in data:
        metrics = _parse_metrics(c, data["metrics"], hosts, instances, gateway)
    for inst in instances.values():
        for where, message, fix in check_instance(inst, hosts[inst.host]):
            c.add(
                f"instances.{inst.name}.{where}" if where else f"instances.{inst.name}",
                message,
                fix,
            )
    c.problems.extend(what_a_unit_cannot_do(data, source, hosts, instances, gateway, metrics))
    if c.problems:
        raise UserError(c.problems)
    return Config(
        source=source,
        hosts=hosts,
        instances=instances,
        raw=data,
        gateway=gateway,
        metrics=metrics,
    )


def _free_name(c: _Checker, name: str) -> bool:
    """An instance's name is its unit's (llamanix-NAME.service): it may not be a unit llamanix
    derives for something else, the router's, the gateway's, the exporter's or a bridge's."""
    if name in schema.RESERVED_NAMES:
        c.add(
            f"instances.{name}",
            f"'{name}' is reserved: llamanix-{name}.service is llamanix's {name}",
            "rename the instance",
        )
        return False
    if name.endswith(schema.BRIDGE_SUFFIX):
        c.add(
            f"instances.{name}",
            f"names ending in '{schema.BRIDGE_SUFFIX}' are reserved: a blue-green switch of "
            f"instance '{name.removesuffix(schema.BRIDGE_SUFFIX)}' runs its bridge as "
            f"llamanix-{name}.service",
            "rename the instance",
        )
        return False
    return True


def _parse_hosts(c: _Checker, raw: Mapping[str, object]) -> dict[str, Host]:
    hosts: dict[str, Host] = {}
    known = (*schema.HOSTS, *schema.HOST_TABLES)
    for name, table in raw.items():
        where = f"hosts.{_key(name)}"
        if c.name(where, name) is None:
            continue
        if name == ALL_HOSTS:
            # --host all names every host: a host of that name would be one of two things.
            c.add(
                where, "'all' is what --host all means (every host)", "give this host another name"
            )
            continue
        table = c.table(where, table)
        c.unknown_keys(where, table, known)
        values: dict[str, FieldValue | None] = {}
        for key, f in schema.HOSTS.items():
            if key in table:
                values[key] = c.value(f"{where}.{key}", f, table[key])
        gpu = _text(values.get("gpu"))
        if gpu is not None and gpu not in load_gpus():
            c.add(f"{where}.gpu", f"unknown GPU '{gpu}'", suggest(gpu, tuple(load_gpus())))
            gpu = None
        archs = _texts(values.get("cuda_archs"))
        for arch in archs:
            if not _CUDA_ARCH.match(arch):
                c.add(
                    f"{where}.cuda_archs",
                    f"'{arch}' is not a compute capability",
                    'write it like "8.6" or "12.0"',
                )
        binaries = _text_table(values.get("binaries"))
        for variant, path in binaries.items():
            if variant not in VARIANTS:
                c.add(
                    f"{where}.binaries.{variant}",
                    "unknown variant",
                    suggest(variant, tuple(VARIANTS)),
                )
            elif not path.startswith("/"):
                c.add(
                    f"{where}.binaries.{variant}",
                    f"'{path}' is a relative path",
                    "use an absolute path",
                )
        kind = cast(HostKind, values.get("kind") or "nixos")  # checked against the enum
        hosts[name] = Host(
            name=name,
            kind=kind,
            target=_target(c, where, _text(values.get("target")), kind),
            gpu=gpu,
            cuda_archs=tuple(archs),
            binaries=dict(binaries),
            # checked against the enum
            gpu_sandbox=cast(GpuSandbox, values.get("gpu_sandbox") or "device-allow"),
            router=_parse_router(c, where, table["router"]) if "router" in table else None,
            build_host=_text(values.get("build_host")),
            sudo=cast(NixosSudo, values.get("sudo") or "auto"),  # checked against the enum
            kind_stated="kind" in table,
        )
        if hosts[name].kind != "nixos":
            for key in ("build_host", "sudo"):
                if key in table:
                    c.add(
                        f"{where}.{key}",
                        f"only a NixOS host is switched by nixos-rebuild, and '{name}' is "
                        f"of kind {hosts[name].kind}",
                        f"remove {key}",
                    )
    return hosts


def _target(c: _Checker, where: str, text: str | None, kind: HostKind) -> SshTarget | None:
    """The host's ssh target, read as ssh reads it; what ssh could not read is refused."""
    if text is None:
        return None
    try:
        target = parse_target(text)
    except ValueError as err:
        c.add(f"{where}.target", f"'{text}' {err}", TARGET_FIX)
        return None
    if target.port is not None and kind == "nixos":
        c.add(
            f"{where}.target",
            f"'{text}' names a port, which nixos-rebuild --target-host does not take",
            "put the port in a Host entry of ~/.ssh/config (Port) and name that Host here",
        )
    return target


TARGET_FIX = (
    "write USER@HOST, USER@HOST:PORT, ssh://USER@HOST:PORT, [IPv6]:PORT or a Host of your ssh "
    "config"
)


def _parse_router(c: _Checker, host_where: str, raw: object) -> Router | None:
    where = f"{host_where}.router"
    values = c.table_values(where, raw, schema.ROUTER, _ROUTER_MISSING)
    if values is None:
        return None
    members = _texts(values["members"])
    if not members:
        c.add(f"{where}.members", "is empty", _ROUTER_MISSING["members"])
        return None
    if len(set(members)) < len(members):
        c.add(f"{where}.members", "names an instance twice", "name each member once")
        return None
    return _record(Router, values)


_ROUTER_MISSING = {
    "kind": 'set kind = "llama-server" (one variant) or "llama-swap" (any mix)',
    "members": 'list the instances it serves, e.g. members = ["big", "small"]',
}


_GATEWAY_MISSING = {
    "kind": 'set kind = "litellm"',
    "host": 'name the [hosts.NAME] table it runs on, e.g. host = "box3"',
    "api_key_file": 'name the file holding its master key, e.g. "/etc/llamanix/gateway.key"',
}


def _parse_gateway(c: _Checker, raw: object, hosts: dict[str, Host]) -> Gateway | None:
    where = "gateway"
    values = c.table_values(where, raw, schema.GATEWAY, _GATEWAY_MISSING)
    if values is None:
        return None
    version = _text(values.get("version")) or schema.LITELLM_VERSION
    if version in schema.LITELLM_REFUSED:
        c.add(
            f"{where}.version",
            f"LiteLLM {version} {schema.LITELLM_REFUSED[version]} and is refused",
            f"remove version to run the pinned {schema.LITELLM_VERSION}, or name another release",
        )
        return None
    host = values["host"]
    if not isinstance(host, str) or host not in hosts:
        c.add(f"{where}.host", f"no host '{host}'", suggest(str(host), tuple(hosts)))
        return None
    if hosts[host].kind == "systemd-user":
        c.add(
            f"{where}.host",
            f"host '{host}' is of kind systemd-user, and the gateway runs as a system unit",
            'run it on a host of kind "systemd" or "nixos"',
        )
        return None
    return _record(Gateway, values)


def remote_exporter_refusal(listen: str) -> tuple[str, str]:
    """(message, fix) for an exporter asked to listen beyond loopback without
    ``allow_remote``: it would re-serve keyed instances' metrics to anyone, with no key."""
    return (
        f"the exporter would serve every instance's metrics, keyed ones included, on {listen} "
        "to whoever reaches it, without a key",
        'keep listen = "127.0.0.1" for a Prometheus on the same machine, or add '
        "allow_remote = true to [metrics] to mean it",
    )


def _parse_metrics(
    c: _Checker,
    raw: object,
    hosts: dict[str, Host],
    instances: dict[str, Instance],
    gateway: Gateway | None,
) -> Metrics | None:
    """``[metrics]``: typed, and its exporter's port free on every host."""
    values = c.table_values("metrics", raw, schema.METRICS, {})
    if values is None:
        return None
    metrics = _record(Metrics, values)
    if not is_loopback(metrics.listen) and not metrics.allow_remote:
        c.add("metrics.listen", *remote_exporter_refusal(metrics.listen))
    for inst in instances.values():
        router = hosts[inst.host].router
        if (router is None or inst.name not in router.members) and inst.port == metrics.port:
            c.add(
                "metrics.port",
                f"port {metrics.port} on host '{inst.host}' is already used by instance "
                f"'{inst.name}'",
                "give the exporter its own port",
            )
    for host in hosts.values():
        if host.router is not None and host.router.port == metrics.port:
            c.add(
                "metrics.port",
                f"port {metrics.port} on host '{host.name}' is already used by its router",
                "give the exporter its own port",
            )
    if gateway is not None and gateway.port == metrics.port:
        c.add(
            "metrics.port",
            f"port {metrics.port} on host '{gateway.host}' is already used by the gateway",
            "give the exporter its own port",
        )
    return metrics


def _check_gateway(
    c: _Checker, gateway: Gateway, hosts: dict[str, Host], instances: dict[str, Instance]
) -> None:
    """Every replica is reachable from the gateway's host; its unit and port are its own."""
    for inst in instances.values():
        router = hosts[inst.host].router
        routed = router is not None and inst.name in router.members
        # A router's member is reached through its router.
        listen = router.listen if router is not None and routed else inst.listen
        if inst.host != gateway.host and is_loopback(listen):
            c.add(
                f"hosts.{inst.host}.router.listen" if routed else f"instances.{inst.name}.listen",
                f"listens on {listen} on host '{inst.host}', which the gateway on host "
                f"'{gateway.host}' cannot reach",
                'listen on an address of that host, or on "0.0.0.0" with the host\'s target set',
            )
        if inst.host == gateway.host and not routed and inst.port == gateway.port:
            c.add(
                "gateway.port",
                f"port {gateway.port} on host '{gateway.host}' is already used by instance "
                f"'{inst.name}'",
                "give the gateway its own port",
            )
    shared: dict[str, str] = {}
    for name in sorted(instances):
        # One variable per replica's key: a second replica of the same variable would never
        # get its key.
        first = shared.setdefault(key_env(name), name)
        if first != name:
            c.add(
                f"instances.{name}",
                f"its key would reach the gateway through {key_env(name)}, which instance "
                f"'{first}' takes already",
                "rename one of them: names that differ only in case or in characters other "
                "than letters and digits share that variable",
            )
    router = hosts[gateway.host].router
    if router is not None and router.port == gateway.port:
        c.add(
            "gateway.port",
            f"port {gateway.port} on host '{gateway.host}' is already used by its router",
            "give the gateway its own port",
        )
    groups = sorted({inst.alias or inst.name for inst in instances.values()})
    for group in gateway.no_affinity:
        if group not in groups:
            c.add(
                "gateway.no_affinity",
                f"no model group '{group}' (a group is an instance's alias, else its name)",
                suggest(group, tuple(groups)),
            )


def _check_keys(c: _Checker, hosts: dict[str, Host], instances: dict[str, Instance]) -> None:
    """A server reachable beyond loopback has a key, or the config says it is open on purpose
    (``keyless = true``): an open llama-server runs anyone's prompts on the GPU."""
    open_fix = 'set api_key_file = "/etc/llamanix/{0}.key", or keyless = true to serve it open'
    for inst in instances.values():
        router = hosts[inst.host].router
        if router is not None and inst.name in router.members:
            continue  # its address is the router's, on loopback
        if not is_loopback(inst.listen) and inst.api_key_file is None and not inst.keyless:
            c.add(
                f"instances.{inst.name}.listen",
                f"listens on {inst.listen} without api_key_file: anyone who reaches the port "
                "can use it",
                open_fix.format(inst.name),
            )
    for host in hosts.values():
        router = host.router
        if router is None or is_loopback(router.listen):
            continue
        if router.api_key_file is None and not router.keyless:
            c.add(
                f"hosts.{host.name}.router.listen",
                f"listens on {router.listen} without api_key_file: anyone who reaches the port "
                "can use it",
                open_fix.format(f"{host.name}-router"),
            )


def _check_routers(c: _Checker, hosts: dict[str, Host], instances: dict[str, Instance]) -> None:
    """Members exist on the router's host; llama-server's router runs one binary; the router's
    port is its own on the host."""
    for host in hosts.values():
        router = host.router
        if router is None:
            continue
        where = f"hosts.{host.name}.router"
        members: list[Instance] = []
        for name in router.members:
            inst = instances.get(name)
            if inst is None:
                c.add(f"{where}.members", f"no instance '{name}'", suggest(name, tuple(instances)))
            elif inst.host != host.name:
                c.add(
                    f"{where}.members",
                    f"instance '{name}' runs on host '{inst.host}', not '{host.name}'",
                    f"route it on host '{inst.host}', or move it to this host",
                )
            else:
                members.append(inst)
                if inst.warm_switch:
                    # Its server is the router's child, in the router's sandbox: no state
                    # directory of its own to save a cache to.
                    c.add(
                        f"instances.{name}.warm_switch",
                        "a router's member cannot keep its caches across a switch",
                        "set warm_switch = false, or serve it without the router",
                    )
        names = [m.alias or m.name for m in members]
        for served in {n for n in names if names.count(n) > 1}:
            c.add(
                f"{where}.members",
                f"two members are served as '{served}'",
                "give each member its own alias",
            )
        if router.kind == "llama-server":
            for problem in _one_binary_problems(members, host):
                c.add(f"{where}.kind", *problem)
        else:
            for inst in members:
                for key in inst.environment:
                    if not _SWAP_ENV_NAME.match(key):
                        c.add(
                            f"instances.{inst.name}.environment.{key}",
                            "llama-swap takes only upper-case environment names",
                            f"write it as {key.upper()}",
                        )
                for key, value in inst.environment.items():
                    # llama-swap replaces ${env.NAME} macros anywhere in its file before it
                    # parses it, with no way to escape one.
                    if "${" in value:
                        c.add(
                            f"instances.{inst.name}.environment.{key}",
                            "holds '${', which llama-swap would replace with one of its macros",
                            'write the value without it, or use kind = "llama-server"',
                        )
        for inst in instances.values():
            if (
                inst.host == host.name
                and inst.name not in router.members
                and inst.port == router.port
            ):
                c.add(
                    f"{where}.port",
                    f"port {router.port} on host '{host.name}' is already used by instance "
                    f"'{inst.name}'",
                    "give the router its own port",
                )


def _one_binary_problems(members: list[Instance], host: Host) -> list[tuple[str, str]]:
    """llama-server's router starts each member with its own binary and flags: one variant, one
    binary, and a variant that has router mode."""
    out: list[tuple[str, str]] = []
    variants = list(dict.fromkeys(m.variant for m in members))
    if len(variants) > 1:
        a = next(m for m in members if m.variant == variants[0])
        b = next(m for m in members if m.variant == variants[1])
        out.append(
            (
                f"a llama-server router starts every member with the router's binary, but "
                f"'{a.name}' uses variant {a.variant} and '{b.name}' uses variant {b.variant}",
                'use kind = "llama-swap", which starts each member with its own binary',
            )
        )
        return out
    binaries = list(dict.fromkeys(m.binary for m in members))
    if len(binaries) > 1:
        shown = ", ".join(b or "(the variant's)" for b in binaries)
        out.append(
            (
                "a llama-server router starts every member with the router's binary, but the "
                f"members name different binaries ({shown})",
                'use one binary, or kind = "llama-swap"',
            )
        )
    environments = list(dict.fromkeys(tuple(sorted(m.environment.items())) for m in members))
    if len(environments) > 1:
        out.append(
            (
                "a llama-server router passes its own environment to every member, but the "
                "members set different environments",
                'give them the same environment, or use kind = "llama-swap"',
            )
        )
    if variants and not VARIANTS[variants[0]].dialect.router_mode:
        out.append(
            (
                f"variant {variants[0]} has no router mode (no --models-preset in its --help)",
                'use kind = "llama-swap"',
            )
        )
    return out


def _parse_instance(
    c: _Checker,
    name: str,
    defaults: Mapping[str, object],
    raw: Mapping[str, object],
    hosts: dict[str, Host],
    variants: tuple[str, ...],
) -> Instance | None:
    where = f"instances.{name}"
    known = tuple(schema.INSTANCE) + schema.INSTANCE_TABLES
    c.unknown_keys(where, raw, known)
    merged = {**defaults, **raw}
    spec_raw: dict[str, object] = {}
    for layer, label in ((defaults, "defaults"), (raw, where)):
        if "speculative" in layer:
            table = c.table(f"{label}.speculative", layer["speculative"])
            c.unknown_keys(f"{label}.speculative", table, tuple(schema.SPECULATIVE))
            spec_raw.update(table)

    values: dict[str, FieldValue | None] = {}
    for key, f in schema.INSTANCE.items():
        if key in merged:
            origin = where if key in raw else "defaults"
            values[key] = c.value(f"{origin}.{key}", f, merged[key], variants)
    spec_values: dict[str, FieldValue | None] = {}
    for key, f in schema.SPECULATIVE.items():
        if key in spec_raw:
            spec_values[key] = c.value(f"{where}.speculative.{key}", f, spec_raw[key])

    host = _text(values.get("host"))
    if host is None:
        if len(hosts) == 1:
            host = next(iter(hosts))
        else:
            c.add(f"{where}.host", "missing", "name one of: " + ", ".join(hosts))
            return None
    elif host not in hosts:
        c.add(f"{where}.host", f"no host '{host}' is defined", suggest(host, tuple(hosts)))
        return None
    model = values.get("model")
    if model is None:
        if "model" not in merged:
            c.add(f"{where}.model", "missing", 'set model = "/abs/path/to/model.gguf"')
        return None
    if any(values.get(k) is None for k in values):
        return None  # the bad values are already reported
    if any(v is None for v in spec_values.values()):
        return None

    for env_key in _text_table(values.get("environment")):
        if not _ENV_NAME.match(env_key):
            c.add(f"{where}.environment.{env_key}", "is not a valid environment variable name")
        elif env_key in _SECRET_ENV:
            c.add(
                f"{where}.environment.{env_key}",
                "would put the API key into the unit text",
                "use api_key_file instead",
            )
    for arg in _texts(values.get("extra_args")):
        if arg == "--api-key" or arg.startswith("--api-key="):
            c.add(
                f"{where}.extra_args",
                "--api-key would put the key into argv",
                "use api_key_file instead",
            )
        elif arg.startswith("--spec-synth-"):
            c.add(
                f"{where}.extra_args",
                f"{arg.split('=')[0]} makes the server accept drafts without verifying them "
                "(benchmarking only): it must never serve",
                "remove it; sweep acceptance with llamanix bench synthetic",
            )

    spec_values["types"] = spec_values.pop("type", ("none",))
    spec = _record(Speculative, spec_values)
    return _record(Instance, {**values, "name": name, "host": host, "speculative": spec})


def _check_ports(c: _Checker, instances: dict[str, Instance], hosts: dict[str, Host]) -> None:
    seen: dict[tuple[str, int], str] = {}
    for inst in instances.values():
        router = hosts[inst.host].router
        if router is not None and inst.name in router.members:
            continue  # behind the router its port is internal: the router assigns one
        key = (inst.host, inst.port)
        if key in seen:
            c.add(
                f"instances.{inst.name}.port",
                f"port {inst.port} on host '{inst.host}' is already used by instance '{seen[key]}'",
                "give each instance on a host its own port",
            )
        else:
            seen[key] = inst.name


# --- what each variant accepts -------------------------------------------------------------


def check_instance(
    inst: Instance, host: Host, variant: Variant | None = None
) -> list[tuple[str, str, str]]:
    """Variant-dependent problems of an otherwise well-typed instance: (field, message, fix).
    ``variant``: the one to check against (default: the instance's own, as declared)."""
    variant = variant or VARIANTS[inst.variant]
    spec = inst.speculative
    out: list[tuple[str, str, str]] = []

    def add(where: str, message: str, fix: str = "") -> None:
        out.append((where, message, fix))

    missing = missing_binary(inst, host, variant)
    if missing is not None:
        add("variant", *missing)
    for key, layers in (
        ("gpu_layers", inst.gpu_layers),
        ("speculative.draft_gpu_layers", spec.draft_gpu_layers),
    ):
        if host.kind != "nixos" and not host.has_gpu and layers not in (None, 0):
            # The unit of a host without a GPU gets a private /dev: the layers would run on
            # the CPU. (A NixOS instance's own CUDA build is known from its probe instead.)
            add(
                key,
                f"host '{host.name}' names no GPU (gpu or cuda_archs), so its units cannot open "
                f"the NVIDIA devices and {key.split('.')[-1]} = {json.dumps(layers)} would run "
                "on the CPU",
                f'set hosts.{host.name}.gpu = "rtx3090" (llamanix model ceiling --list) or '
                f"hosts.{host.name}.cuda_archs, or {key.split('.')[-1]} = 0",
            )
    out.extend(_speculation_problems(inst, variant))
    out.extend(_cache_and_layer_problems(inst, variant))
    return out


def _speculation_problems(inst: Instance, variant: Variant) -> list[tuple[str, str, str]]:
    """Speculation on ``variant``: its types, the chain, a draft model where a type needs one,
    n_min/n_max, the type's parameters, the drafter's settings and the slots it can serve."""
    d = variant.dialect
    spec = inst.speculative
    out: list[tuple[str, str, str]] = []

    def add(where: str, message: str, fix: str = "") -> None:
        out.append((where, message, fix))

    unsupported = [t for t in spec.types if spec.enabled and variant.spec_spelling(t) is None]
    for t in unsupported:
        add(
            "speculative.type",
            f"'{t}' is not supported by {variant.who}",
            "choose one of: "
            + ", ".join(variant.supported_spec_types())
            + (" or another variant" if t == "mtp" else ""),
        )
    out.extend(_chain_problems(spec, variant))
    for t in spec.types:
        if t in SPEC_TYPES_WITH_DRAFT_MODEL and spec.draft_model is None:
            add(
                "speculative.draft_model",
                f"type '{t}' needs a draft model",
                'set draft_model = "/abs/path/draft.gguf"',
            )
    if spec.n_min is not None and spec.n_max is not None and spec.n_min > spec.n_max:
        add(
            "speculative.n_min",
            f"n_min {spec.n_min} is larger than n_max {spec.n_max}",
            "make n_min <= n_max",
        )
    if spec.enabled and variant.spec_spelling(spec.type) is not None:
        allowed = d.spec_params.get(spec.type, {})
        for param in SPEC_PARAMS:
            if getattr(spec, param) is not None and param not in allowed:
                add(
                    f"speculative.{param}",
                    f"'{spec.type}' on {variant.who} takes no {param}",
                    "remove it"
                    + (" (parameters belong to the chain's first type)" if spec.chain else ""),
                )
    out.extend(_drafter_problems(spec, variant))
    slots = spec.dflash_max_slots or 1
    if d.dflash_slot_limit and "dflash" in spec.types and (inst.parallel or 1) > slots:
        add(
            "parallel",
            f"DFlash keeps its state for {slots} slot(s) (speculative.dflash_max_slots) and "
            f"parallel is {inst.parallel}: the other slots would decode without speculation",
            f"set parallel = {slots}, or raise speculative.dflash_max_slots",
        )
    if d.spec_single_slot and spec.enabled and (inst.parallel or 1) > 1:
        add(
            "parallel",
            f"{variant.who} speculates only with one slot, parallel is {inst.parallel}",
            'set parallel = 1 or speculative.type = "none"',
        )
    return out


def _cache_and_layer_problems(inst: Instance, variant: Variant) -> list[tuple[str, str, str]]:
    """The KV cache types, a quantized V cache without flash attention, the layer words and
    jinja, as ``variant`` spells them."""
    d = variant.dialect
    spec = inst.speculative
    out: list[tuple[str, str, str]] = []

    def add(where: str, message: str, fix: str = "") -> None:
        out.append((where, message, fix))

    for key in ("cache_type_k", "cache_type_v"):
        value = getattr(inst, key)
        if value is not None and value not in d.cache_types:
            add(
                key,
                f"cache type '{value}' is not known to {variant.who}",
                "choose one of: " + ", ".join(d.cache_types),
            )
    if _quantized(inst.cache_type_v) and inst.flash_attn == "off":
        add(
            "flash_attn",
            f"a quantized V cache ({inst.cache_type_v}) needs flash attention",
            'set flash_attn = "on" or cache_type_v = "f16"',
        )
    if not d.layers_words:
        for key, value in (
            ("gpu_layers", inst.gpu_layers),
            ("speculative.draft_gpu_layers", spec.draft_gpu_layers),
        ):
            if value == "auto":
                add(
                    key,
                    f"{variant.who} takes a layer count, not 'auto'",
                    'use an integer or "all"',
                )
    if inst.jinja is False and d.no_jinja_flag is None and d.jinja_default:
        add("jinja", f"{variant.who} cannot turn jinja off", "remove jinja")
    return out


def binary_of(inst: Instance, host: Host, variant: Variant) -> str | None:
    """The llama-server the instance's unit runs for ``variant``: its own ``binary``, else the
    host's entry for the variant; None when the config names none (a NixOS host's module
    names the flake's package for it)."""
    return inst.binary or host.binaries.get(variant.name)


def missing_binary(inst: Instance, host: Host, variant: Variant) -> tuple[str, str] | None:
    """(message, fix) when a host that runs the binaries the config names (not NixOS) has none
    for the variant: whatever llama-server the unit's PATH found would serve under its name."""
    if host.kind == "nixos" or binary_of(inst, host, variant) is not None:
        return None
    named = ", ".join(sorted(host.binaries))
    return (
        f"host '{host.name}' (kind {host.kind}) has no llama-server for variant "
        f"{variant.name} (hosts.{host.name}.binaries "
        + (f"names only {named})" if named else "is empty)"),
        f'set hosts.{host.name}.binaries.{variant.name} = "/path/to/{variant.name}/llama-server"'
        f" (or instances.{inst.name}.binary), or choose a variant it names",
    )


def _chain_problems(spec: Speculative, variant: Variant) -> list[tuple[str, str, str]]:
    """A chain's shape: one drafter at most, and no longer than the dialect spells."""
    if not spec.chain:
        return []
    d = variant.dialect
    out: list[tuple[str, str, str]] = []
    if d.spec_chain == "single":
        out.append(
            (
                "speculative.type",
                f"{variant.who} takes one speculative type, not a chain ({', '.join(spec.types)})",
                f'keep one, e.g. type = "{spec.types[0]}", or use a variant that chains '
                "(upstream, ik)",
            )
        )
    elif d.spec_chain_max is not None and len(spec.types) > d.spec_chain_max:
        out.append(
            (
                "speculative.type",
                f"{variant.who} chains at most {d.spec_chain_max} types, got {len(spec.types)}",
                f"keep {d.spec_chain_max}",
            )
        )
    then = d.spec_chain_then
    if then is not None and len(spec.types) == 2:
        first, second = spec.types
        if first in SPEC_DRAFTERS or second not in then:
            out.append(
                (
                    "speculative.type",
                    f"{variant.who} chains a self-speculating type (n-gram, suffix) first, then "
                    f"{' or '.join(then)}; got {first}, {second}",
                    f'e.g. type = ["ngram-mod", "{then[-1]}"]',
                )
            )
    drafters = [t for t in spec.types if t in SPEC_DRAFTERS]
    if len(drafters) > 1:
        out.append(
            (
                "speculative.type",
                f"a chain holds at most one drafter, got {' and '.join(drafters)}",
                "keep one drafter and add n-gram types beside it",
            )
        )
    if "" in (variant.spec_spelling(t) for t in spec.types):
        out.append(
            (
                "speculative.type",
                f"on {variant.who} 'draft' is a draft model alone (no --spec-type "
                "value), so it cannot be chained",
                'use type = "draft" alone',
            )
        )
    return out


def _drafter_problems(spec: Speculative, variant: Variant) -> list[tuple[str, str, str]]:
    """The drafter's cache types, device and CPU-MoE: only with a drafter, only where spelled."""
    out: list[tuple[str, str, str]] = []
    d = variant.dialect
    has_drafter = any(t in SPEC_DRAFTERS for t in spec.types)
    for key in DRAFTER_SETTINGS:
        value = getattr(spec, key)
        if value is None or value is False:
            continue
        where = f"speculative.{key}"
        if key not in d.flags:
            out.append((where, f"{variant.who} has no flag for {key}", "remove it"))
        elif not has_drafter:
            out.append(
                (
                    where,
                    f"only a drafter ({', '.join(SPEC_DRAFTERS)}) uses {key}, "
                    f"and the type is {spec.label}",
                    "remove it, or add a drafter to speculative.type",
                )
            )
        elif key.startswith("draft_cache_type") and value not in d.cache_types:
            out.append(
                (
                    where,
                    f"cache type '{value}' is not known to {variant.who}",
                    "choose one of: " + ", ".join(d.cache_types),
                )
            )
    return out


def _quantized(cache_type: str | None) -> bool:
    return cache_type is not None and cache_type not in ("f32", "f16", "bf16")


# --- what a unit could not do, though each value is well typed ------------------------------


def what_a_unit_cannot_do(
    data: Mapping[str, object],
    source: str,
    hosts: Mapping[str, Host],
    instances: Mapping[str, Instance],
    gateway: Gateway | None,
    metrics: Metrics | None,
) -> list[Problem]:
    """Settings that pass their own checks and still make a unit that cannot serve: a port a
    dynamic user cannot bind, a flag given twice, a CUDA architecture no compiler knows. Each a
    problem with its fix. (What depends on this machine, or on the render, is validate's:
    cli.core.)"""
    problems: list[Problem] = []
    for where, _, port in listening_ports(data, hosts, instances, gateway, metrics):
        if port < FIRST_UNPRIVILEGED_PORT:
            problems.append(
                Problem(
                    source,
                    where,
                    f"port {port} is below {FIRST_UNPRIVILEGED_PORT}, and the unit runs as a "
                    "dynamic user without capabilities, which cannot bind it",
                    "use a port of 1024 or above, e.g. 8080, and put a reverse proxy on the "
                    "low port if clients need it",
                )
            )
    for inst in instances.values():
        problems.extend(
            Problem(source, f"instances.{inst.name}.extra_args", message, fix)
            for message, fix in _repeated_flags(inst)
        )
    for name, host in hosts.items():
        problems.extend(
            Problem(source, f"hosts.{name}.cuda_archs", message, fix)
            for message, fix in _cuda_arch_problems(host)
        )
    return problems


# Linux's default net.ipv4.ip_unprivileged_port_start: ports below need CAP_NET_BIND_SERVICE,
# which no unit llamanix writes has (CapabilityBoundingSet= is empty).
FIRST_UNPRIVILEGED_PORT = 1024


def listening_ports(
    data: Mapping[str, object],
    hosts: Mapping[str, Host],
    instances: Mapping[str, Instance],
    gateway: Gateway | None,
    metrics: Metrics | None,
) -> list[tuple[str, str, int]]:
    """(field, address, port) of every listener a unit of ``hosts`` opens, the field as the
    file spells it."""
    raw_instances = data.get("instances")
    out: list[tuple[str, str, int]] = []
    for inst in instances.values():
        router = hosts[inst.host].router
        if router is not None and inst.name in router.members:
            continue  # the router gives a member a port of its own choosing
        raw = raw_instances.get(inst.name) if isinstance(raw_instances, dict) else None
        own = isinstance(raw, dict) and "port" in raw
        where = f"instances.{inst.name}.port" if own else "defaults.port"
        out.append((where, inst.listen, inst.port))
    for name, host in hosts.items():
        if host.router is not None:
            out.append((f"hosts.{name}.router.port", host.router.listen, host.router.port))
    if gateway is not None and gateway.host in hosts:
        out.append(("gateway.port", gateway.listen, gateway.port))
    if metrics is not None:
        out.append(("metrics.port", metrics.listen, metrics.port))
    return out


# Every spelling llama-server takes for each flag llamanix renders from a config key
# (tests/data/help/upstream-0c1e570.help.txt; tests/test_config_checks.py reads each group
# there): extra_args may not give one of them again.
FLAG_SPELLINGS: tuple[tuple[str, ...], ...] = (
    ("-m", "--model"),
    ("-a", "--alias"),
    ("--host",),
    ("--port",),
    ("-c", "--ctx-size"),
    ("-ngl", "--gpu-layers", "--n-gpu-layers"),
    ("-fa", "--flash-attn"),
    ("-ctk", "--cache-type-k"),
    ("-ctv", "--cache-type-v"),
    ("-np", "--parallel"),
    ("-b", "--batch-size"),
    ("-ub", "--ubatch-size"),
    ("-t", "--threads"),
    ("--reasoning-budget",),
    ("--metrics",),
    ("--api-key-file",),
    ("--spec-type",),
    ("--spec-draft-model", "-md", "--model-draft"),
    ("--spec-draft-ngl", "-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft"),
)


def _rendered_keys(inst: Instance) -> dict[str, str]:
    """Config key -> the flag llamanix renders for it, for the keys this instance sets."""
    flags = VARIANTS[inst.variant].dialect.flags
    spec = inst.speculative
    values: dict[str, object] = {
        "model": inst.model,
        "alias": inst.alias,
        "listen": inst.listen,
        "port": inst.port,
        "context": inst.context,
        "gpu_layers": inst.gpu_layers,
        "flash_attn": inst.flash_attn,
        "cache_type_k": inst.cache_type_k,
        "cache_type_v": inst.cache_type_v,
        "parallel": inst.parallel,
        "batch": inst.batch,
        "ubatch": inst.ubatch,
        "threads": inst.threads,
        "reasoning_budget": inst.reasoning_budget,
        "metrics": inst.metrics or None,
        "api_key_file": inst.api_key_file,
        "speculative.type": "on" if spec.enabled else None,
        "speculative.draft_model": spec.draft_model,
        "speculative.draft_gpu_layers": spec.draft_gpu_layers,
    }
    out: dict[str, str] = {}
    for key, value in values.items():
        flag = flags.get("spec_type" if key == "speculative.type" else key.split(".")[-1])
        if value is not None and flag is not None:
            out[key] = flag
    return out


def _repeated_flags(inst: Instance) -> list[tuple[str, str]]:
    """extra_args that give again a flag llamanix renders from a key: llama-server takes the
    last, so the key would silently lose (``--port 9`` after ``--port 8080``)."""
    if not inst.extra_args:
        return []
    rendered = _rendered_keys(inst)
    group_of = {spelling: group for group in FLAG_SPELLINGS for spelling in group}
    out: list[tuple[str, str]] = []
    args = list(inst.extra_args)
    for i, arg in enumerate(args):
        flag, eq, inline = arg.partition("=")
        group = group_of.get(flag)
        if group is None:
            continue
        for key, spelled in rendered.items():
            if spelled not in group:
                continue
            name = key.split(".")[-1]
            now = getattr(inst.speculative if key.startswith("speculative.") else inst, name)
            if isinstance(now, bool):  # a flag without a value: --metrics
                out.append(
                    (
                        f"repeats {flag}, which llamanix renders already ({name} = true)",
                        "remove it from extra_args",
                    )
                )
                continue
            following = args[i + 1] if i + 1 < len(args) else ""
            value = inline if eq else ("" if following.startswith("-") else following)
            shown = arg if eq else f"{flag} {value}".strip()
            out.append(
                (
                    f"repeats {flag} ({shown}), which llamanix renders from {key} "
                    f"({spelled} {now}); llama-server would take the one given last",
                    "remove it from extra_args and set "
                    + (f"{name} = {_toml_value(value)}" if value else key)
                    + " instead",
                )
            )
    return out


def _toml_value(text: str) -> str:
    """``9`` as TOML writes it: a number bare, anything else quoted."""
    return text if re.fullmatch(r"-?\d+(\.\d+)?", text) else json.dumps(text)


def _cuda_arch_problems(host: Host) -> list[tuple[str, str]]:
    """cuda_archs no CUDA release knows (a card the list leaves out is validate's: it depends
    on whether an instance uses the GPU, cli.core)."""
    from llamanix.core.gpus import CUDA_CAPABILITIES

    return [
        (
            f"'{arch}' is no CUDA compute capability (nvcc would refuse it when the variant "
            "is built)",
            f"{suggest(arch, CUDA_CAPABILITIES)}; nvidia-smi --query-gpu=compute_cap "
            "--format=csv prints the card's, and the known ones are "
            + ", ".join(c for c in CUDA_CAPABILITIES if c[-1].isdigit()),
        )
        for arch in host.cuda_archs
        if _CUDA_ARCH.match(arch) and arch not in CUDA_CAPABILITIES
    ]
