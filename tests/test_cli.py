"""The CLI's shape: help grouped by job, examples in every command's help, completion of host
and instance names from the config, and one meaning of --json (JSON on stdout)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from click.utils import make_default_short_help

from llamanix.cli import COMMAND_GROUPS, load_all, main
from llamanix.cli.examples import EXAMPLES

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "tools")}
BENCH_RUNS_0 = "llamanix bench: --runs: must be at least 1 (pass --runs 1 or more)"


def every_command() -> list[tuple[str, click.Command]]:
    out: list[tuple[str, click.Command]] = []

    def walk(prefix: str, group: click.Group) -> None:
        for name, command in group.commands.items():
            path = f"{prefix} {name}".strip()
            if command.hidden:
                continue
            out.append((path, command))
            if isinstance(command, click.Group):
                walk(path, command)

    load_all()
    walk("", main)
    return out


def test_help_lists_commands_by_job() -> None:
    result = CliRunner().invoke(main, ["--help"], terminal_width=120)
    assert result.exit_code == 0
    text = result.output
    positions = [text.index(f"{title}:") for title in COMMAND_GROUPS]
    assert positions == sorted(positions)
    assert "Other commands:" not in text  # every command has a group
    for title, names in COMMAND_GROUPS.items():
        section = text[text.index(f"{title}:") :]
        for name in names:
            assert f"\n  {name} " in section, (title, name)


def test_every_command_is_in_a_group() -> None:
    grouped = {name for names in COMMAND_GROUPS.values() for name in names}
    commands = load_all()
    assert set(commands) - {n for n, c in commands.items() if c.hidden} == grouped


@pytest.mark.parametrize("path", [p for p, _ in every_command()])
def test_every_command_help_has_examples(path: str) -> None:
    result = CliRunner().invoke(main, [*path.split(), "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    text = result.output
    assert "Examples:" in text, path
    examples = [line.strip() for line in text[text.index("Examples:") :].splitlines()[1:]]
    examples = [line for line in examples if line.startswith("llamanix ")]
    assert len(examples) >= 2, path
    assert all(line.startswith(f"llamanix {path.split()[0]}") for line in examples), path
    assert tuple(EXAMPLES[path]) == tuple(examples[: len(EXAMPLES[path])])


def complete(words: str, cwd: Path) -> list[str]:
    env = {
        **os.environ,
        "_LLAMANIX_COMPLETE": "bash_complete",
        "COMP_WORDS": words,
        "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1)),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "llamanix"], cwd=cwd, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    return [line.split(",", 1)[1] for line in proc.stdout.splitlines() if line]


def test_completion_names_hosts_and_instances_from_the_config(tmp_path: Path) -> None:
    config = tmp_path / "two.toml"
    config.write_text(
        '[hosts.gpu1]\nkind = "nixos"\n[hosts.gpu2]\nkind = "nixos"\n'
        '[instances.qwen]\nhost = "gpu1"\nmodel = "/m/q.gguf"\n'
        '[instances.coder]\nhost = "gpu2"\nmodel = "/m/c.gguf"\n'
    )
    assert complete("llamanix argv two.toml ", tmp_path) == ["qwen", "coder"]
    assert complete("llamanix argv two.toml co", tmp_path) == ["coder"]
    assert complete("llamanix render two.toml --host ", tmp_path) == ["gpu1", "gpu2"]
    assert complete("llamanix switch two.toml --host g", tmp_path) == ["gpu1", "gpu2"]
    assert complete("llamanix switch two.toml --host ", tmp_path) == ["gpu1", "gpu2", "all"]
    # The default config name when none is on the line (tidy, rollback, generations).
    (tmp_path / "llamanix.toml").write_text(config.read_text())
    assert complete("llamanix tidy --host ", tmp_path) == ["gpu1", "gpu2"]
    # A broken config completes nothing, and says nothing.
    config.write_text("[hosts\n")
    assert complete("llamanix argv two.toml ", tmp_path) == []


def test_json_means_stdout_and_output_means_a_file() -> None:
    for path, command in every_command():
        for param in command.params:
            if "--json" in param.opts:
                assert isinstance(param, click.Option) and param.is_flag, path
            if "-o" in param.opts:
                assert "--output" in param.opts, path


def test_switch_infers_the_only_host(tmp_path: Path) -> None:
    config = tmp_path / "llamanix.toml"
    config.write_text(
        '[hosts.box]\nkind = "systemd"\nbinaries = { upstream = "/usr/bin/llama-server" }\n'
        '[instances.a]\nmodel = "/m/a.gguf"\n'
    )
    result = CliRunner().invoke(
        main, ["switch", str(config), "--set", "instances.a.port=8081", "--dry-run"]
    )
    assert result.exit_code == 0, result.output
    assert result.output.startswith("box: ")


def test_listing_and_completion_come_from_the_index_and_match_the_commands() -> None:
    """`--help` and a TAB read cli.COMMANDS without importing the command modules: each
    entry names the module that really defines the command and its real short help."""
    from llamanix.cli import COMMANDS, load_all

    commands = load_all()
    assert set(COMMANDS) == set(commands)
    for name, (module, short) in COMMANDS.items():
        command = commands[name]
        assert command.callback is not None
        assert command.callback.__module__ == f"llamanix.cli.{module}", name
        for width in (30, 45, 80, 200):
            assert make_default_short_help(short, width) == command.get_short_help_str(width)


def test_help_and_completion_import_no_heavy_library() -> None:
    script = (
        "import sys, contextlib, io\n"
        "import llamanix.cli as cli\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n"
        "        cli.main(['--help'])\n"
        "    except SystemExit:\n"
        "        pass\n"
        "heavy = ('gguf', 'numpy', 'httpx', 'rich', 'jinja2', 'prometheus_client')\n"
        "print(','.join(m for m in heavy if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False, env=ENV
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""
    env = {
        **ENV,
        "_LLAMANIX_COMPLETE": "bash_complete",
        "COMP_WORDS": "llamanix pl",
        "COMP_CWORD": "1",
    }
    tab = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "llamanix"],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    assert tab.stdout.split() == ["plain,plan"]
    imported = {line.rsplit("|", 1)[-1].strip() for line in tab.stderr.splitlines()}
    assert not imported & {"gguf", "numpy", "httpx", "rich", "jinja2", "llamanix.cli.core"}


@pytest.mark.parametrize(
    ("old", "new", "argv"),
    [
        (
            "--deadline",
            "--timeout",
            ["readiness", "--url", "http://127.0.0.1:9", "--deadline", "0"],
        ),
        (
            "--model",
            "--alias",
            ["bench", "--url", "http://127.0.0.1:9", "--model", "m", "--runs", "0"],
        ),
        (
            "--synthetic-acceptance",
            "llamanix bench synthetic RATES --config CONFIG --instance NAME",
            ["bench", "--synthetic-acceptance", "0.5", "--runs", "0"],
        ),
    ],
)
def test_deprecated_spellings_still_work_and_say_so(old: str, new: str, argv: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "llamanix", *argv],
        capture_output=True,
        text=True,
        env=ENV,
        check=False,
    )
    assert f"llamanix: {old} is deprecated, use {new}" in done.stderr.splitlines()
    assert "Traceback" not in done.stderr
    # Taken as the option it stands for: readiness gave up at once (exit 1, the deadline
    # was 0 s); bench reached its own check of --runs, the sweep its check of --config (exit 2,
    # one line).
    assert done.returncode in (1, 2)


def test_bench_run_is_bare_bench() -> None:
    """`bench run` and bare `bench` are one command: the same options, the same checks."""
    for argv in (["bench", "run"], ["bench"]):
        done = subprocess.run(
            [sys.executable, "-m", "llamanix", *argv, "--url", "http://127.0.0.1:9", "--runs", "0"],
            capture_output=True,
            text=True,
            env=ENV,
            check=False,
        )
        assert done.returncode == 2
        assert done.stderr.strip().splitlines() == [BENCH_RUNS_0], argv


def test_the_readme_command_tables_are_the_help_listing() -> None:
    """README.md's "Commands" tables name the commands `llamanix --help` lists, group by
    group, in its order: a command added to the CLI and not to the README (or the other way
    round) fails here."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Commands\n") :]
    section = section[: section.index("\n## ", 1)]
    tables: dict[str, list[str]] = {}
    title = None
    for line in section.splitlines():
        if line.startswith("| ") and line.endswith(" | |"):
            title = line[2:-4].strip()
            tables[title] = []
        elif line.startswith("| `") and title is not None:
            tables[title].append(line[3:].split("`")[0].split()[0])
    assert tables == {title: list(names) for title, names in COMMAND_GROUPS.items()}


