"""The trust boundary: every string a config carries is refused in one line, or reaches every
file render writes intact.

Each string field of the schema (and the names of [hosts.NAME] and [instances.NAME] tables, and
the keys of tables of strings) gets values made of what broke things before: line breaks and
other control characters, quotes, '%', '$', '`', '..', '/', ';', '#', brackets, spaces, non-ASCII
and long strings. For each value either validate refuses it (every problem one line, nothing
written), or the render is written to --out and read back:

- units with render/systemd.py's reader (systemd's own rules), their shape (sections and
  directives) equal to a render with a plain value (so nothing was injected), the value found
  again where it goes, and every unit run through `systemd-analyze verify`;
- the router's preset INI with configparser, llama-swap's YAML with yaml.safe_load, LiteLLM's
  config, the manifest and argv files with json, a plan's command line with shlex.split;
- nothing written outside --out.

The budget is fixed (derandomized examples per field), so CI runs the same cases every time.
tests/test_units_on_systemd.py reads such units back with systemd itself on the host bed.
"""

from __future__ import annotations

import configparser
import json
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from llamanix.config.model import parse_config
from llamanix.core import schema
from llamanix.core.errors import UserError
from llamanix.core.types import TYPES
from llamanix.render import systemd
from llamanix.render.units import render_host, write_render

BIN = sys.executable  # systemd-analyze verify wants an executable; it is never started
BUDGET = 25

# What broke things before, and what a shell, systemd, INI or YAML reads in its own way.
NASTY = [
    "\n", "\r", "\t", "\x00", "\x1b", "\x7f", "\x85", "\u2028", '"', "'", "\\", "%", "%%",
    "$", "${PORT}", "`", "..", "/", "/../", " ", ";", "#", "[", "]", "=", ":", "{", "}", "-",
    "é", "中", "+", "@", ",", "*", "?", "~", "&", "|", "<", ">", "!", "\\n",
    "\nExecStartPre=+/usr/bin/touch /root/pwned", "q]\nmodel = /etc/shadow\n[z",
]  # fmt: skip
PLAIN = "abcxyzABC0129_.-"


def mutated(good: str) -> st.SearchStrategy[str]:
    """A plain value with nasty pieces put in, and nasty values of their own."""
    piece = st.one_of(st.sampled_from(NASTY), st.text(PLAIN, min_size=1, max_size=6))
    built = st.lists(piece, min_size=1, max_size=6).map("".join)
    inserted = st.tuples(st.integers(0, len(good)), built).map(
        lambda t: good[: t[0]] + t[1] + good[t[0] :]
    )
    return st.one_of(inserted, built, st.text(max_size=20), st.just(good))


@dataclass(frozen=True)
class Case:
    """A string field: where a value goes in a config, a plain value for it, and what it
    reaches: "unit" (the unit's directives), "argv" (the argv files and the plan's line),
    "ini"/"yaml" (a router's config), "json" (the gateway's config)."""

    place: Callable[[str], dict[str, Any]]
    good: str
    host: str = "box"
    reaches: tuple[str, ...] = ()
    # The rendered value is derived from the field's (e.g. a path made from a name): it is
    # checked by shape and by the readers, not found verbatim.
    verbatim: bool = True


def base(**inst: Any) -> dict[str, Any]:
    return {
        "hosts": {"box": {"kind": "systemd", "binaries": {"upstream": BIN}}},
        "instances": {
            "chat": {"host": "box", "model": "/srv/models/m.gguf", "listen": "127.0.0.1", **inst}
        },
    }


def with_instance(**inst: Any) -> Callable[[str], dict[str, Any]]:
    def place(value: str) -> dict[str, Any]:
        return base(**{k: (value if v is None else v) for k, v in inst.items()})

    return place


def instance_field(key: str) -> Callable[[str], dict[str, Any]]:
    return lambda value: base(**{key: value})


def speculative_field(key: str, **spec: Any) -> Callable[[str], dict[str, Any]]:
    return lambda value: base(speculative={**spec, key: value})


