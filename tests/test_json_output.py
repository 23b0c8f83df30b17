"""`--json` means JSON on stdout, whatever happens: every command that takes it, on a good input
(its result, one shape however many inputs) and on a bad one (``{"error": ..., "problems":
[...], "exit_code": N}`` and that exit code, the lines on stderr as without --json)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from functools import partial
from pathlib import Path
from typing import Any

import click
import pytest
from cli_run import run_llamanix, server_argv
from standins import stand_in

from llamanix.cli import load_all, main
from llamanix.testbed.synth import SynthSpec, synth_model

REPO = Path(__file__).resolve().parent.parent
HELP = REPO / "tests" / "data" / "help"
ENV = {**os.environ, "PYTHONPATH": str(REPO / "tools")}

CONFIG = """
[hosts.box]
kind = "systemd"
binaries = { upstream = "/usr/local/bin/llama-server" }

[instances.chat]
model = "MODEL"
port = PORT
"""


run = partial(run_llamanix, env=ENV, timeout=300)


def json_commands() -> set[str]:
    """Every command (and subcommand) with a --json option."""
    found: set[str] = set()

    def walk(prefix: str, command: click.Command) -> None:
        if any("--json" in getattr(p, "opts", ()) for p in command.params):
            found.add(prefix)
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                walk(f"{prefix} {name}", sub)

    for name, command in load_all().items():
        if not command.hidden:
            walk(name, command)
    assert main is not None
    return found


def assert_error(proc: subprocess.CompletedProcess[str], code: int, first_line: str) -> None:
    """A failure under --json: the error object on stdout, its lines on stderr, the code."""
    assert proc.returncode == code, (proc.stdout, proc.stderr)
    error = json.loads(proc.stdout)
    assert set(error) == {"error", "problems", "exit_code"}
    assert error["exit_code"] == code
    assert error["problems"][0].startswith(first_line), error
    assert error["error"] == "\n".join(error["problems"])
    assert first_line.removeprefix("llamanix: ") in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("json")
    model = synth_model(SynthSpec(), directory / "model.gguf")
    # A model where a unit could read it (validate refuses /tmp), which is not there.
    (directory / "llamanix.toml").write_text(
        CONFIG.replace("MODEL", "/srv/models/model.gguf").replace("PORT", "18931")
    )
    assert model.exists()
    answer = directory / "upstream.txt"
    answer.write_text(
        (HELP / "upstream-0c1e570.version.txt").read_text()
        + (HELP / "upstream-0c1e570.help.txt").read_text()
    )
    stand_in(directory / "bin", "llama-server", answer)
    (directory / "not.gguf").write_text("not a model\n")
    return directory


# command -> (good args, bad args, exit code of the bad, first line of its error); WORK is
# the module's scratch directory. Commands whose good input needs a running llama-server are
# run on one in test_json_of_the_commands_that_talk_to_a_server.
CASES: dict[str, tuple[list[str] | None, list[str], int, str]] = {
    "validate": (
        ["validate", "--remote", "WORK/llamanix.toml"],
        ["validate", "--remote", "WORK/llamanix.toml", "--capabilities", "WORK/missing.json"],
        2,
        "WORK/missing.json",
    ),
    "plan": (
        ["plan", "--no-security", "WORK/llamanix.toml"],
        ["plan", "WORK/missing.toml"],
        2,
        "WORK/missing.toml: no such file",
    ),
    "variant probe": (
        ["variant", "probe", "WORK/bin/llama-server"],
        ["variant", "probe", "WORK/not.gguf"],
        2,
        "WORK/not.gguf: cannot run",
    ),
    "schema": (["schema"], ["schema", "--no-such-option"], 2, "llamanix: No such option"),
    "switch": (
        ["switch", "WORK/llamanix.toml", "--set", "instances.chat.context=4096", "--dry-run"],
        ["switch", "WORK/llamanix.toml", "--set", "instances.chat.variant=ik_llama", "--dry-run"],
        2,
        "WORK/llamanix.toml: instances.chat.variant: unknown value 'ik_llama'",
    ),
    "generations": (
        ["generations", "WORK/llamanix.toml"],
        ["generations", "WORK/llamanix.toml", "--host", "nope"],
        2,
        "WORK/llamanix.toml: hosts: no [hosts.nope] table",
    ),
    "top": (
        ["top", "WORK/llamanix.toml", "--once"],
        ["top", "WORK/llamanix.toml"],
        2,
        "llamanix top: --json: needs --once",
    ),
    "model inspect": (
        ["model", "inspect", "WORK/model.gguf"],
        ["model", "inspect", "WORK/not.gguf"],
        2,
        "WORK/not.gguf",
    ),
    "model ceiling": (
        ["model", "ceiling", "--bandwidth", "936", "--bytes", "16e9"],
        ["model", "ceiling", "--gpu", "rtx9999", "--bytes", "16e9"],
        2,
        "llamanix model ceiling: --gpu: unknown GPU 'rtx9999'",
    ),
    "doctor": (
        ["doctor", "WORK/llamanix.toml"],
        ["doctor", "WORK/llamanix.toml", "nope"],
        2,
        "WORK/llamanix.toml: INSTANCE: no instance 'nope'",
    ),
    "bench": (None, ["bench", "--url", "http://127.0.0.1:1"], 2, "http://127.0.0.1:1: --url"),
    "bench run": (
        None,
        ["bench", "run", "--url", "http://127.0.0.1:1"],
        2,
        "http://127.0.0.1:1: --url",
    ),
    "bench compare": (
        None,
        ["bench", "compare", "WORK/missing.json", "WORK/missing.json"],
        2,
        "WORK/missing.json",
    ),
    "bench synthetic": (
        None,
        ["bench", "synthetic", "0.5", "--config", "WORK/missing.toml", "--instance", "chat"],
        2,
        "WORK/missing.toml: no such file",
    ),
    "check lossless": (
        None,
        ["check", "lossless", "http://127.0.0.1:1", "http://127.0.0.1:1"],
        2,
        "http://127.0.0.1:1: URL_A: cannot connect",
    ),
    "check smoke": (
        None,
        ["check", "smoke", "--binary", "WORK/missing"],
        2,
        "WORK/missing: --binary",
    ),
    # Its good input (the whole demo) is tests/test_demo.py's `demo --json` run.
    "testbed demo": (
        None,
        ["testbed", "demo", "--binary", "WORK/missing"],
        2,
        "llamanix testbed demo: --binary",
    ),
}


def test_every_json_command_is_covered() -> None:
    assert json_commands() == set(CASES)


def _args(args: list[str], work: Path) -> list[str]:
    return [a.replace("WORK", str(work)) for a in args] + ["--json"]


@pytest.mark.parametrize("command", sorted(CASES))
def test_json_on_a_bad_input_is_the_error(command: str, work: Path) -> None:
    _, bad, code, first = CASES[command]
    assert_error(run(*_args(bad, work)), code, first.replace("WORK", str(work)))


@pytest.mark.parametrize("command", sorted(c for c, case in CASES.items() if case[0] is not None))
def test_json_on_a_good_input_is_the_result(command: str, work: Path) -> None:
    good = CASES[command][0]
    assert good is not None
    proc = run(*_args(good, work))
    assert proc.returncode == 0, proc.stderr
    data: Any = json.loads(proc.stdout)
    assert isinstance(data, list) or "error" not in data


def test_validate_prints_a_list_for_one_file_as_for_two(work: Path) -> None:
    one = json.loads(run("validate", "--remote", "--json", str(work / "llamanix.toml")).stdout)
    two = run("validate", "--remote", "--json", *[str(work / "llamanix.toml")] * 2).stdout
    assert one == [{"config": str(work / "llamanix.toml"), "ok": True, "instances": ["chat"]}]
    assert json.loads(two) == one * 2
    # A config that does not validate is a result too: its entry says so, exit 2.
    missing = str(work / "missing.toml")
    proc = run("validate", "--remote", "--json", missing)
    assert proc.returncode == 2
    assert json.loads(proc.stdout) == [
        {"config": missing, "ok": False, "problems": [f"{missing}: no such file (check the path)"]}
    ]


@pytest.mark.server
def test_json_of_the_commands_that_talk_to_a_server(
    llama_server_bin: Path, work: Path, tmp_path: Path, server_factory: Any
) -> None:
    """bench, bench run, bench compare, bench synthetic, lossless and smoke on a real
    llama-server (the synthetic model), each printing its result as JSON."""
    from llamanix.server.server_process import free_port

    port = free_port()
    server_factory(
        server_argv(llama_server_bin, work / "model.gguf", "--metrics", ctx=4096, port=port)
    )
    url = f"http://127.0.0.1:{port}"
    short = ["--max-tokens", "8", "--runs", "1", "--warmup", "0"]
    bench_a, bench_b = tmp_path / "a.json", tmp_path / "b.json"
    cfg = tmp_path / "llamanix.toml"
    cfg.write_text(
        CONFIG.replace("MODEL", str(work / "model.gguf"))
        .replace("PORT", str(port))
        .replace("/usr/local/bin/llama-server", str(llama_server_bin))
        # bench synthetic sweeps an instance's own speculation: the model drafts for itself.
        + f'[instances.chat.speculative]\ntype = "draft"\ndraft_model = "{work / "model.gguf"}"\n'
    )
    for args in (
        ["bench", "--url", url, *short, "-o", str(bench_a)],
        ["bench", "run", "--url", url, *short, "-o", str(bench_b)],
        ["bench", "compare", str(bench_a), str(bench_b)],
        ["bench", "synthetic", "0.5", "--config", str(cfg), "--instance", "chat", *short],
        ["check", "lossless", url, url, "--max-tokens", "8", "--runs", "1"],
        ["check", "smoke", "--binary", str(llama_server_bin), "--tokens", "8"],
    ):
        proc = run(*args, "--json")
        assert proc.returncode == 0, (args, proc.stderr[-2000:])
        data = json.loads(proc.stdout)
        assert not (isinstance(data, dict) and "error" in data), args
    shutil.rmtree(tmp_path / "unused", ignore_errors=True)
