"""Run the command blocks of the docs (tests/doc_blocks.py) the way a reader would, here.

Each block runs in a scratch directory of its own, its commands one after the other in one
``bash``, from a working directory that holds a copy of ``examples/`` and the files the block
names. Absolute paths a block names as files (``/etc/llamanix/llamanix.toml``) live under the
scratch directory and are written back as the document wrote them in what the commands print.

``llamanix`` is this checkout, installed as docs/debian.md installs it: a venv whose package
and interpreter a unit's dynamic user could run (under ``/run``, so root only), so ``validate``
judges the config and not where the tests happen to run from. The venv shows as
``/opt/llamanix``. Programs that would change this machine or reach another one
(``ssh``, ``systemctl``, ``nixos-rebuild``, ``nix``, ...) are replaced on ``PATH`` by a stand-in
that refuses and records the call; a block that calls one fails.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from doc_blocks import ROOT, Block, Command, files_of, parse
from recorded_help import bee_after_v03, recorded, write_probe

# What a block may not run here: each stand-in exits 97 and writes its argv to the record.
REFUSED_PROGRAMS = (
    "ssh",
    "systemctl",
    "systemd-run",
    "journalctl",
    "loginctl",
    "nixos-rebuild",
    "nix",
    "nix-build",
    "nvidia-smi",
    "curl",
)
SHOWN_VENV = "/opt/llamanix"
SHOWN_CACHE = "/home/you/.cache/llamanix"
COLUMNS = "100"
_DRY_RUN = re.compile(
    r"((?:^|[\s/])llamanix\s+(?:switch|rollback|(?:variant\s+)?(?:pin|build)))(?=\s|$)"
)
_SUBCOMMANDS_THAT_CHANGE = re.compile(
    r"(?:^|[\s/])llamanix\s+(switch|rollback|(?:variant\s+)?(?:pin|build))(?=\s|$)"
)


@dataclass(frozen=True)
class Setup:
    """What every block shares: the installed llamanix, the stand-ins, the test bed's cache."""

    base: Path  # scratch directories are made under it
    venv: Path
    shims: Path
    cache: Path
    synthetic: Path | None  # a small generated GGUF, when some block asks for one


@dataclass(frozen=True)
class Result:
    command: Command
    rc: int
    output: tuple[str, ...]


@dataclass(frozen=True)
class BlockRun:
    results: tuple[Result, ...]
    refused: tuple[str, ...]  # the refused programs' command lines


# Where the installed llamanix goes: a directory a unit's dynamic user could search (every
# directory above it 0755, none of those a unit hides: /tmp, /home, /root, /run/user).
VISIBLE_PARENT = Path("/run")


class CannotInstall(Exception):
    """This process may not write where a unit could run llamanix from."""


def make_setup(cache: Path, synthetic: Path | None = None) -> Setup:
    if not os.access(VISIBLE_PARENT, os.W_OK):
        raise CannotInstall(
            f"the docs test installs llamanix under {VISIBLE_PARENT}, where a unit's dynamic "
            "user could run it, and cannot write there (run it as root, as CI does)"
        )
    base = Path(tempfile.mkdtemp(prefix="llamanix-docs-", dir=VISIBLE_PARENT))
    base.chmod(0o755)
    venv = base / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--copies", "--without-pip", "--system-site-packages", venv],
        check=True,
    )
    site = next((venv / "lib").glob("python3*/site-packages"))
    shutil.copytree(
        ROOT / "tools" / "llamanix", site / "llamanix", ignore=shutil.ignore_patterns("__pycache__")
    )
    script = venv / "bin" / "llamanix"
    script.write_text(
        f"#!{venv}/bin/python3\nimport sys\nfrom llamanix.cli import main\nsys.exit(main())\n"
    )
    script.chmod(0o755)
    shims = base / "shims"
    shims.mkdir()
    (shims / "sudo").write_text(
        "#!/bin/sh\n# sudo as root: drop its options, run the command\n"
        'while [ "${1#-}" != "$1" ]; do shift; done\nexec "$@"\n'
    )
    for name in REFUSED_PROGRAMS:
        (shims / name).write_text(
            "#!/bin/sh\n"
            f'echo "{name} $*" >> "$LLAMANIX_DOCS_REFUSED"\n'
            f'echo "docs test: {name} is not run here" >&2\nexit 97\n'
        )
    for shim in shims.iterdir():
        shim.chmod(0o755)
    return Setup(base, venv, shims, cache, synthetic)