def host_field(key: str) -> Callable[[str], dict[str, Any]]:
    def place(value: str) -> dict[str, Any]:
        data = base()
        data["hosts"]["box"][key] = value
        return data

    return place


def routed(kind: str, **router: Any) -> dict[str, Any]:
    data = base(alias="chat-model")
    data["hosts"]["box"]["router"] = {"kind": kind, "members": ["chat"], **router}
    if kind == "llama-swap":
        data["hosts"]["box"]["router"].setdefault("binary", BIN)
    return data


def router_field(key: str, kind: str = "llama-server") -> Callable[[str], dict[str, Any]]:
    return lambda value: routed(kind, **{key: value})


def gatewayed(**gateway: Any) -> dict[str, Any]:
    data = base(listen="0.0.0.0", api_key_file="/etc/llamanix/chat.key")
    data["hosts"]["box"]["target"] = "admin@box"
    data["hosts"]["gw"] = {"kind": "systemd"}
    data["gateway"] = {
        "kind": "litellm",
        "host": "gw",
        "api_key_file": "/etc/llamanix/gateway.key",
        **gateway,
    }
    return data


def gateway_field(key: str) -> Callable[[str], dict[str, Any]]:
    return lambda value: gatewayed(**{key: value})


def no_affinity(value: str) -> dict[str, Any]:
    """A model group routed without affinity: it must be one the config serves."""
    data = gatewayed(no_affinity=[value])
    data["instances"]["chat"]["alias"] = value
    return data


def metrics_field(key: str) -> Callable[[str], dict[str, Any]]:
    def place(value: str) -> dict[str, Any]:
        data = base()
        data["metrics"] = {key: value}
        return data

    return place


def renamed_host(value: str) -> dict[str, Any]:
    data = base()
    data["hosts"] = {value: data["hosts"]["box"]}
    data["instances"]["chat"]["host"] = value
    return data


def renamed_instance(value: str) -> dict[str, Any]:
    data = base()
    data["instances"] = {value: data["instances"]["chat"]}
    return data


def router_member(value: str) -> dict[str, Any]:
    data = routed("llama-server")
    data["instances"] = {value: data["instances"]["chat"]}
    data["hosts"]["box"]["router"]["members"] = [value]
    return data


def gateway_host(value: str) -> dict[str, Any]:
    data = gatewayed(host=value)
    data["hosts"][value] = data["hosts"].pop("gw")
    return data


def environment_key(value: str) -> dict[str, Any]:
    return base(environment={value: "1"})


def environment_value(value: str) -> dict[str, Any]:
    return base(environment={"FOO": value})


def binaries_key(value: str) -> dict[str, Any]:
    data = base()
    data["hosts"]["box"]["binaries"] = {value: BIN, "upstream": BIN}
    return data


def binaries_value(value: str) -> dict[str, Any]:
    data = base()
    data["hosts"]["box"]["binaries"] = {"upstream": value}
    return data