# --- the command tree: at most 21 top-level commands, old names kept for a release ----------


def test_at_most_21_top_level_commands_hidden_ones_included() -> None:
    from llamanix.cli import COMMANDS, MOVED

    assert len(COMMANDS) <= 21
    assert not set(MOVED) & set(COMMANDS)


def _after_usage(text: str) -> str:
    return text.split("\n", 1)[1]


@pytest.mark.parametrize("old", sorted(__import__("llamanix.cli").cli.MOVED))
def test_an_old_command_name_runs_the_new_command_after_one_line(old: str) -> None:
    from llamanix.cli import MOVED, MOVED_QUIETLY
    from llamanix.cli.variant import OLD_GRAMMAR

    ran = CliRunner().invoke(main, [old, "--help"], terminal_width=200, prog_name="llamanix")
    assert ran.exit_code == 0, ran.output
    note = [] if old in MOVED_QUIETLY else [f"llamanix: {old} is `llamanix {MOVED[old]}` now"]
    assert ran.stderr.splitlines() == note
    assert ran.stdout.startswith(f"Usage: llamanix {old} ")
    if old in OLD_GRAMMAR:  # its arguments in their old order, the same command behind them
        assert ran.stdout.startswith(f"Usage: llamanix {old} [OPTIONS] VARIANT "), ran.stdout
        return
    words = [w for w in MOVED[old].split() if not w.startswith("-")]
    new = CliRunner().invoke(main, [*words, "--help"], terminal_width=200, prog_name="llamanix")
    assert new.exit_code == 0 and new.stderr == ""
    assert _after_usage(ran.stdout) == _after_usage(new.stdout)


