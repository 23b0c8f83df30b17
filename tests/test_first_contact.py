"""What a newcomer meets after the first minute: no host silently taken for NixOS, a dry run
that lists every step, messages that say what to do, a port another program holds, tables as
wide as their content where no terminal bounds them, help that says what an option does."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from standins import stand_in

from llamanix.cli import main
from llamanix.cli.diagnose import no_findings_line
from llamanix.diagnose.doctor import Report
from llamanix.external.listeners import Listener, listeners
from llamanix.hosts import host_kind
from llamanix.plan import port_check

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(REPO / "tools")}
HELP = REPO / "tests" / "data" / "help"

NO_HOSTS = '[instances.chat]\nmodel = "/srv/models/q.gguf"\n'
NO_KIND = '[hosts.box]\nbinaries = { upstream = "/usr/local/bin/llama-server" }\n' + NO_HOSTS
SYSTEMD = (
    '[hosts.box]\nkind = "systemd"\nbinaries = { upstream = "/usr/local/bin/llama-server" }\n'
    + NO_HOSTS
)


@pytest.fixture
def not_nixos(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(host_kind, "is_nixos", lambda: False)


# --- no silent NixOS -----------------------------------------------------------------------


@pytest.mark.usefixtures("not_nixos")
@pytest.mark.parametrize(
    ("text", "line"),
    [
        (
            NO_HOSTS,
            "hosts: no [hosts.NAME] table, so the instances would run on a NixOS host 'local', "
            "and this machine is not NixOS (no /etc/NIXOS) (add [hosts.box] with kind = "
            '"systemd" (or "systemd-user") and binaries = { upstream = '
            '"/usr/local/bin/llama-server" }; llamanix init writes one)',
        ),
        (
            NO_KIND,
            "hosts.box.kind: missing, so the host would be NixOS (the default), and this "
            'machine is not NixOS (no /etc/NIXOS) (set kind = "systemd" (system units) or '
            '"systemd-user", or kind = "nixos" on a NixOS host)',
        ),
    ],
    ids=["no host table", "a host table without kind"],
)
def test_a_host_nixos_by_default_is_refused_on_a_machine_that_is_not(
    tmp_path: Path, text: str, line: str
) -> None:
    cfg = tmp_path / "llamanix.toml"
    cfg.write_text(text)
    out = tmp_path / "units"
    for args in (
        ["validate", str(cfg)],
        ["plan", "--no-security", str(cfg)],
        ["render", str(cfg), "--out", str(out)],
        ["switch", str(cfg), "--set", "instances.chat.context=4096", "--dry-run"],
        ["switch", str(cfg), "--set", "instances.chat.context=4096"],
    ):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2, (args, result.output)
        assert line in result.stderr, args
        assert "nixos-rebuild" not in result.output
    assert not out.exists()
    assert cfg.read_text() == text
    assert not list(tmp_path.glob(".llamanix-state/*/generations"))  # the lock, nothing else
    # A config for another machine is judged there: --remote does not ask what this one is.
    assert CliRunner().invoke(main, ["validate", "--remote", str(cfg)]).exit_code == 0
    # Stated, it is taken at its word.
    cfg.write_text(text.replace("[hosts.box]\n", '[hosts.box]\nkind = "nixos"\n'))
    if "[hosts.box]" in text:
        assert CliRunner().invoke(main, ["plan", "--no-security", str(cfg)]).exit_code == 0


def test_on_nixos_the_default_stands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_kind, "is_nixos", lambda: True)
    cfg = tmp_path / "llamanix.toml"
    cfg.write_text(NO_HOSTS)
    result = CliRunner().invoke(main, ["plan", "--no-security", str(cfg)])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("host local (nixos)")
    result = CliRunner().invoke(main, ["switch", str(cfg), "--dry-run"])
    assert "nixos-rebuild switch --flake '.#local'" in result.stdout


# --- a dry run lists every step ------------------------------------------------------------


def test_a_dry_run_lists_the_probe_the_baseline_and_the_record(tmp_path: Path) -> None:
    """Every step a real switch takes, in its order: the probe of each binary (here one that
    answers as the recorded upstream build, and one that is not there), the baseline a
    --max-regression measures first, the generation, the files, the draining restart."""
    answer = tmp_path / "upstream.txt"
    answer.write_text(
        (HELP / "upstream-0c1e570.version.txt").read_text()
        + (HELP / "upstream-0c1e570.help.txt").read_text()
    )
    stand_in(tmp_path / "bin", "llama-server", answer)
    binary = tmp_path / "bin" / "llama-server"
    cfg = tmp_path / "llamanix.toml"
    cfg.write_text(
        SYSTEMD.replace("/usr/local/bin/llama-server", str(binary))
        + '[instances.ik]\nvariant = "ik"\nbinary = "/opt/ik/bin/llama-server"\n'
        'model = "/srv/models/q.gguf"\nport = 8081\n'
    )
    args = ["switch", str(cfg), "--set", "instances.chat.context=4096", "--dry-run"]
    result = CliRunner().invoke(main, [*args, "--max-regression", "5"])
    assert result.exit_code == 0, result.output
    state = tmp_path / ".llamanix-state" / "box"
    assert result.stdout.splitlines() == [
        "box: switching chat, ik via systemd",
        f"# probe {binary}: {binary} (version 0.5.0-dev, commit 0c1e570) speaks the upstream "
        "dialect, a build of variant upstream's project",
        "# probe /opt/ik/bin/llama-server: it cannot be asked here (missing, not executable, or "
        "no --help), so its gate says whether it serves",
        "# lift what a killed switch left: fences, redirects, a blue-green bridge",
        "# baseline chat: 1 warm-up + 10 runs of 64 tokens on the server answering now (else "
        f"the stored runs of {state / 'bench' / 'chat.json'})",
        "# baseline ik: 1 warm-up + 10 runs of 64 tokens on the server answering now (else "
        f"the stored runs of {state / 'bench' / 'ik.json'})",
        f"# record generation 1 in {state}",
        f"# write {cfg}",
        "# systemctl restart below: chat, ik one at a time, each running one first fenced where "
        "other machines reach it (nft), drained (at most 30 s) and its main process stopped",
        "# write /etc/systemd/system/llamanix-chat.service",
        "# write /etc/systemd/system/llamanix-ik.service",
        "systemctl daemon-reload",
        "systemctl enable llamanix-chat.service llamanix-ik.service",
        "systemctl reset-failed llamanix-chat.service llamanix-ik.service",
        "systemctl restart llamanix-chat.service llamanix-ik.service",
        "# gate bench: chat, ik",
    ]
    assert not state.exists()


# --- messages that say what to do ---------------------------------------------------------


def test_render_of_several_hosts_names_the_flag(tmp_path: Path) -> None:
    cfg = tmp_path / "llamanix.toml"
    cfg.write_text(
        '[hosts.a]\nkind = "nixos"\n[hosts.b]\nkind = "nixos"\n'
        '[instances.x]\nhost = "a"\nmodel = "/m.gguf"\n'
    )
    result = CliRunner().invoke(main, ["render", str(cfg), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        f"{cfg}: hosts: 2 [hosts.*] tables and no host named (name one of a, b with --host)"
    )


def test_a_set_environment_value_says_to_quote_it(tmp_path: Path) -> None:
    cfg = tmp_path / "llamanix.toml"
    cfg.write_text(SYSTEMD)
    before = cfg.read_text()
    args = ["switch", str(cfg), "--set", "instances.chat.environment.FOO=1", "--dry-run"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        f"{cfg}: instances.chat.environment: must be a table of strings, got 1 for FOO "
        '(quote it: FOO = "1")'
    )
    assert cfg.read_text() == before


def test_rollback_without_a_config_says_it_read_the_default(tmp_path: Path) -> None:
    for command in ("rollback", "generations"):
        proc = subprocess.run(
            [sys.executable, "-m", "llamanix", command],
            capture_output=True,
            text=True,
            env=ENV,
            cwd=tmp_path,
            check=False,
        )
        assert proc.returncode == 2
        assert proc.stderr.strip() == (
            f"llamanix.toml: no such file: CONFIG was left out, and {command} reads "
            f"./llamanix.toml by default (here: {tmp_path}) (name the config: llamanix "
            f"{command} /etc/llamanix/llamanix.toml)"
        )


def test_doctor_says_how_many_checks_ran_before_it_says_no_problems() -> None:
    report = Report(instances=("chat",))
    report.ran("flash-attn")
    report.ran("vocab")
    for check in ("vram", "cuda-arch", "server-exit", "chat-template"):
        report.skipped(check, "nothing to look at")  # type: ignore[arg-type]
    assert no_findings_line(report) == (
        "no problems found by the 2 of 6 checks that ran (1 instance(s)); 4 skipped, each below "
        "with what it needs"
    )
    whole = Report(instances=("chat",))
    whole.ran("flash-attn")
    assert no_findings_line(whole) == "no problems found (1 instance(s), 1 checks passed)"


def test_top_says_where_to_look_for_a_server_that_is_not_there(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free once closed: nothing listens there
    cfg = tmp_path / "llamanix.toml"
    cfg.write_text(SYSTEMD + f"port = {port}\n")
    result = CliRunner().invoke(main, ["top", str(cfg), "--once", "--json"])
    [row] = json.loads(result.stdout)["hosts"][0]["rows"]
    assert row["state"] == "down"
    assert row["detail"] == (
        f"nothing listens on 127.0.0.1:{port} (connection refused): the server is stopped, "
        "crashed or not started yet (see why: systemctl status llamanix-chat.service; start "
        "it: llamanix switch)"
    )


# --- a port another program holds ---------------------------------------------------------


def test_validate_names_the_program_that_holds_the_port(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        cfg = tmp_path / "llamanix.toml"
        cfg.write_text(SYSTEMD + f"port = {port}\n")
        assert [h.pid for h in listeners(port)] == [os.getpid()]
        result = CliRunner().invoke(main, ["validate", str(cfg)])
        assert result.exit_code == 2
        line = next(ln for ln in result.stderr.splitlines() if ".port:" in ln)
        command = Path(f"/proc/{os.getpid()}/cmdline").read_bytes().replace(b"\0", b" ")
        assert line == (
            f"{cfg}: instances.chat.port: port {port} is already taken on this machine: "
            f"{command.decode().strip()} (pid {os.getpid()}) listens on 127.0.0.1:{port} "
            "(choose a free port, or stop that program first)"
        )
        # Another machine's host is not this one's business.
        result = CliRunner().invoke(main, ["validate", "--remote", str(cfg)])
        assert result.exit_code == 0, result.output
    # Once it is free, the same config passes that check.
    result = CliRunner().invoke(main, ["validate", str(cfg)])
    assert ".port:" not in result.stderr


@pytest.mark.parametrize(
    ("cgroup", "parents", "ours"),
    [
        ("0::/system.slice/llamanix-chat.service\n", (), True),
        (
            "0::/user.slice/user@1000.service/app.slice/llamanix-chat.service",
            (),
            True,
        ),
        ("0::/system.slice/nginx.service\n", (), False),
        ("0::/user.slice\n", ("/opt/llamanix/bin/llamanix up llamanix.toml",), True),
        ("0::/user.slice\n", ("python3 -m llamanix up llamanix.toml --host dev",), True),
        ("0::/user.slice\n", ("llamanix-upgrade",), False),
    ],
)
def test_a_port_held_by_the_hosts_own_servers_is_not_in_the_way(
    cgroup: str, parents: tuple[str, ...], ours: bool
) -> None:
    holder = Listener("127.0.0.1", 8080, 1, "llama-server", cgroup, parents)
    assert port_check._ours(holder) is ours


@pytest.mark.parametrize(
    ("listen", "held", "clash"),
    [
        ("127.0.0.1", "127.0.0.1", True),
        ("127.0.0.1", "127.0.0.2", False),
        ("0.0.0.0", "127.0.0.1", True),
        ("127.0.0.1", "0.0.0.0", True),
        ("127.0.0.1", "::", True),  # a dual-stack wildcard takes IPv4 too
        ("::1", "0.0.0.0", False),
        ("::", "127.0.0.1", True),
    ],
)
def test_which_listeners_a_bind_would_clash_with(listen: str, held: str, clash: bool) -> None:
    assert port_check._overlaps(listen, held) is clash


# --- output where no terminal bounds it ----------------------------------------------------


def test_a_piped_table_is_as_wide_as_its_content(tmp_path: Path) -> None:
    """Through a pipe rich took 80 columns and cut cells short; now a row is one line."""
    cfg = tmp_path / "llamanix.toml"
    cfg.write_text(SYSTEMD)
    state = tmp_path / ".llamanix-state" / "box"
    shutil.copytree(REPO / "tests" / "data" / "docs" / "debian-state" / "box", state)
    (state / "manager.json").write_text(json.dumps({"manager": "up", "units_dir": "x"}))
    detail = "did not start: " + "a reason long enough to be cut short in 80 columns " * 3
    result = state / "generations" / "2" / "result.json"
    record = json.loads(result.read_text())
    record["gate"] = {
        "kind": "health",
        "result": "failed",
        "instances": {"chat": {"gate": "health", "passed": False, "detail": detail.strip()}},
    }
    result.write_text(json.dumps(record))
    proc = subprocess.run(
        [sys.executable, "-m", "llamanix", "generations", str(cfg)],
        capture_output=True,
        text=True,
        env={k: v for k, v in ENV.items() if k != "COLUMNS"},
        check=True,
    )
    assert "…" not in proc.stdout
    assert f"chat: {detail.strip()}" in proc.stdout
    assert max(len(line) for line in proc.stdout.splitlines()) > 200


# --- help that says what an option does ----------------------------------------------------


@pytest.mark.parametrize(
    ("command", "text"),
    [
        ("rollback", "Roll back each of these hosts, in this order, stopping at the first that"),
        ("generations", "List the generations of each of these hosts, in this order."),
        ("switch", "A rolling switch of these hosts, in this order: the first is the canary."),
    ],
)
def test_hosts_says_what_each_command_does_with_them(command: str, text: str) -> None:
    result = CliRunner().invoke(main, [command, "--help"], terminal_width=400)
    assert text in " ".join(result.output.split())


def test_pin_waits_for_another_pin_of_the_same_flake() -> None:
    result = CliRunner().invoke(main, ["pin", "--help"], terminal_width=400)
    assert "Wait this long for another pin of the same flake to finish." in result.output
    assert "same host" not in result.output


# --- the tables the new checks read agree with their sources ------------------------------


def test_every_flag_spelling_is_one_option_of_the_recorded_help() -> None:
    """Each group of FLAG_SPELLINGS is the spellings of one option of upstream's --help."""
    from llamanix.config.model import FLAG_SPELLINGS
    from llamanix.core.probe import parse_help

    text = (REPO / "tests" / "data" / "help" / "upstream-0c1e570.help.txt").read_text()
    flags, _, details = parse_help(text)
    for group in FLAG_SPELLINGS:
        assert all(spelling in flags for spelling in group), group
        assert len({details[spelling] for spelling in group}) == 1, group


def test_the_cuda_capabilities_are_nixpkgs_own() -> None:
    """CUDA_CAPABILITIES are the keys of nixpkgs' CUDA database as recorded (nix/lib.nix keeps
    its copy of the same file equal: tests/test_nix.py)."""
    from llamanix.core.gpus import CUDA_CAPABILITIES

    record = json.loads((REPO / "tests" / "data" / "nixpkgs-cuda-capabilities.json").read_text())
    assert list(CUDA_CAPABILITIES) == list(record["cudaCapabilityToInfo"])