# Every string field of the schema, by "section.field" ("section.<name>" for table names,
# "section.field.<key>"/".<value>" for tables of strings). test_every_string_field_is_covered
# fails when the schema gains one that is not here.
CASES: dict[str, Case] = {
    "hosts.<name>": Case(renamed_host, "box", reaches=("unit",), verbatim=False),
    "hosts.target": Case(host_field("target"), "admin@box"),
    "hosts.gpu": Case(host_field("gpu"), "rtx3090"),
    "hosts.cuda_archs": Case(lambda v: host_field("cuda_archs")([v]), "8.6"),
    "hosts.binaries.<key>": Case(binaries_key, "ik"),
    "hosts.binaries.<value>": Case(binaries_value, BIN, reaches=("unit", "argv")),
    "hosts.build_host": Case(
        lambda v: {**base(), "hosts": {"box": {"kind": "nixos", "build_host": v}}}, "root@b"
    ),
    "router.listen": Case(router_field("listen"), "127.0.0.1", reaches=("unit", "argv")),
    "router.members": Case(router_member, "chat", reaches=("ini",), verbatim=False),
    "router.api_key_file": Case(
        router_field("api_key_file"), "/etc/llamanix/router.key", reaches=("unit",)
    ),
    "router.binary": Case(router_field("binary", "llama-swap"), BIN, reaches=("unit", "argv")),
    "gateway.host": Case(gateway_host, "gw", host="", verbatim=False),
    "gateway.listen": Case(gateway_field("listen"), "127.0.0.1", host="gw", reaches=("argv",)),
    "gateway.version": Case(gateway_field("version"), "1.106.12", host="gw", reaches=("unit",)),
    "gateway.api_key_file": Case(
        gateway_field("api_key_file"), "/etc/llamanix/gateway.key", host="gw", reaches=("unit",)
    ),
    "gateway.no_affinity": Case(no_affinity, "qwen3.6-27b", host="gw", reaches=("yaml",)),
    "metrics.listen": Case(metrics_field("listen"), "127.0.0.1"),
    "instances.<name>": Case(renamed_instance, "chat", reaches=("unit",)),
    "instances.host": Case(
        lambda v: renamed_host(v) if v else base(host=v), "box", host="", verbatim=False
    ),
    "instances.binary": Case(instance_field("binary"), BIN, reaches=("unit", "argv")),
    "instances.model": Case(
        instance_field("model"), "/srv/models/m.gguf", reaches=("unit", "argv")
    ),
    "instances.alias": Case(instance_field("alias"), "qwen3.6-27b", reaches=("unit", "argv")),
    "instances.listen": Case(
        with_instance(listen=None, keyless=True), "127.0.0.1", reaches=("unit", "argv")
    ),
    "instances.api_key_file": Case(
        instance_field("api_key_file"), "/etc/llamanix/chat.key", reaches=("unit",)
    ),
    "instances.extra_args": Case(
        lambda v: base(extra_args=["--override-kv", v]), "x=int:1", reaches=("unit", "argv")
    ),
    "instances.environment.<key>": Case(environment_key, "OMP_NUM_THREADS", reaches=("unit",)),
    "instances.environment.<value>": Case(environment_value, "1", reaches=("unit",)),
    "speculative.draft_model": Case(
        speculative_field("draft_model", type="draft"), "/srv/models/d.gguf", reaches=("unit",)
    ),
    "speculative.draft_device": Case(
        speculative_field("draft_device", type="draft", draft_model="/srv/models/d.gguf"),
        "CUDA1",
        reaches=("unit", "argv"),
    ),
}

# The same values for an instance behind each kind of router: its argv goes into the preset
# INI (llama-server) or the YAML (llama-swap) instead of a unit of its own.
ROUTED: dict[str, Case] = {
    f"{kind}.{key}": Case(
        lambda v, kind=kind, key=key: routed(kind) | {"instances": {"chat": {**routed(kind)[
            "instances"]["chat"], key: ({"FOO": v} if key == "environment" else v)}}},
        good,
        reaches=(fmt,),
    )
    for kind, fmt in (("llama-server", "ini"), ("llama-swap", "yaml"))
    for key, good in (
        ("model", "/srv/models/m.gguf"),
        ("alias", "qwen3.6-27b"),
        ("environment", "1"),
    )
}  # fmt: skip


def string_fields() -> set[str]:
    """Every string the schema lets a config carry, named as CASES names them."""
    out = {"hosts.<name>", "instances.<name>"}
    tables = {
        "hosts": schema.HOST_FIELDS,
        "router": schema.ROUTER_FIELDS,
        "gateway": schema.GATEWAY_FIELDS,
        "metrics": schema.METRICS_FIELDS,
        "instances": schema.INSTANCE_FIELDS,
        "speculative": schema.SPECULATIVE_FIELDS,
    }
    for section, fields in tables.items():
        for f in fields:
            if f.kind == schema.DICT_STR:
                out |= {f"{section}.{f.name}.<key>", f"{section}.{f.name}.<value>"}
            elif f.kind in (schema.STR, schema.PATH, schema.LIST_STR):
                out.add(f"{section}.{f.name}")
    return out