def test_argv_is_plan_argv(tmp_path: Path) -> None:
    config = str(ROOT / "examples/rtx5090-qwen27b-draft.toml")
    old = CliRunner().invoke(main, ["argv", config, "qwen27b", "--variant", "ik"])
    new = CliRunner().invoke(main, ["plan", config, "qwen27b", "--argv", "--variant", "ik"])
    assert old.exit_code == new.exit_code == 0, old.output
    assert old.stdout == new.stdout and json.loads(new.stdout)[0].endswith("llama-server")
    assert old.stderr.splitlines() == ["llamanix: argv is `llamanix plan --argv` now"]


def test_pin_in_its_old_grammar_is_variant_pin(tmp_path: Path) -> None:
    (tmp_path / "flake.nix").write_text("{ }\n")
    flake = ["--flake", str(tmp_path)]
    old = CliRunner().invoke(main, ["pin", "nixpkgs", "--latest", "--dry-run", *flake])
    config = str(tmp_path / "llamanix.toml")
    new = CliRunner().invoke(main, ["variant", "pin", config, "nixpkgs", "--latest", "--dry-run"])
    assert old.exit_code == new.exit_code == 0, (old.output, new.output)
    assert old.stdout == new.stdout
    assert old.stdout.startswith(f"(cd {tmp_path} && nix flake update nixpkgs)\n")
    assert old.stderr.splitlines() == ["llamanix: pin is `llamanix variant pin` now"]


@pytest.mark.parametrize(
    ("command", "old", "note"),
    [
        (
            ["generations", "{config}", "--json"],
            ["--hosts", "box"],
            "llamanix: --hosts is --host now (--host A,B)",
        ),
        (
            ["switch", "{config}", "--set", "instances.a.port=8081", "--dry-run"],
            ["--all-hosts"],
            "llamanix: --all-hosts is --host now (--host all)",
        ),
        (
            ["switch", "{config}", "--set", "instances.a.port=8081", "--dry-run"],
            ["--hosts", "box"],
            "llamanix: --hosts is --host now (--host A,B)",
        ),
    ],
)
def test_old_host_flags_run_as_host_after_one_line(
    tmp_path: Path, command: list[str], old: list[str], note: str
) -> None:
    config = tmp_path / "llamanix.toml"
    config.write_text(
        '[hosts.box]\nkind = "systemd"\nbinaries = { upstream = "/usr/bin/llama-server" }\n'
        '[instances.a]\nmodel = "/m/a.gguf"\n'
    )
    argv = [str(config) if word == "{config}" else word for word in command]
    before = CliRunner().invoke(main, [*argv, *old])
    now = CliRunner().invoke(main, [*argv, "--host", "all"])
    assert before.exit_code == now.exit_code == 0, before.output
    assert before.stdout == now.stdout
    assert before.stderr.splitlines() == [note, *now.stderr.splitlines()]


# --- the boundary after the regrouping (issue 53's red-team) ----------------------------------

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "rtx5090-qwen27b-draft.toml"


