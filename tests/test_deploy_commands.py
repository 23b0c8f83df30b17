"""Exact command lines of switch / rollback / pin, asserted with recording stand-ins on PATH.

nixos-rebuild and nix cannot run here: stand-ins record their argv (and working directory) as
JSON lines, like nixos-rebuild-ng's tests assert ``subprocess.run`` calls. systemctl runs for
real in tests/test_hosts.py, under systemd as PID 1; here its stand-in only records that a dry run
calls nothing. The
gates run for real: where nothing listens on the instance's port, the gate really fails.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from functools import partial
from pathlib import Path

import pytest
from cli_run import invoke
from click.testing import CliRunner
from standins import recorded, stand_in

from llamanix.cli import main
from llamanix.external import nix
from llamanix.server.server_process import free_port
from llamanix.state.config_edit import apply_sets
from llamanix.state.generations import GenerationRecord, HostState


@pytest.fixture
def recorder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "standins"
    record = tmp_path / "record.jsonl"
    # systemctl itself runs in tests/test_hosts.py, under a real systemd; a stand-in here only
    # proves that dry runs call nothing.
    for name in ("nixos-rebuild", "nix", "systemctl"):
        stand_in(bin_dir, name, record=record)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return record


def argvs(record: Path) -> list[list[str]]:
    return [list(r["argv"]) for r in recorded(record)]  # type: ignore[call-overload]


cli = partial(invoke, catch_exceptions=False)


def write_config(
    d: Path,
    kind: str,
    port: int,
    target: str | None = None,
    binary: str = "/opt/llama/bin/llama-server",
    host_lines: str = "",
) -> Path:
    (d / "flake.nix").write_text("{ outputs = _: { }; }\n")
    host_extra = (f'target = "{target}"\n' if target else "") + host_lines
    path = d / "llamanix.toml"
    path.write_text(
        "# my GPU box\n"
        f'[hosts.gpu1]\nkind = "{kind}"\n{host_extra}'
        f'binaries = {{ upstream = "{binary}" }}\n\n'
        f'[instances.qwen]\nmodel = "/srv/models/q.gguf"  # the big one\nport = {port}\n'
        "context = 4096\n"
    )
    return path


def no_temp_files(d: Path) -> list[Path]:
    return [p for p in d.rglob("*") if p.name.endswith(".tmp")]


def test_nixos_failed_gate_rolls_back_on_the_same_target(tmp_path: Path, recorder: Path) -> None:
    config = write_config(tmp_path, "nixos", free_port(), target="root@127.0.0.1")
    before = config.read_text()
    result = cli(
        "switch",
        str(config),
        "--host",
        "gpu1",
        "--set",
        "instances.qwen.variant=ik",
        "--timeout",
        "1",
    )
    assert result.exit_code == 1, result.output
    # A root@ login needs no sudo on the target.
    remote = ["--target-host", "root@127.0.0.1"]
    assert argvs(recorder) == [
        ["nixos-rebuild", "switch", "--flake", ".#gpu1", *remote],
        ["nixos-rebuild", "switch", "--rollback", *remote],
    ]
    assert {r["cwd"] for r in recorded(recorder)} == {str(tmp_path)}
    assert config.read_text() == before  # the rejected change is not left in the config
    assert not no_temp_files(tmp_path)
    gens = json.loads(cli("generations", str(config), "--host", "gpu1", "--json").output)
    assert [g["gate"]["result"] for g in gens] == ["failed"]
    assert gens[0]["instances"]["qwen"]["variant"] == "ik"


def test_nixos_local_host_has_no_target_flags(tmp_path: Path, recorder: Path) -> None:
    config = write_config(tmp_path, "nixos", free_port())
    result = cli(
        "switch",
        str(config),
        "--host",
        "gpu1",
        "--set",
        "instances.qwen.context=8192",
        "--timeout",
        "1",
    )
    assert result.exit_code == 1
    assert argvs(recorder) == [
        ["nixos-rebuild", "switch", "--flake", ".#gpu1"],
        ["nixos-rebuild", "switch", "--rollback"],
    ]


def test_nixos_rebuild_failure_is_not_rolled_back(
    tmp_path: Path, recorder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A failed build never activated anything: --rollback would go one generation too far.
    monkeypatch.setenv("STANDIN_EXIT_nixos_rebuild", "1")
    config = write_config(tmp_path, "nixos", free_port())
    before = config.read_text()
    result = cli("switch", str(config), "--host", "gpu1", "--set", "instances.qwen.context=8192")
    assert result.exit_code == 1
    assert argvs(recorder) == [["nixos-rebuild", "switch", "--flake", ".#gpu1"]]
    assert config.read_text() == before


@pytest.mark.parametrize(
    ("target", "host_lines", "remote"),
    [
        # auto: a login that is not root gets nixos-rebuild-ng's --sudo ...
        ("admin@127.0.0.1", "", ["--target-host", "admin@127.0.0.1", "--sudo"]),
        # ... so does a target whose login ssh picks (it may not be root) ...
        ("127.0.0.1", "", ["--target-host", "127.0.0.1", "--sudo"]),
        # ... and root, or this machine when llamanix runs as root, gets none.
        ("root@127.0.0.1", "", ["--target-host", "root@127.0.0.1"]),
        (None, "", []),
        # The older nixos-rebuild's spelling, and no sudo for a login allowed to activate.
        (
            "admin@127.0.0.1",
            'sudo = "use-remote-sudo"\n',
            ["--target-host", "admin@127.0.0.1", "--use-remote-sudo"],
        ),
        ("admin@127.0.0.1", 'sudo = "none"\n', ["--target-host", "admin@127.0.0.1"]),
        ("root@127.0.0.1", 'sudo = "sudo"\n', ["--target-host", "root@127.0.0.1", "--sudo"]),
        # A CUDA build on the builder, not on the machine running llamanix (only the stand-in
        # sees the builder's name).
        (
            "admin@127.0.0.1",
            'build_host = "nix@builder.lan"\n',
            ["--target-host", "admin@127.0.0.1", "--build-host", "nix@builder.lan", "--sudo"],
        ),
    ],
    ids=["user", "ssh-user", "root", "local", "use-remote-sudo", "none", "sudo", "build-host"],
)
def test_nixos_rebuild_gets_the_hosts_sudo_and_build_host(
    tmp_path: Path,
    recorder: Path,
    monkeypatch: pytest.MonkeyPatch,
    target: str | None,
    host_lines: str,
    remote: list[str],
) -> None:
    """The exact argv of a failed switch (nothing listens) and its rollback: the build host
    only where something is built. llamanix runs as root here (a user's local switch: below)."""
    monkeypatch.setattr(nix, "running_as_root", lambda: True)
    config = write_config(tmp_path, "nixos", free_port(), target=target, host_lines=host_lines)
    result = cli(
        "switch", str(config), "--host", "gpu1", "--set", "instances.qwen.context=8192",
        "--timeout", "1",
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    rollback = [a for a in remote if a not in ("--build-host", "nix@builder.lan")]
    assert argvs(recorder) == [
        ["nixos-rebuild", "switch", "--flake", ".#gpu1", *remote],
        ["nixos-rebuild", "switch", "--rollback", *rollback],
    ]


@pytest.mark.parametrize(("host_lines", "flag"), [("", ["--sudo"]), ('sudo = "none"\n', [])])
def test_a_users_local_nixos_switch_activates_through_sudo(
    tmp_path: Path,
    recorder: Path,
    monkeypatch: pytest.MonkeyPatch,
    host_lines: str,
    flag: list[str],
) -> None:
    """This machine, llamanix run by a user who is not root: nixos-rebuild cannot activate
    without root, so `auto` passes --sudo (and `none` leaves it to the user)."""
    monkeypatch.setattr(nix, "running_as_root", lambda: False)
    config = write_config(tmp_path, "nixos", free_port(), host_lines=host_lines)
    result = cli(
        "switch", str(config), "--host", "gpu1", "--set", "instances.qwen.context=8192",
        "--timeout", "1",
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert argvs(recorder) == [
        ["nixos-rebuild", "switch", "--flake", ".#gpu1", *flag],
        ["nixos-rebuild", "switch", "--rollback", *flag],
    ]


@pytest.mark.parametrize("key", ["build_host", "sudo"])
def test_nixos_rebuild_settings_on_a_systemd_host_are_refused(
    tmp_path: Path, recorder: Path, key: str
) -> None:
    value = '"nix@builder.lan"' if key == "build_host" else '"sudo"'
    config = write_config(tmp_path, "systemd", free_port(), host_lines=f"{key} = {value}\n")
    result = CliRunner().invoke(main, ["validate", str(config)])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f"{config}: hosts.gpu1.{key}: only a NixOS host is switched by nixos-rebuild, and "
        f"'gpu1' is of kind systemd (remove {key})"
    ]
    assert recorded(recorder) == []


def test_dry_run_prints_exactly_the_commands_and_runs_nothing(
    tmp_path: Path, recorder: Path
) -> None:
    config = write_config(tmp_path, "nixos", free_port(), target="admin@gpu1.lan")
    before = config.read_text()
    result = cli(
        "switch", str(config), "--host", "gpu1", "--set", "instances.qwen.variant=ik", "--dry-run"
    )
    assert result.exit_code == 0, result.output
    commands = [line for line in result.output.splitlines() if line.startswith("(cd ")]
    assert commands == [
        f"(cd {tmp_path} && nixos-rebuild switch --flake '.#gpu1' --target-host admin@gpu1.lan "
        "--sudo)"
    ]
    assert f"# write {config}" in result.output
    assert recorded(recorder) == []
    assert config.read_text() == before
    assert not (tmp_path / ".llamanix-state").exists()


def test_systemd_user_uses_user_manager(tmp_path: Path, recorder: Path) -> None:
    units = tmp_path / "user-units"
    config = write_config(tmp_path, "systemd-user", free_port())
    result = cli("switch", str(config), "--host", "gpu1", "--units-dir", str(units), "--dry-run")
    assert result.exit_code == 0, result.output
    commands = [line for line in result.output.splitlines() if line.startswith("systemctl")]
    assert commands == [
        "systemctl --user daemon-reload",
        "systemctl --user enable llamanix-qwen.service",
        "systemctl --user reset-failed llamanix-qwen.service",
        "systemctl --user restart llamanix-qwen.service",
    ]
    assert f"# write {units / 'llamanix-qwen.service'}" in result.output
    assert recorded(recorder) == []
    assert not units.exists()


def test_rollback_on_nixos_runs_nixos_rebuild_rollback(tmp_path: Path, recorder: Path) -> None:
    config = write_config(tmp_path, "nixos", free_port(), target="root@127.0.0.1")
    cli(
        "switch",
        str(config),
        "--host",
        "gpu1",
        "--set",
        "instances.qwen.context=8192",
        "--timeout",
        "1",
    )
    # Generation 1 failed; --to names it anyway (the user's call): config back, rebuild.
    recorder.unlink()
    result = cli("rollback", str(config), "--host", "gpu1", "--to", "1", "--dry-run")
    assert result.exit_code == 0, result.output
    assert "nixos-rebuild switch --flake '.#gpu1' --target-host root@127.0.0.1" in result.output
    no_to = cli("rollback", str(config), "--host", "gpu1")
    assert no_to.exit_code == 2
    assert "no earlier good generation" in no_to.output


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["upstream", "--latest"],
            ["nix", "flake", "update", "llama-cpp-upstream"],
        ),
        (
            ["ik", "0123abcd"],
            [
                "nix",
                "flake",
                "lock",
                "--override-input",
                "ik-llama-cpp",
                "github:ikawrakow/ik_llama.cpp/0123abcd",
            ],
        ),
        (["nixpkgs", "--latest"], ["nix", "flake", "update", "nixpkgs"]),
    ],
)
def test_pin(tmp_path: Path, recorder: Path, args: list[str], expected: list[str]) -> None:
    (tmp_path / "flake.nix").write_text("{ }\n")
    result = cli("variant", "pin", str(tmp_path / "llamanix.toml"), *args, "--flake", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert recorded(recorder) == [{"argv": expected, "cwd": str(tmp_path)}]


@pytest.mark.parametrize("args", [["mtp", "ebe4fca"], ["mtp", "--latest"]])
def test_pin_refuses_an_input_pinned_by_url(
    tmp_path: Path, recorder: Path, args: list[str]
) -> None:
    (tmp_path / "flake.nix").write_text("{ }\n")
    config = str(tmp_path / "llamanix.toml")
    result = CliRunner().invoke(main, ["variant", "pin", config, *args, "--flake", str(tmp_path)])
    assert result.exit_code == 2
    assert result.output == (
        "llamanix variant pin: VARIANT: mtp is pinned by URL in flake.nix "
        "(github:ggml-org/llama.cpp/255582687b8dd211fdbc582e43ab842491554e94) "
        "(edit that URL to move it, or pin variant upstream, which carries the same code)\n"
    )
    assert recorded(recorder) == []


def test_bad_set_value_is_one_line_and_writes_nothing(tmp_path: Path, recorder: Path) -> None:
    config = write_config(tmp_path, "nixos", free_port())
    before = config.read_text()
    result = CliRunner().invoke(
        main, ["switch", str(config), "--host", "gpu1", "--set", "instances.qwen.variant=ikk"]
    )
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f"{config}: instances.qwen.variant: unknown value 'ikk' (did you mean 'ik'?)"
    ]
    assert config.read_text() == before
    assert recorded(recorder) == []
    assert not (tmp_path / ".llamanix-state").exists()