def test_every_string_field_is_covered() -> None:
    assert set(CASES) == string_fields()
    # And every string field declares its type (core.schema refuses one without at import).
    for fields in (schema.INSTANCE_FIELDS, schema.HOST_FIELDS, schema.GATEWAY_FIELDS):
        for f in fields:
            if f.kind in (schema.STR, schema.PATH, schema.LIST_STR, schema.DICT_STR):
                assert f.text in TYPES


# Directives that follow the listen address (the IP filter, the network's ordering): they differ
# between values on purpose. Every other directive, and how often it appears, must not.
LISTEN_DEPENDENT = {"After", "Wants", "IPAddressAllow", "IPAddressDeny"}


def shape(unit: dict[str, dict[str, list[str]]]) -> dict[str, dict[str, int]]:
    return {
        s: {k: len(v) for k, v in d.items() if k not in LISTEN_DEPENDENT} for s, d in unit.items()
    }


def unit_strings(unit: dict[str, dict[str, list[str]]]) -> list[str]:
    """Every value a unit's directives carry, decoded as systemd decodes it."""
    service = unit.get("Service", {})
    out: list[str] = []
    for line in service.get("ExecStart", []) + service.get("ExecStartPost", []):
        out += systemd.exec_argv(line)[1]
    for line in service.get("Environment", []):
        out += (
            [f"{k}={v}" for k, v in systemd.assignments(line)]
            + [v for _, v in systemd.assignments(line)]
            + [k for k, _ in systemd.assignments(line)]
        )
    for line in service.get("LoadCredential", []):
        out.append(systemd.expand_specifiers(line).split(":", 1)[1])
    for line in unit.get("Unit", {}).get("Description", []):
        out += systemd.expand_specifiers(line).split()
    return out


def written_files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()}


def render_all(data: dict[str, Any], tmp: Path) -> dict[str, dict[str, str]] | None:
    """Validate and render every host with a unit; None when refused (and then checked: one
    line per problem, nothing written)."""
    config = tmp / "llamanix.toml"
    config.write_text("# the test passes the data to parse_config\n")
    before = written_files(tmp)
    try:
        cfg = parse_config(data, str(config))
        renders = [
            render_host(cfg, host)
            for host in cfg.hosts
            if cfg.instances_on(host) or (cfg.gateway and cfg.gateway.host == host)
        ]
        out: dict[str, dict[str, str]] = {}
        for rendered in renders:
            write_render(rendered, tmp / "out" / rendered.host)
            out[rendered.host] = rendered.files()
    except UserError as err:
        for problem in err.problems:
            assert "\n" not in str(problem) and "\r" not in str(problem), str(problem)
        assert written_files(tmp) == before, "a refused config wrote files"
        return None
    outside = {p for p in written_files(tmp) - before if (tmp / "out") not in p.parents}
    assert not outside, f"written outside --out: {outside}"
    return out


def check_artifacts(
    case: Case, files: dict[str, str], plain: dict[str, str], found: list[str]
) -> list[str]:
    """Read every artifact back (the values found go to ``found``); returns the units' texts,
    for the batch systemd-analyze verify."""
    units = []
    for name, text in files.items():
        if name.endswith(".service"):
            unit = systemd.read_unit(text)
            baseline = systemd.read_unit(baseline_unit(name, plain))
            assert shape(unit) == shape(baseline), f"{name}: directives differ:\n{text}"
            found += unit_strings(unit)
            units.append(text)
        elif name.endswith(".argv.json"):
            argv = json.loads(text)
            assert all(isinstance(w, str) for w in argv)
            assert shlex.split(shlex.join(argv)) == argv
            if "argv" in case.reaches:
                found += argv
        elif name == "manifest.json":
            json.loads(text)
        elif name.endswith(".ini"):
            parser = configparser.ConfigParser(
                interpolation=None, inline_comment_prefixes=(";", "#"), strict=True
            )
            parser.optionxform = str  # type: ignore[assignment,method-assign]
            # The preset's keys before any section are its globals.
            parser.read_string("[*globals*]\n" + text)
            for section in parser.sections():
                found.append(section)
                found += [parser[section][k] for k in parser[section]]
        elif name.endswith(".yaml"):
            data = yaml.safe_load(text)
            assert isinstance(data, dict)
            found += _yaml_strings(data)
    return units


