"""Each escape a config could make before the boundary was typed, one test each: validate refuses
it in one line through the real CLI and writes nothing, and where a value could reach a writer by
another way (a record read back, a future field), the writer refuses it too.

tests/test_boundary.py generalises these over every string field; the fleet agent's escapes
are in tests/test_fleet_agent_host.py, the keys' in tests/test_keys.py.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from llamanix.cli import main
from llamanix.config.model import parse_config
from llamanix.core.errors import UserError
from llamanix.render import formats, systemd
from llamanix.render.manifest import MANIFEST
from llamanix.render.units import render_host, render_instance, write_render

BIN = sys.executable


def config(**inst: Any) -> dict[str, Any]:
    return {
        "hosts": {"box": {"kind": "systemd", "binaries": {"upstream": BIN}}},
        "instances": {"chat": {"model": "/srv/models/m.gguf", **inst}},
    }


def refused(tmp_path: Path, data: dict[str, Any], field: str) -> str:
    """validate and render --out refuse ``data`` with exit 2, one line naming ``field``, and
    write nothing."""
    cfg = tmp_path / "llamanix.json"
    cfg.write_text(json.dumps(data))
    before = sorted(tmp_path.rglob("*"))
    lines = []
    for args in (["validate", "--remote", str(cfg)], ["render", str(cfg), "--out", "out"]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2, result.output
        assert "Traceback" not in result.output
        problems = [line for line in result.stderr.split("\n") if line]
        assert any(f": {field}: " in line for line in problems), problems
        lines += problems
    assert sorted(tmp_path.rglob("*")) == before, "a refused config wrote files"
    return lines[0]


def test_a_newline_in_an_environment_value_never_becomes_a_directive(tmp_path: Path) -> None:
    value = "x\nExecStartPre=+/usr/bin/touch /root/pwned"
    line = refused(tmp_path, config(environment={"FOO": value}), "instances.chat.environment.FOO")
    assert "control character '\\n'" in line
    # The writer refuses it as well, whatever validate let through.
    with pytest.raises(systemd.UnitValueError):
        systemd.assignment("FOO", value)
    cfg = parse_config(config(), "c.toml")
    inst = replace(cfg.instances["chat"], environment={"FOO": value})
    with pytest.raises(UserError):
        render_instance(cfg, inst, None, False, "sha256:0")


def test_a_newline_in_a_key_file_path_never_becomes_a_directive(tmp_path: Path) -> None:
    refused(
        tmp_path, config(api_key_file="/k\nExecStartPre=+/bin/true"), "instances.chat.api_key_file"
    )
    with pytest.raises(systemd.UnitValueError):
        systemd.credential_path("api-key", "/k\nExecStartPre=+/bin/true")


@pytest.mark.parametrize(
    "name",
    ["chat\nExecStartPre=+/bin/true", "x/../../escaped", "my chat", 'q$(touch /tmp/x)"a', ".."],
)
def test_an_instance_name_is_a_name(tmp_path: Path, name: str) -> None:
    data = config()
    data["instances"] = {name: data["instances"]["chat"]}
    refused(tmp_path, data, "instances." + json.dumps(name).replace("\\u", "\\\\u"))


def test_a_host_name_is_a_name(tmp_path: Path) -> None:
    data = config(host="b\nExecStartPre=+/bin/true")
    data["hosts"] = {"b\nExecStartPre=+/bin/true": data["hosts"]["box"]}
    cfg = tmp_path / "llamanix.json"
    cfg.write_text(json.dumps(data))
    result = CliRunner().invoke(main, ["validate", "--remote", str(cfg)])
    assert result.exit_code == 2
    assert 'hosts."b\\nExecStartPre=+/bin/true": ' in result.stderr
    # A comment the writers make from a name stays one line whatever the name held.
    assert formats.comment_lines("#", ["host b\nkey: x"]) == ["# host b\\nkey: x"]


def test_a_name_never_leaves_the_render_directory(tmp_path: Path) -> None:
    refused(
        tmp_path,
        {**config(), "instances": {"x/../../escaped": config()["instances"]["chat"]}},
        'instances."x/../../escaped"',
    )
    # A manifest read back from disk that names a file outside: refused before anything moves.
    cfg = parse_config(config(), str(tmp_path / "c.toml"))
    out = tmp_path / "out"
    write_render(render_host(cfg, "box"), out)
    manifest = json.loads((out / MANIFEST).read_text())
    manifest["instances"]["chat"]["unit"] = "../outside.service"
    (out / MANIFEST).write_text(json.dumps(manifest))
    outside = tmp_path / "outside.service"
    outside.write_text("not llamanix's\n")
    with pytest.raises(UserError, match="not a file name inside its directory"):
        write_render(render_host(cfg, "box"), out)
    assert outside.read_text() == "not llamanix's\n"


def test_an_alias_cannot_add_a_preset_section(tmp_path: Path) -> None:
    data = config(alias="q]\nmodel = /etc/shadow\n[z")
    data["hosts"]["box"]["router"] = {"kind": "llama-server", "members": ["chat"]}
    refused(tmp_path, data, "instances.chat.alias")
    with pytest.raises(formats.FormatError):
        formats.ini_section("q]\nmodel = /etc/shadow\n[z")
    with pytest.raises(formats.FormatError):
        formats.ini_value("x\nmodel = /etc/shadow")


def test_the_gateway_version_is_a_release_number(tmp_path: Path) -> None:
    data = config(host="box", listen="0.0.0.0", api_key_file="/etc/llamanix/chat.key")
    data["hosts"]["box"]["target"] = "admin@box"
    data["hosts"]["gw"] = {"kind": "systemd"}
    data["gateway"] = {
        "kind": "litellm",
        "host": "gw",
        "api_key_file": "/etc/llamanix/gateway.key",
        "version": "../../../../etc",
    }
    line = refused(tmp_path, data, "gateway.version")
    assert "is not a release number" in line


def test_a_bridge_cannot_take_an_instance_s_name(tmp_path: Path) -> None:
    data = config()
    data["instances"]["chat-bridge"] = {"model": "/srv/models/m.gguf", "port": 8081}
    line = refused(tmp_path, data, "instances.chat-bridge")
    assert "llamanix-chat-bridge.service" in line


@pytest.mark.parametrize("name", ["router", "gateway", "exporter"])
def test_llamanix_s_own_unit_names_are_reserved(tmp_path: Path, name: str) -> None:
    data = config()
    data["instances"] = {name: data["instances"]["chat"]}
    refused(tmp_path, data, f"instances.{name}")


@pytest.mark.parametrize("listen", ["not an address!", "0.0.0.0\n", "0", "[::1]"])
def test_a_listen_address_is_parsed(tmp_path: Path, listen: str) -> None:
    refused(tmp_path, config(listen=listen, keyless=True), "instances.chat.listen")


def test_a_public_listener_needs_a_key_or_says_it_is_open(tmp_path: Path) -> None:
    line = refused(tmp_path, config(listen="0.0.0.0"), "instances.chat.listen")
    assert "keyless = true" in line
    cfg = tmp_path / "open.json"
    cfg.write_text(json.dumps(config(listen="0.0.0.0", keyless=True)))
    assert CliRunner().invoke(main, ["validate", "--remote", str(cfg)]).exit_code == 0


def test_a_typo_in_a_model_path_is_found_by_validate_not_at_start(tmp_path: Path) -> None:
    cfg = tmp_path / "llamanix.json"
    cfg.write_text(json.dumps(config(model="/srv/models/modle.gguf")))
    result = CliRunner().invoke(main, ["validate", str(cfg)])
    assert result.exit_code == 2
    assert "instances.chat.model: /srv/models/modle.gguf does not exist" in result.stderr
    # For a config meant for another machine, --remote leaves this machine's files out.
    remote = CliRunner().invoke(main, ["validate", "--remote", str(cfg)])
    assert remote.exit_code == 0, remote.output