def remove_setup(setup: Setup) -> None:
    shutil.rmtree(setup.base, ignore_errors=True)


def doc_files(doc: str) -> dict[str, str]:
    """The ``file:`` blocks of one document: {PATH: text}."""
    out: dict[str, str] = {}
    for block in parse(ROOT / doc):
        marker = block.marker("file")
        if marker:
            if marker.value in out:
                raise ValueError(f"{block.id}: file {marker.value} is declared twice")
            out[marker.value] = "\n".join(block.body) + "\n"
    return out


def block_files(block: Block, setup: Setup) -> dict[str, bytes]:
    """Every file a block runs with: its document's ``file:`` blocks and its ``files:``."""
    out = {name: text.encode() for name, text in doc_files(block.doc).items()}
    marker = block.marker("files")
    for name, source in (files_of(marker) if marker else {}).items():
        if source.startswith("probe:"):
            stem = source.removeprefix("probe:")
            caps = bee_after_v03() if stem == "beellama-after-v0.3" else recorded(stem)
            out[name] = write_probe(caps, setup.base / f"{stem}.json").read_bytes()
        elif source == "synthetic":
            if setup.synthetic is None:
                raise ValueError(f"{block.id}: {name}=synthetic without a synthetic model")
            out[name] = setup.synthetic.read_bytes()
        elif source == "program":
            # A stand-in for a program the block only names (validate checks that it is there
            # and that a unit could run it); it is never run.
            out[name] = b"#!/bin/sh\necho 'docs test: a stand-in program' >&2\nexit 97\n"
        elif source == "key":
            out[name] = b"sk-docs-test-key\n"
        elif source == "stand-in":
            # A file the block only needs to be there (a model a dry run never loads).
            out[name] = b"docs test: a stand-in file\n"
        elif source.endswith(".md"):
            declared = doc_files(source)
            if name not in declared:
                raise ValueError(f"{block.id}: {source} has no file: block for {name}")
            out[name] = declared[name].encode()
        elif (ROOT / source).is_dir():
            # A directory of the repository: its files, under NAME (a host's recorded state).
            for path in sorted((ROOT / source).rglob("*")):
                if path.is_file():
                    out[f"{name}/{path.relative_to(ROOT / source)}"] = path.read_bytes()
        else:
            path = ROOT / source
            if not path.is_file():
                raise ValueError(f"{block.id}: {source}: no such file in the repository")
            out[name] = path.read_bytes()
    return out


def rewritten(text: str, paths: dict[str, str], dry_run: bool) -> str:
    for shown, real in sorted(paths.items(), key=lambda kv: -len(kv[0])):
        text = re.sub(rf"(?<![\w./-]){re.escape(shown)}(?=[\s/'\"]|$)", real, text)
    if dry_run and "--dry-run" not in text:
        text = _DRY_RUN.sub(r"\1 --dry-run", text, count=1)
    return text


def changes_the_machine(command: Command) -> bool:
    """A switch, rollback or pin that is not a dry run."""
    return bool(_SUBCOMMANDS_THAT_CHANGE.search(command.text)) and "--dry-run" not in command.text


