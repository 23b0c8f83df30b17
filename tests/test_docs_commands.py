"""Every command block of README.md and docs/*.md runs here, or says in the Markdown why not.

The blocks and their markers: tests/doc_blocks.py; how a block runs: tests/doc_run.py; the
rules for writers: docs/development.md, "The docs test". Where a block shows output, its
command must print exactly that (``scripts/regen-doc-output`` rewrites the shown output from a
run). A block that can run nowhere here carries ``<!-- not run: REASON -->``, one that another
test runs ``<!-- run by tests/FILE.py::TEST -->``: so every command block counts, by
construction.
"""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from doc_blocks import (
    NOT_RUN_REASONS,
    ROOT,
    Block,
    Marker,
    all_blocks,
    docs,
    files_of,
    run_by_targets,
    stray_markers,
)
from doc_run import (
    CannotInstall,
    Setup,
    changes_the_machine,
    make_setup,
    problems,
    remove_setup,
    rewritten,
    run_block,
)

from llamanix.testbed import server_build
from llamanix.testbed.synth import SynthSpec, synth_model

BLOCKS = all_blocks()
COMMAND_BLOCKS = [b for b in BLOCKS if b.is_command]


def runnable(block: Block) -> bool:
    return block.is_command and not any(
        block.marker(kind) for kind in ("not run", "run by", "synopsis")
    )


RUNNABLE = [b for b in COMMAND_BLOCKS if runnable(b)]
SYNOPSES = [b for b in COMMAND_BLOCKS if b.marker("synopsis")]
# Blocks whose commands need the test bed's llama-server or real model in the cache first.
_NEEDS_SERVER = re.compile(
    r"\bllamanix (?:testbed |check )?(build-server|demo|smoke)\b|(^|\n)\s*llama-server\b"
)
_NEEDS_MODEL = re.compile(r"\bllamanix (?:testbed )?fetch-model\b")
_NEEDS_VOCAB = re.compile(r"\bllamanix (?:testbed )?synth-model\b.*--vocab")


def test_every_block_names_its_language() -> None:
    bare = [b.id for b in BLOCKS if not b.language]
    assert not bare, f"fenced blocks without a language (sh, console, toml, text, ...): {bare}"
    shells = [b.id for b in BLOCKS if b.language in ("bash", "shell", "shell-session", "zsh")]
    assert not shells, f"write commands as sh (commands) or console ($ and output): {shells}"
    hidden = [b.id for b in BLOCKS if not b.is_command and any(x.startswith("$ ") for x in b.body)]
    assert not hidden, f"a block with '$ ' lines is a transcript: make it console: {hidden}"


def test_every_command_block_runs_or_says_why_not() -> None:
    """Coverage by construction: a command block either runs here, or carries a marker whose
    reason is one of the known ones, or names the test that runs it."""
    wrong = []
    for block in COMMAND_BLOCKS:
        block.commands()  # parses, or says what is wrong
        kinds = [m.kind for m in block.markers if m.kind in ("not run", "run by", "synopsis")]
        if len(kinds) > 1:
            wrong.append(f"{block.id}: one of not run / run by / synopsis, not {kinds}")
        not_run = block.marker("not run")
        if not_run and not not_run.value.startswith(NOT_RUN_REASONS):
            wrong.append(f"{block.id}: 'not run: {not_run.value}' names none of {NOT_RUN_REASONS}")
        if runnable(block) and not block.marker("dry run"):
            for command in block.commands():
                if changes_the_machine(command):
                    wrong.append(
                        f"{block.doc}:{command.line}: `{command.text}` would change this "
                        "machine: mark the block <!-- dry run --> or <!-- not run: ... -->"
                    )
        if block.marker("dry run") and block.language != "sh":
            wrong.append(f"{block.id}: a dry-run block is sh: what it shows is not a dry run's")
    for doc in docs():
        for line in stray_markers(doc):
            wrong.append(f"{doc.relative_to(ROOT)}:{line}: a marker must stand right above a fence")
    for block in BLOCKS:
        if not block.is_command and any(m.kind not in ("file",) for m in block.markers):
            wrong.append(
                f"{block.id}: only a command block takes {[m.kind for m in block.markers]}"
            )
        files = block.marker("files")
        if files:
            files_of(files)
    assert not wrong, "\n".join(wrong)


def _test_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    }


def test_blocks_run_by_other_tests_name_tests_that_exist() -> None:
    wrong = []
    for block in COMMAND_BLOCKS:
        marker = block.marker("run by")
        if not marker:
            continue
        for path, test in run_by_targets(marker):
            file = ROOT / path
            if not file.is_file():
                wrong.append(f"{block.id}: run by {path}: no such file")
            elif test and test not in _test_names(file):
                wrong.append(f"{block.id}: run by {path}::{test}: no such test")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("block", SYNOPSES, ids=[b.id for b in SYNOPSES])
