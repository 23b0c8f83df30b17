"""The [gateway] section (docs/gateway.md): its refusals, the LiteLLM config it renders, the keys
that config uses against what the pinned LiteLLM accepts, the unit, and the venv's commands."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from llamanix.cli import main
from llamanix.config.model import load_config, parse_config
from llamanix.core.errors import ExternalCommandError, UserError
from llamanix.core.schema import LITELLM_VERSION
from llamanix.external.process import Runner
from llamanix.hosts import gateway_venv
from llamanix.render import gateway, systemd
from llamanix.render.units import render_host

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "tests/data/configs/fleet-gateway.toml"
RECORDED = ROOT / "tools/llamanix/data" / f"litellm-{LITELLM_VERSION}.json"

BASE = """
[hosts.box1]
kind = "systemd"
target = "root@box1.lan:2222"
binaries = {{ upstream = "/usr/local/bin/llama-server" }}

[hosts.box3]
kind = "systemd"

[gateway]
{gateway}

[instances.a]
host = "box1"
model = "/m/a.gguf"
alias = "qwen"
listen = "{listen}"
api_key_file = "/etc/llamanix/a.key"
"""
GATEWAY = 'kind = "litellm"\nhost = "box3"\napi_key_file = "/etc/llamanix/gateway.key"'


def _write(tmp_path: Path, gateway_text: str = GATEWAY, listen: str = "0.0.0.0") -> Path:
    path = tmp_path / "llamanix.toml"
    path.write_text(BASE.format(gateway=gateway_text, listen=listen))
    return path


@pytest.mark.parametrize(
    ("gateway_text", "listen", "line"),
    [
        (
            GATEWAY + '\nversion = "1.82.7"',
            "0.0.0.0",
            "gateway.version: LiteLLM 1.82.7 was a compromised release on PyPI and is refused "
            f"(remove version to run the pinned {LITELLM_VERSION}, or name another release)",
        ),
        (
            GATEWAY.replace("box3", "box9"),
            "0.0.0.0",
            "gateway.host: no host 'box9' (did you mean 'box3'?)",
        ),
        (
            GATEWAY,
            "127.0.0.1",
            "instances.a.listen: listens on 127.0.0.1 on host 'box1', which the gateway on host "
            "'box3' cannot reach (listen on an address of that host, or on \"0.0.0.0\" with the "
            "host's target set)",
        ),
        (
            GATEWAY + '\nno_affinity = ["qwn"]',
            "0.0.0.0",
            "gateway.no_affinity: no model group 'qwn' (a group is an instance's alias, else its "
            "name) (did you mean 'qwen'?)",
        ),
        (
            GATEWAY.replace('"litellm"', '"litelm"'),
            "0.0.0.0",
            "gateway.kind: unknown value 'litelm' (did you mean 'litellm'?)",
        ),
        (
            GATEWAY.replace('api_key_file = "/etc/llamanix/gateway.key"', ""),
            "0.0.0.0",
            "gateway.api_key_file: missing (name the file holding its master key, e.g. "
            '"/etc/llamanix/gateway.key")',
        ),
        (
            GATEWAY
            + "".join(
                f'\n[instances.{name}]\nhost = "box1"\nmodel = "/m/q.gguf"\n'
                f'listen = "0.0.0.0"\nport = {port}\napi_key_file = "/etc/llamanix/{name}.key"\n'
                for name, port in (("qwen-a", 8081), ("qwen_a", 8082))
            ),
            "0.0.0.0",
            "instances.qwen_a: its key would reach the gateway through LLAMANIX_KEY_QWEN_A, "
            "which instance 'qwen-a' takes already (rename one of them: names that differ only "
            "in case or in characters other than letters and digits share that variable)",
        ),
    ],
    ids=[
        "compromised version",
        "missing host",
        "unreachable loopback replica",
        "unknown group without affinity",
        "bad kind",
        "no key",
        "key variables collide",
    ],
)
def test_refusals_are_one_line_and_exit_2(
    tmp_path: Path, gateway_text: str, listen: str, line: str
) -> None:
    path = _write(tmp_path, gateway_text, listen)
    out = tmp_path / "out"
    for args in (
        ["validate", str(path)],
        ["render", str(path), "--host", "box3", "--out", str(out)],
    ):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2, result.output
        assert result.output.strip().splitlines() == [f"{path}: {line}"]
        assert "Traceback" not in result.output
    assert not out.exists()


def test_a_loopback_replica_on_the_gateways_own_host_is_reached_on_loopback(
    tmp_path: Path,
) -> None:
    path = _write(tmp_path)
    text = (
        path.read_text()
        + '\n[instances.b]\nhost = "box3"\nmodel = "/m/a.gguf"\nalias = "qwen"\n'
        + 'binary = "/usr/local/bin/llama-server"\n'
    )
    cfg = parse_config(tomllib.loads(text), str(path))
    bases = {d.instance: d.api_base for d in gateway.deployments(cfg)}
    # a wildcard listener: the host's ssh target without user and port; b: loopback, same host
    assert bases == {"a": "http://box1.lan:8080/v1", "b": "http://127.0.0.1:8080/v1"}


def test_the_example_renders_the_measured_settings() -> None:
    cfg = load_config(EXAMPLE)
    settings = gateway.settings(cfg)
    assert settings["router_settings"] == {
        "routing_strategy": "simple-shuffle",
        "num_retries": 8,
        "retry_after": 0,
        "disable_cooldowns": True,
    }
    general = settings["general_settings"]
    assert general == {
        "master_key": "os.environ/LITELLM_MASTER_KEY",
        # LiteLLM's own checks send completions: llamanix's plugin asks /health instead.
        "background_health_checks": False,
    }
    assert settings["litellm_settings"] == {
        "request_timeout": 600,
        "callbacks": ["llamanix_gateway.handler"],
    }
    plugin = settings["environment_variables"]
    assert isinstance(plugin, dict)
    assert json.loads(str(plugin["LLAMANIX_GATEWAY"])) == {
        "version": 1,
        "interval": 5,
        "routes": "/var/lib/llamanix-gateway/routes.json",
        "conversations": 4096,
        "affinity": {"qwen3-8b": True},
        "health": {
            "qwen-a": "http://box1.lan:8080/health",
            "qwen-b": "http://10.0.0.12:8080/health",
        },
    }
    # allowed_fails: 0 put both replicas into cooldown at once when measured (docs/gateway.md)
    assert "allowed_fails" not in json.dumps(settings)
    models = settings["model_list"]
    assert isinstance(models, list)
    rows = [(m["model_name"], m["litellm_params"], m["model_info"]) for m in models]  # type: ignore[index]
    assert rows == [
        (
            "qwen3-8b",
            {"model": "openai/qwen3-8b", "api_base": "http://box1.lan:8080/v1", "api_key": "none"},
            {"id": "qwen-a"},
        ),
        (
            "qwen3-8b",
            {
                "model": "openai/qwen3-8b",
                "api_base": "http://10.0.0.12:8080/v1",
                "api_key": "os.environ/LLAMANIX_KEY_QWEN_B",
            },
            {"id": "qwen-b"},
        ),
    ]
    # The YAML LiteLLM reads is the same data.
    yaml = pytest.importorskip("yaml")
    assert yaml.safe_load(gateway.config_text(cfg)) == settings


def test_every_key_the_renderer_emits_is_one_the_pinned_litellm_accepts() -> None:
    recorded = json.loads(RECORDED.read_text())
    assert recorded["version"] == LITELLM_VERSION
    used = gateway.used_keys(gateway.settings(load_config(EXAMPLE)))
    for section, keys in used.items():
        assert keys, section
        assert keys <= set(recorded[section]), (section, keys - set(recorded[section]))
    assert gateway.check(load_config(EXAMPLE)) == ([], [])


def test_a_key_the_version_does_not_accept_is_a_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load_config(EXAMPLE)
    real = gateway.accepted_keys(LITELLM_VERSION)
    assert real is not None
    smaller = {**real, "router_settings": real["router_settings"] - {"retry_after"}}
    monkeypatch.setattr(gateway, "accepted_keys", lambda version: smaller)
    problems, _ = gateway.check(cfg)
    assert [str(p) for p in problems] == [
        f"{EXAMPLE}: gateway: LiteLLM {LITELLM_VERSION} does not accept "
        "router_settings.retry_after (use another version, or report this as a bug in llamanix)"
    ]


def test_a_version_without_a_record_is_a_one_line_warning(tmp_path: Path) -> None:
    path = _write(tmp_path, GATEWAY + '\nversion = "1.106.13"')
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.output.splitlines() if line.startswith("warning:")]
    assert warnings == [
        f"warning: {path}: gateway.version: no record of the keys LiteLLM 1.106.13 accepts, so "
        "its config is not checked (run scripts/litellm-accepted-keys with that version's python)"
    ]


def test_the_unit_carries_no_key_and_loads_each_as_a_credential() -> None:
    cfg = load_config(EXAMPLE)
    render = render_host(cfg, "box3")
    assert render.gateway is not None and render.instances == ()
    text = render.gateway.unit_text
    assert "LoadCredential=master-key:/etc/llamanix/gateway.key" in text
    assert "LoadCredential=key-qwen-b:/etc/llamanix/qwen-b.key" in text
    for line in ("DynamicUser=yes", "ProtectSystem=strict", "NoNewPrivileges=yes",
                 "MemoryDenyWriteExecute=yes", "PrivateTmp=yes", "CacheDirectory=llamanix-gateway",
                 'Environment="LITELLM_LOCAL_MODEL_COST_MAP=True"'):  # fmt: skip
        assert line in text.splitlines(), line
    exec_start = next(x for x in text.splitlines() if x.startswith("ExecStart="))
    # No shell: llamanix's gateway-exec reads each credential into its variable and execs
    # LiteLLM with an argv, every word of it quoted, %d (the credentials) the one specifier.
    words = shlex.split(exec_start.removeprefix("ExecStart="))
    assert words[1:] == [
        "gateway-exec",
        "--credential-env", "LITELLM_MASTER_KEY=master-key",
        "--credential-env", "LLAMANIX_KEY_QWEN_B=key-qwen-b",
        "--", f"/var/lib/llamanix/litellm/{LITELLM_VERSION}/bin/litellm",
        "--config", "%d/litellm.yaml", "--host", "0.0.0.0", "--port", "4000",
    ]  # fmt: skip
    assert "/bin/sh" not in text
    post = next(x for x in text.splitlines() if x.startswith("ExecStartPost="))
    assert shlex.split(post.removeprefix("ExecStartPost="))[1:] == [
        "gateway-ready", "--url", "http://127.0.0.1:4000/health/liveliness", "--pid", "$MAINPID"
    ]  # fmt: skip
    assert set(render.files()) == {
        "llamanix-gateway.service", "gateway.argv.json", "litellm.yaml", "manifest.json"
    }  # fmt: skip
    # The other hosts render no gateway.
    assert render_host(cfg, "box1").gateway is None


def test_the_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    import shutil

    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    render = render_host(load_config(EXAMPLE), "box3")
    assert render.gateway is not None
    unit = tmp_path / "llamanix-gateway.service"
    unit.write_text(render.gateway.unit_text)
    done = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, check=False
    )
    # verify complains about the missing venv's programs here; nothing about the unit's syntax
    bad = [
        line
        for line in done.stderr.splitlines()
        if "llamanix-gateway.service" in line
        and "is not executable" not in line
        and "No such file" not in line
        and "Command " not in line
    ]
    assert bad == [], done.stderr


def test_the_venv_is_made_once_through_the_hosts_pip(tmp_path: Path) -> None:
    ran: list[str] = []
    runner = Runner(dry_run=True, echo=ran.append)
    assert gateway_venv.ensure(runner, LITELLM_VERSION, root=tmp_path)
    venv = tmp_path / LITELLM_VERSION
    assert [line for line in ran if not line.startswith("#")] == [
        f"python3 -m venv {venv}",
        f"{venv}/bin/python -m pip install --quiet 'litellm[proxy]=={LITELLM_VERSION}'",
    ]
    (venv / "bin").mkdir(parents=True)
    (venv / "bin/litellm").write_text("")
    (venv / gateway_venv.MARKER).write_text("")
    ran.clear()
    assert not gateway_venv.ensure(runner, LITELLM_VERSION, root=tmp_path)
    assert ran == []


def test_the_venv_of_a_refused_version_is_never_made(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="compromised"):
        gateway_venv.ensure(Runner(dry_run=True), "1.82.8", root=tmp_path)


def test_the_manifest_round_trips_the_gateway() -> None:
    from llamanix.render.manifest import Manifest

    render = render_host(load_config(EXAMPLE), "box3")
    back = Manifest.parse(render.manifest().text())
    assert back == render.manifest()
    assert back.gateway is not None and back.gateway.version == LITELLM_VERSION


def test_recorded_keys_are_what_the_script_prints() -> None:
    python = os.environ.get("LLAMANIX_LITELLM_PYTHON")
    if not python:
        pytest.skip("LLAMANIX_LITELLM_PYTHON names no python with litellm[proxy] installed")
    done = subprocess.run(
        [python, str(ROOT / "scripts/litellm-accepted-keys")],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
    )
    version = json.loads(done.stdout)["version"]
    assert done.stdout == (ROOT / f"tools/llamanix/data/litellm-{version}.json").read_text()


def test_a_change_of_the_gateway_alone_is_a_change_to_switch() -> None:
    from llamanix.render.changes import gateway_changes as _gateway_changes

    render = render_host(load_config(EXAMPLE), "box3")
    files = render.files()
    assert _gateway_changes(render, {}, [], []) == (["gateway"], [])
    assert _gateway_changes(render, files, [], []) == ([], [])
    # Only the header (the config's hash) differs: the same service, nothing to restart.
    header = {
        **files,
        "llamanix-gateway.service": "# other hash\n" + files["llamanix-gateway.service"],
    }
    assert _gateway_changes(render, header, [], []) == ([], [])
    no_gateway = render_host(load_config(EXAMPLE), "box1")
    assert _gateway_changes(no_gateway, files, [], []) == ([], ["gateway"])


def test_up_refuses_the_gateways_host(tmp_path: Path) -> None:
    from llamanix.hosts.managers import refuse_router_under_up

    cfg = load_config(EXAMPLE)
    with pytest.raises(UserError) as err:
        refuse_router_under_up(cfg, "box3")
    assert [str(p) for p in err.value.problems] == [
        f"{EXAMPLE}: gateway.host: llamanix up does not run the gateway (let systemd run this "
        "host (switch without --manager up))"
    ]
    refuse_router_under_up(cfg, "box1")


def test_a_nixos_gateway_host_validates_and_renders_no_unit_of_its_own(tmp_path: Path) -> None:
    """The NixOS module runs it through services.litellm (tests/test_nix_equivalence.py)."""
    path = _write(tmp_path)
    path.write_text(path.read_text().replace('[hosts.box3]\nkind = "systemd"', "[hosts.box3]"))
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert "warning" not in result.output
    assert render_host(load_config(path), "box3").gateway is None


def test_no_config_value_reaches_a_shell_or_the_unit_unquoted(tmp_path: Path) -> None:
    """The unit has no shell: systemd's own parser splits its ExecStart into gateway-exec's
    argv, word for word. An instance named like a shell command or a version with a shell's
    ``;`` (values validate refuses) are refused by the unit writer too, never written."""
    from dataclasses import replace

    from llamanix.render.systemd import UnitValueError

    cfg = load_config(EXAMPLE)
    hostile = 'q$(touch /tmp/x)"a'
    instances = {
        (hostile if n == "qwen-b" else n): replace(i, name=hostile if n == "qwen-b" else n)
        for n, i in cfg.instances.items()
    }
    assert cfg.gateway is not None
    llamanix = ["/opt/llamanix/bin/llamanix"]
    for bad in (
        replace(cfg, instances=instances),
        replace(cfg, gateway=replace(cfg.gateway, version="1.106.12; touch /tmp/y")),
    ):
        with pytest.raises(UnitValueError):
            gateway.render_unit(bad, "0" * 64, llamanix)
    unit = gateway.render_unit(cfg, "0" * 64, llamanix).unit_text
    assert "/bin/sh" not in unit
    line = next(x for x in unit.splitlines() if x.startswith("ExecStart="))
    words = systemd.exec_argv(line.removeprefix("ExecStart="), {"d": "%d"})[1]
    assert words == gateway.start_argv(cfg, llamanix)
    if shutil.which("systemd-analyze"):
        path = tmp_path / "llamanix-gateway.service"
        path.write_text(unit)
        done = subprocess.run(
            ["systemd-analyze", "verify", str(path)], capture_output=True, text=True, check=False
        )
        assert "Failed to parse" not in done.stderr and "Invalid" not in done.stderr, done.stderr


def test_the_venv_of_a_version_that_leaves_its_directory_is_never_deleted(tmp_path: Path) -> None:
    """``gateway.version`` names the venv's directory, deleted before pip runs: a version that
    would point that delete elsewhere is refused before anything is touched."""
    root = tmp_path / "litellm"
    root.mkdir()
    precious = tmp_path / "etc"
    precious.mkdir()
    (precious / "passwd").write_text("keep me\n")
    (root / "link").symlink_to(precious)
    for version in ("../etc", "..", "", ".", "a/../../etc", "link", "/etc"):
        with pytest.raises(ExternalCommandError, match="does not name a directory inside"):
            gateway_venv.ensure(Runner(), version, root=root)
    assert (precious / "passwd").read_text() == "keep me\n"


def test_gateway_exec_hands_litellm_its_keys_and_the_plugin(tmp_path: Path) -> None:
    """The unit's ExecStart, run for real: each credential into its variable, the plugin's
    directory (which holds the plugin alone) on the path, then the program in its place."""
    creds = tmp_path / "credentials"
    creds.mkdir()
    (creds / "master-key").write_text("sk-master\n")
    (creds / "key-a").write_text("sk-a\n")
    env = {**os.environ, "CREDENTIALS_DIRECTORY": str(creds), "PYTHONPATH": str(ROOT / "tools")}
    done = subprocess.run(
        [sys.executable, "-m", "llamanix", "gateway-exec",
         "--credential-env", "LITELLM_MASTER_KEY=master-key",
         "--credential-env", "LLAMANIX_KEY_A=key-a", "--", "/usr/bin/env"],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    seen = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    assert seen["LITELLM_MASTER_KEY"] == "sk-master" and seen["LLAMANIX_KEY_A"] == "sk-a"
    plugin = Path(seen["PYTHONPATH"])
    assert sorted(p.name for p in plugin.glob("*.py")) == ["__init__.py", "llamanix_gateway.py"]
    # A credential name that is a path, a missing one, a variable named twice: one line,
    # exit 2, nothing run.
    dup = ["--credential-env", "K=master-key", "--credential-env", "K=key-a"]
    for pairs in (["--credential-env", "K=../master-key"], ["--credential-env", "K=missing"], dup):
        bad = subprocess.run(
            [sys.executable, "-m", "llamanix", "gateway-exec", *pairs, "--", "/usr/bin/env"],
            env=env, capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
        assert "sk-" not in bad.stdout + bad.stderr


def test_gateway_ready_fails_once_litellm_has_exited() -> None:
    from llamanix.server.server_process import free_port

    dead = subprocess.Popen(["true"])
    dead.wait()
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "llamanix", "gateway-ready", "--url",
         f"http://127.0.0.1:{free_port()}/health/liveliness", "--pid", str(dead.pid)],
        env={**os.environ, "PYTHONPATH": str(ROOT / "tools")},
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "exited" in done.stderr and time.monotonic() - started < 30