OWN_UNITS = ("llamanix-gateway.service", "llamanix-router.service", "llamanix-exporter.service")


def baseline_unit(name: str, plain: dict[str, str]) -> str:
    """The unit of the plain render that ``name`` is to be compared with: the same file, or
    for a renamed instance the plain render's instance unit."""
    if name in plain:
        return plain[name]
    others = [t for n, t in plain.items() if n.endswith(".service") and n not in OWN_UNITS]
    assert len(others) == 1 and name not in OWN_UNITS, (name, list(plain))
    return others[0]


def _yaml_strings(data: Any) -> list[str]:
    if isinstance(data, dict):
        out = [str(k) for k in data]
        for v in data.values():
            out += _yaml_strings(v)
        return out
    if isinstance(data, list):
        return [s for v in data for s in _yaml_strings(v)]
    if isinstance(data, str):
        if data.startswith(("llama", "/")):  # a cmd, split as llama-swap splits it
            return [data, *shlex.split(data)]
        return [data, data.partition("=")[2]]  # an env entry's value
    return []


def verify(units: list[str], tmp: Path) -> None:
    """systemd's own parser over every accepted unit: nothing it would warn about or ignore
    (a program that is not there is not the writer's business)."""
    if not units or shutil.which("systemd-analyze") is None:
        return
    paths = []
    for i, text in enumerate(units[:12]):
        path = tmp / f"llamanix-u{i}.service"
        path.write_text(text)
        paths.append(str(path))
    done = subprocess.run(
        ["systemd-analyze", "verify", *paths], capture_output=True, text=True, check=False
    )
    lines = [
        line
        for line in (done.stdout + done.stderr).split("\n")
        if line.strip() and "is not executable" not in line and "not found" not in line
    ]
    assert not lines, "\n".join(lines)


def run_case(case: Case, tmp_path_factory: pytest.TempPathFactory) -> int:
    plain_files = render_all(case.place(case.good), tmp_path_factory.mktemp("plain"))
    assert plain_files is not None, f"the plain value {case.good!r} is refused"
    collected: list[str] = []
    accepted = 0

    @settings(
        max_examples=BUDGET,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(value=mutated(case.good))
    @example(value="x\nExecStartPre=+/usr/bin/touch /root/pwned")
    @example(value="a" * 5000)
    def check(value: str) -> None:
        nonlocal accepted
        tmp = tmp_path_factory.mktemp("b")
        files = render_all(case.place(value), tmp)
        if files is None:
            return
        accepted += 1
        found: list[str] = []
        plain = {n: t for texts in plain_files.values() for n, t in texts.items()}
        for texts in files.values():
            collected.extend(check_artifacts(case, texts, plain, found))
        if case.verbatim and case.reaches and value:
            # Where the field goes, its value is there again, whole.
            assert value in found, (value, found)

    check()
    verify(collected, tmp_path_factory.mktemp("verify"))
    return accepted


@pytest.mark.parametrize("field", sorted(CASES))
def test_a_string_is_refused_in_one_line_or_arrives_intact(
    field: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    run_case(CASES[field], tmp_path_factory)


@pytest.mark.parametrize("field", sorted(ROUTED))
def test_a_routed_member_s_strings_arrive_intact_in_its_router_s_config(
    field: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    run_case(ROUTED[field], tmp_path_factory)