def test_a_synopsis_names_only_options_its_command_has(block: Block) -> None:
    [command] = block.commands()
    words = command.text.replace("\\\n", " ").split()
    sub: list[str] = []
    for word in words[1:]:
        if not re.fullmatch(r"[a-z][a-z-]*", word):
            break
        sub.append(word)
    proc = subprocess.run(
        [sys.executable, "-m", "llamanix", *sub, "--help"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    named = set(re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", command.text))
    missing = sorted(o for o in named if not re.search(rf"(?<![\w-]){re.escape(o)}\b", proc.stdout))
    assert not missing, f"{block.id}: llamanix {' '.join(sub)} --help has no {missing}"


def _help_examples() -> list[tuple[str, str]]:
    from llamanix.cli.examples import EXAMPLES

    return [(path, example) for path, examples in EXAMPLES.items() for example in examples]


def _parse(args: list[str]) -> None:
    """Parse a command line as click would before running it, running nothing."""
    from llamanix.cli import main

    ctx = main.make_context("llamanix", list(args))
    command: click.Command = main
    while isinstance(command, click.Group):
        rest = [*ctx._protected_args, *ctx.args]
        if not rest:
            return
        name, sub, rest = command.resolve_command(ctx, rest)
        assert name is not None and sub is not None
        ctx = sub.make_context(name, rest, parent=ctx)
        command = sub


@pytest.mark.parametrize(("path", "example"), _help_examples(), ids=lambda x: x)
def test_every_help_example_parses(path: str, example: str) -> None:
    """What `llamanix COMMAND --help` shows under Examples is a command line the CLI takes,
    shell globs expanded from the repository (`validate examples/*.toml`) and a redirection cut."""
    words = shlex.split(example)
    if ">" in words:
        words = words[: words.index(">")]
    args: list[str] = []
    for word in words[1:]:
        found = sorted(str(p.relative_to(ROOT)) for p in ROOT.glob(word)) if "*" in word else []
        args += found or [word]
    try:
        _parse(args)
    except click.UsageError as err:
        pytest.fail(f"llamanix {path} --help shows `{example}`, which click refuses: {err}")


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    model = synth_model(SynthSpec(), tmp_path_factory.mktemp("synthetic") / "model.gguf")
    try:
        made = make_setup(server_build.cache_root(), model)
    except CannotInstall as err:
        pytest.skip(str(err))
    yield made
    remove_setup(made)


@pytest.mark.parametrize("block", RUNNABLE, ids=[b.id for b in RUNNABLE])
def test_the_block_runs_and_prints_what_it_shows(
    block: Block, setup: Setup, request: pytest.FixtureRequest
) -> None:
    text = "\n".join(c.text for c in block.commands())
    if _NEEDS_SERVER.search(text):
        request.getfixturevalue("llama_server_bin")
    if _NEEDS_MODEL.search(text):
        request.getfixturevalue("real_model")
    if _NEEDS_VOCAB.search(text):
        request.getfixturevalue("vocab_dir")
    found = problems(block, run_block(block, setup))
    assert not found, "\n\n".join(found)


# --- the runner itself: what it flags ------------------------------------------------------------


def _block(language: str, body: str, *markers: Marker) -> Block:
    """A block as if on line 10 of README.md (which declares no files)."""
    return Block("README.md", 10, language, "", tuple(body.splitlines()), markers)


def test_a_transcript_is_compared_line_for_line(setup: Setup) -> None:
    ok = _block("console", "$ printf 'a\\nb\\nc\\n'\na\n...\n$ echo done\ndone")
    assert problems(ok, run_block(ok, setup)) == []
    wrong = _block("console", "$ echo hi\nho")
    [found] = problems(wrong, run_block(wrong, setup))
    assert "README.md:11: `echo hi` printed something else" in found
    assert "  doc: ho\n  now: hi" in found
    silent = _block("console", "$ echo unshown")
    assert problems(silent, run_block(silent, setup)) != []


def test_a_command_may_fail_only_when_the_next_shows_its_status(setup: Setup) -> None:
    shown = _block("console", "$ false\n$ echo $?\n1")
    assert problems(shown, run_block(shown, setup)) == []
    failing = _block("sh", "false\ntrue")
    [found] = problems(failing, run_block(failing, setup))
    assert found.startswith("README.md:11: `false` exited 1")


def test_programs_that_reach_out_are_refused_and_named(setup: Setup) -> None:
    block = _block("sh", "ssh admin@box2 -- true\nsystemctl restart x.service || true")
    found = problems(block, run_block(block, setup))
    assert "README.md:10: ran `ssh admin@box2 -- true`" in found[0]
    assert any("ran `systemctl restart x.service`" in line for line in found)


def test_files_live_in_the_scratch_directory_and_print_as_the_doc_names_them(
    setup: Setup,
) -> None:
    real = Path("/etc/llamanix/llamanix.toml")
    there = real.exists()
    block = _block(
        "console",
        "$ head -1 /etc/llamanix/llamanix.toml\n# /etc/llamanix/llamanix.toml\n"
        "$ ls /etc/llamanix/llamanix.toml /opt/llamanix/bin/llamanix\n"
        "/etc/llamanix/llamanix.toml\n/opt/llamanix/bin/llamanix",
        Marker("files", "/etc/llamanix/llamanix.toml=docs/debian.md"),
    )
    assert problems(block, run_block(block, setup)) == []
    assert real.exists() == there


def test_a_dry_run_block_adds_dry_run_to_what_would_change_the_machine() -> None:
    paths = {"/etc/llamanix/llamanix.toml": "/s/fs/etc/llamanix/llamanix.toml"}
    text = "sudo /opt/llamanix/bin/llamanix switch /etc/llamanix/llamanix.toml --set a.b=1  # x"
    assert rewritten(text, paths, dry_run=True) == (
        "sudo /opt/llamanix/bin/llamanix switch --dry-run /s/fs/etc/llamanix/llamanix.toml "
        "--set a.b=1  # x"
    )
    assert rewritten("llamanix plan x.toml", paths, dry_run=True) == "llamanix plan x.toml"
    assert changes_the_machine(_block("sh", "llamanix rollback --host gpu1").commands()[0])
    assert not changes_the_machine(_block("sh", "llamanix pin ik --latest --dry-run").commands()[0])