def test_set_keeps_comments_and_layout(tmp_path: Path) -> None:
    config = write_config(tmp_path, "nixos", 8080)
    text = apply_sets(
        config,
        config.read_text(),
        (
            "instances.qwen.context=8192",
            "instances.qwen.speculative.type=ngram-simple",
            "instances.qwen.alias=qwen-27b",
        ),
    )
    assert "# my GPU box" in text and "# the big one" in text
    data = tomllib.loads(text)
    assert data["instances"]["qwen"]["context"] == 8192
    assert data["instances"]["qwen"]["alias"] == "qwen-27b"
    assert data["instances"]["qwen"]["speculative"] == {"type": "ngram-simple"}


def test_switch_all_stops_at_the_first_failed_host(tmp_path: Path, recorder: Path) -> None:
    (tmp_path / "flake.nix").write_text("{ }\n")
    config = tmp_path / "llamanix.toml"
    p1, p2 = free_port(), free_port()
    config.write_text(
        '[hosts.a]\nkind = "nixos"\n[hosts.b]\nkind = "nixos"\n'
        f'[instances.x]\nhost = "a"\nmodel = "/m/x.gguf"\nport = {p1}\n'
        f'[instances.y]\nhost = "b"\nmodel = "/m/y.gguf"\nport = {p2}\n'
    )
    result = cli("switch", str(config), "--host", "all", "--timeout", "1")
    assert result.exit_code == 1
    assert argvs(recorder) == [
        ["nixos-rebuild", "switch", "--flake", ".#a"],
        ["nixos-rebuild", "switch", "--rollback"],
    ]
    # --host all is a rollout of every host, one at a time: it ends with its table.
    table = result.output[result.output.index("rolling switch") :]
    assert re.search(r"│ a\s+│ - -> -\s+│ failed", table), table
    assert re.search(r"│ b\s+│ -\s+│ untouched", table), table