def run_block(block: Block, setup: Setup, timeout_s: float = 180.0) -> BlockRun:
    scratch = Path(tempfile.mkdtemp(prefix="block-", dir=setup.base))
    scratch.chmod(0o755)
    work = scratch / "work"
    fs = scratch / "fs"
    home = scratch / "home" / "you"
    home.mkdir(parents=True)
    shutil.copytree(ROOT / "examples", work / "examples")
    paths = {SHOWN_VENV: str(setup.venv)}
    files = block_files(block, setup)
    marker = block.marker("files")
    sources = files_of(marker) if marker else {}
    written: list[Path] = []
    for name, data in files.items():
        target = fs / name.lstrip("/") if name.startswith("/") else work / name
        target.parent.mkdir(parents=True, exist_ok=True)
        for parent in target.relative_to(scratch).parents:
            (scratch / parent).chmod(0o755)  # a unit's dynamic user searches its way down
        target.write_bytes(data)
        mode = {"program": 0o755, "key": 0o600}.get(sources.get(name, ""), 0o644)
        target.chmod(mode)
        written.append(target)
        if name.startswith("/"):
            paths[name] = str(target)
    for target in written:
        if target.suffix in (".toml", ".json"):
            # A config names the block's other files by the paths the document shows.
            target.write_text(rewritten(target.read_text(), paths, dry_run=False))
    commands = block.commands()
    out_dir = scratch / "out"
    out_dir.mkdir()
    dry_run = block.marker("dry run") is not None
    script = ["cd " + _quote(str(work))]
    for k, command in enumerate(commands):
        text = rewritten(command.text, paths, dry_run)
        script.append(
            f"{{ {text}\n}} >{out_dir}/{k}.out 2>&1 </dev/null; "
            f"__rc=$?; echo $__rc >{out_dir}/{k}.rc; (exit $__rc)"
        )
    refused = scratch / "refused"
    refused.touch()
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PYTHON", "LLAMANIX_TEST_CRASH", "COLUMNS", "LINES", "NO_COLOR"))
    }
    env.update(
        PATH=f"{setup.shims}:{setup.venv}/bin:{os.environ.get('PATH', '/usr/bin:/bin')}",
        HOME=str(home),
        LLAMANIX_CACHE=str(setup.cache),
        LLAMANIX_DOCS_REFUSED=str(refused),
        COLUMNS=COLUMNS,
        NO_COLOR="1",
        TERM="dumb",
        LC_ALL="C.UTF-8",
    )
    subprocess.run(
        ["bash", "-c", "\n".join(script)], env=env, timeout=timeout_s, check=False, cwd=work
    )
    back = {real: shown for shown, real in paths.items()}
    back[str(fs)] = ""
    back[str(work) + "/"] = ""
    back[str(work)] = "."
    back[str(setup.cache)] = SHOWN_CACHE
    results = []
    for k, command in enumerate(commands):
        rc_file = out_dir / f"{k}.rc"
        rc = int(rc_file.read_text()) if rc_file.exists() else -1
        text = (out_dir / f"{k}.out").read_text(errors="replace") if rc_file.exists() else ""
        for real, shown in sorted(back.items(), key=lambda kv: -len(kv[0])):
            text = text.replace(real, shown)
        lines = [line.rstrip() for line in text.splitlines()]
        while lines and not lines[-1]:
            lines.pop()
        results.append(Result(command, rc, tuple(lines)))
    calls = tuple(line for line in refused.read_text().splitlines() if line)
    shutil.rmtree(scratch, ignore_errors=True)
    return BlockRun(tuple(results), calls)


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def matches(shown: tuple[str, ...], actual: tuple[str, ...]) -> bool:
    """Whether ``actual`` is what ``shown`` says, a line ``...`` standing for any lines."""
    if not shown:
        return not actual
    if shown[0] == "...":
        return any(matches(shown[1:], actual[i:]) for i in range(len(actual) + 1))
    return bool(actual) and shown[0] == actual[0] and matches(shown[1:], actual[1:])


def expected_failure(commands: list[Command], k: int) -> bool:
    """A command may fail when the block's next command shows its exit status."""
    return k + 1 < len(commands) and commands[k + 1].text.strip() == "echo $?"


def problems(block: Block, run: BlockRun) -> list[str]:
    """What is wrong with one block's run: a command that failed, output that differs."""
    out: list[str] = []
    commands = [r.command for r in run.results]
    for call in run.refused:
        out.append(f"{block.id}: ran `{call}`, which this machine does not run for the docs")
    for k, result in enumerate(run.results):
        where = f"{block.doc}:{result.command.line}"
        if result.rc != 0 and not expected_failure(commands, k):
            tail = "\n".join(result.output[-15:])
            out.append(f"{where}: `{result.command.text}` exited {result.rc}:\n{tail}")
        shown = result.command.output
        if shown is not None and not matches(shown, result.output):
            out.append(
                f"{where}: `{result.command.text}` printed something else "
                "(scripts/regen-doc-output writes what it prints):\n"
                + "\n".join(f"  doc: {line}" for line in shown)
                + "\n"
                + "\n".join(f"  now: {line}" for line in result.output)
            )
    return out


def regenerated(block: Block, run: BlockRun) -> list[str] | None:
    """A console block's body with each command's output replaced by what it printed now, or
    None when nothing changes. Outputs with a ``...`` line are left as they are."""
    body = list(block.body)
    changed = False
    for result in reversed(run.results):
        shown = result.command.output
        if shown is None or "..." in shown or shown == result.output:
            continue
        body[result.command.out_start : result.command.out_end] = list(result.output)
        changed = True
    return body if changed else None