def test_a_host_named_all_is_refused_since_host_all_means_every_host(tmp_path: Path) -> None:
    from llamanix.cli.options import ALL_HOSTS
    from llamanix.config.model import ALL_HOSTS as CONFIG_ALL_HOSTS

    assert ALL_HOSTS == CONFIG_ALL_HOSTS == "all"
    config = tmp_path / "llamanix.toml"
    config.write_text(EXAMPLE.read_text().replace("[hosts.gpu1]", "[hosts.all]"))
    assert "[hosts.all]" in config.read_text()
    done = CliRunner().invoke(main, ["validate", str(config)])
    assert done.exit_code == 2, done.output
    assert f"{config}: hosts.all: 'all' is what --host all means (every host)" in done.output


def test_plan_argv_checks_against_a_probe_named_for_its_instance(tmp_path: Path) -> None:
    probe = tmp_path / "probe.json"
    probe.write_text(json.dumps({"binary": "llama-server", "flags": []}))
    lines = []
    for spec in (str(probe), f"qwen27b={probe}"):
        done = CliRunner().invoke(
            main, ["plan", str(EXAMPLE), "qwen27b", "--argv", "--capabilities", spec]
        )
        assert done.exit_code == 2, (spec, done.output)
        lines.append(done.output)
    assert lines[0] == lines[1], lines  # the named probe is checked, as the plain one is
    done = CliRunner().invoke(
        main, ["plan", str(EXAMPLE), "qwen27b", "--argv", "--capabilities", f"chat={probe}"]
    )
    assert done.exit_code == 2, done.output
    assert "--capabilities: a probe of 'chat', not qwen27b" in done.output


def test_a_probe_file_without_a_binary_is_one_line(tmp_path: Path) -> None:
    probe = tmp_path / "probe.json"
    probe.write_text(json.dumps({"binary": 3, "flags": []}))
    done = CliRunner().invoke(main, ["variant", "probe", "--diff", str(probe), str(probe)])
    assert done.exit_code == 2, done.output
    assert done.output.startswith(f"{probe}: not a probe: "), done.output
    assert "Traceback" not in done.output and len(done.output.splitlines()) == 1


def test_a_closed_set_names_the_command_as_typed_under_its_group() -> None:
    done = CliRunner().invoke(main, ["check", "smoke", "--spec", "nope"])
    assert done.exit_code == 2, done.output
    assert done.output.startswith("llamanix check smoke: --spec: unknown value 'nope'"), done.output


def test_several_hosts_are_refused_as_host_not_the_old_spelling(tmp_path: Path) -> None:
    fleet = EXAMPLE.parent / "fleet-rtx5090-rtx3090-gateway.toml"
    done = CliRunner().invoke(main, ["generations", str(fleet), "--host", ","])
    assert done.exit_code == 2, done.output
    assert ": --host: names no host (e.g. --host gpu1,gpu2)" in done.output, done.output


@pytest.mark.parametrize("command", [["variant", "pin"], ["variant", "build"]])
def test_variant_and_config_swapped_is_one_line_with_the_order(
    tmp_path: Path, command: list[str]
) -> None:
    """`variant pin|build VARIANT CONFIG`: one line that gives the order, nothing written."""
    config = tmp_path / "llamanix.toml"
    config.write_text("# not read\n")
    result = CliRunner().invoke(main, [*command, "upstream", str(config), "--dry-run"])
    assert result.exit_code == 2, result.output
    said = " ".join(command)
    assert result.stderr.splitlines() == [
        f"llamanix {said}: CONFIG: 'upstream' is a variant, and the config comes first "
        f"(llamanix {said} {config} upstream, with the rest as you gave it)"
    ]
    assert result.stdout == "" and config.read_text() == "# not read\n"


def test_a_swapped_config_named_like_an_option_or_too_long_stays_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The swapped order's fix names a file that starts with "-" as ./NAME (else it pastes as
    an option); a name too long to look up is no config, and no traceback."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "--dry-run").write_text("# not read\n")
    result = CliRunner().invoke(main, ["variant", "build", "upstream", "--", "--dry-run"])
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines() == [
        "llamanix variant build: CONFIG: 'upstream' is a variant, and the config comes first "
        "(llamanix variant build ./--dry-run upstream, with the rest as you gave it)"
    ]
    long = CliRunner().invoke(main, ["variant", "pin", "upstream", "a" * 5000, "--dry-run"])
    assert long.exit_code == 2, long.output
    [line] = long.stderr.splitlines()
    assert line.startswith("llamanix variant pin: VARIANT: unknown variant 'aaaa")