def test_state_dir_that_cannot_be_made_is_one_line(tmp_path: Path, recorder: Path) -> None:
    config = write_config(tmp_path, "nixos", free_port())
    (tmp_path / ".llamanix-state").write_text("not a directory\n")
    result = CliRunner().invoke(main, ["switch", str(config), "--host", "gpu1"])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{config}: cannot keep host gpu1's state in "), lines
    assert recorded(recorder) == []


def test_a_switch_restarts_only_the_instance_it_changes(tmp_path: Path, recorder: Path) -> None:
    """Every unit's header names the config's hash, so any change rewrites every unit; only
    the one whose settings changed is restarted (and gated)."""
    units = tmp_path / "user-units"
    config = tmp_path / "llamanix.toml"
    config.write_text(
        '[hosts.gpu1]\nkind = "systemd-user"\n'
        'binaries = { upstream = "/opt/llama/bin/llama-server" }\n\n'
        f'[instances.a]\nmodel = "/srv/models/a.gguf"\nport = {free_port()}\n\n'
        f'[instances.b]\nmodel = "/srv/models/b.gguf"\nport = {free_port()}\n'
    )
    render = cli("render", str(config), "--host", "gpu1", "--out", str(units))
    assert render.exit_code == 0, render.output
    before = (units / "llamanix-b.service").read_text()
    result = cli(
        *("switch", str(config), "--host", "gpu1", "--units-dir", str(units), "--dry-run"),
        *("--set", "instances.a.context=2048"),
    )
    assert result.exit_code == 0, result.output
    assert "gpu1: switching a via systemd-user" in result.output
    commands = [line for line in result.output.splitlines() if line.startswith("systemctl")]
    assert commands == [
        "systemctl --user daemon-reload",
        "systemctl --user reset-failed llamanix-a.service",
        "systemctl --user restart llamanix-a.service",
    ]
    # b's unit is rewritten (its header names the new config) but not restarted.
    assert f"# write {units / 'llamanix-b.service'}" in result.output
    assert (units / "llamanix-b.service").read_text() == before
    assert recorded(recorder) == []


def test_a_recorded_manifest_that_does_not_read_is_one_line_naming_it(
    tmp_path: Path, recorder: Path
) -> None:
    """What a switch compares with must be what it says: a current generation whose manifest
    does not read stops the switch in one line, never a traceback or units taken for none."""
    config = write_config(tmp_path, "nixos", free_port())
    state = HostState.beside(config, "gpu1")
    files = {"manifest.json": "{}\n", "llamanix-qwen.service": "[Service]\n"}
    gen = state.create(files, config.read_text(), ".toml", GenerationRecord())
    state.set_current(gen)
    manifest = gen.path / "files" / "manifest.json"
    manifest.write_text('{"instances": {"qwen": ')  # cut short, as a full disk leaves it
    result = CliRunner().invoke(main, ["switch", str(config), "--dry-run"])
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [
        f"{manifest}: not a llamanix manifest: JSON syntax error at line 1, column 24: "
        "Expecting value "
        "(restore it from a backup, or remove this generation's directory)"
    ]
    assert recorded(recorder) == []
