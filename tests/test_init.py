"""`llamanix init`: a starter config from what this machine has, with stand-in llama-servers
(answering --version and --help as recorded builds did), a stand-in nvidia-smi, and a synthetic
GGUF. It names what it found, validates what it wrote, prints the next command, and never
overwrites a file."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from standins import recorded_argv, stand_in

from llamanix.cli import main
from llamanix.external import machine
from llamanix.external.nvidia import NVIDIA_SMI_ARGV
from llamanix.plan import init_config
from llamanix.render import units
from llamanix.testbed.synth import SynthSpec, synth_model

REPO = Path(__file__).resolve().parent.parent
HELP = REPO / "tests" / "data" / "help"


def _visible_to_anyone(directory: Path) -> bool:
    for part in (directory, *directory.parents):
        if not part.stat().st_mode & stat.S_IXOTH:
            return False
    return not str(directory).startswith(("/tmp", "/var/tmp", "/home", "/root", "/run/user"))


@pytest.fixture
def base() -> Iterator[Path]:
    """A scratch directory a unit could see (models and binaries under /tmp it would not):
    the checkout when it lies in such a place, else /srv, /var/lib or /opt."""
    places = [REPO, Path("/srv"), Path("/var/lib"), Path("/opt")]
    usable = [d for d in places if d.is_dir() and os.access(d, os.W_OK) and _visible_to_anyone(d)]
    if not usable:
        pytest.skip("no directory a unit could see is writable here (checkout, /srv, /var/lib)")
    path = Path(tempfile.mkdtemp(prefix=".llamanix-init-", dir=usable[0]))
    try:
        path.chmod(0o755)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def recorded_build(directory: Path, stem: str) -> Path:
    """A llama-server that answers --version and --help as the recorded build STEM did."""
    answer = directory / f"{stem}.txt"
    answer.write_text(
        (HELP / f"{stem}.version.txt").read_text() + (HELP / f"{stem}.help.txt").read_text()
    )
    stand_in(directory / stem, "llama-server", answer, record=directory / f"{stem}.jsonl")
    binary = directory / stem / "llama-server"
    for part in (directory / stem, binary):
        part.chmod(part.stat().st_mode | 0o755)
    return binary


@pytest.fixture
def here(
    base: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> tuple[Path, Path, Path, Path]:
    """This machine as init sees it: Debian with systemd, an upstream build on PATH, an ik
    build named with --binary, nvidia-smi reporting an RTX 5090, models in a directory."""
    upstream = recorded_build(base, "upstream-0c1e570")
    ik = recorded_build(base, "ik-de55d9e2")
    smi_out = tmp_path / "smi.csv"
    smi_out.write_text("NVIDIA GeForce RTX 5090, 12.0, 32607 MiB\n")
    smi = stand_in(tmp_path / "bin", "nvidia-smi", smi_out)
    monkeypatch.setenv("PATH", f"{upstream.parent}:{tmp_path / 'bin'}:/usr/bin:/bin")
    monkeypatch.setattr(init_config, "SEARCH_GLOBS", ())
    (tmp_path / "systemd").mkdir()
    (tmp_path / "os-release").write_text('PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\n')
    monkeypatch.setattr(machine, "SYSTEMD_RUNTIME", tmp_path / "systemd")
    monkeypatch.setattr(machine, "NIXOS_MARKER", tmp_path / "no-NIXOS")
    monkeypatch.setattr(machine, "OS_RELEASE", (tmp_path / "os-release",))
    # llamanix itself where a unit can run it, whatever this machine's install is.
    command = base / "opt" / "bin" / "llamanix"
    command.parent.mkdir(parents=True)
    command.write_text("#!/bin/sh\n")
    command.chmod(0o755)
    monkeypatch.setattr(units, "llamanix_paths", lambda: [str(command)])
    monkeypatch.setattr(init_config, "llamanix_command", lambda: "/opt/llamanix/bin/llamanix")
    models = base / "models"
    models.mkdir()
    synth_model(SynthSpec(), models / "tiny.gguf")
    (models / "tiny.gguf").chmod(0o644)
    (models / "tiny-mmproj.gguf").write_bytes(b"GGUF")  # a projector: not a model of its own
    return ik, models, smi, base


def test_init_writes_a_config_that_validates(
    here: tuple[Path, Path, Path, Path], tmp_path: Path
) -> None:
    ik, models, smi, base = here
    upstream = base / "upstream-0c1e570" / "llama-server"
    out = base / "llamanix.toml"
    args = ["init", str(out), "--models", str(models), "--binary", str(ik), "--host", "box"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        f"init: wrote {out}: host box (systemd), instance chat; 2 llama-server(s), 1 model(s), "
        "1 GPU(s) found",
        f"init: {out}: ok (validate)",
        f"next: sudo /opt/llamanix/bin/llamanix switch {out} --dry-run (then without --dry-run)",
    ]
    assert recorded_argv(smi) == list(NVIDIA_SMI_ARGV)
    text = out.read_text()
    assert text == (
        "# llamanix.toml, written by `llamanix init` from what this machine has. Edit it, then\n"
        "# check it: llamanix validate FILE; see what it would run: llamanix plan FILE.\n"
        "\n"
        "[hosts.box]\n"
        "# Debian GNU/Linux 12 (bookworm), systemd runs it (/run/systemd/system)\n"
        'kind = "systemd"\n'
        'gpu = "rtx5090"  # NVIDIA GeForce RTX 5090, from nvidia-smi\n'
        'cuda_archs = ["12.0"]  # its compute capability\n'
        # The recorded ik build says "version: 0 (unknown)": a local build without git.
        f"# {ik}: ik: version 0, commit ?, ik dialect\n"
        f"# {upstream}: upstream: version 0.5.0-dev, commit 0c1e570, upstream dialect\n"
        f'binaries = {{ ik = "{ik}", upstream = "{upstream}" }}\n'
        "\n"
        "[instances.chat]\n"
        'host = "box"\n'
        'variant = "ik"\n'
        f'model = "{models / "tiny.gguf"}"\n'
        "port = 8080\n"
        "context = 8192  # the model's own may be larger: plan shows VRAM\n"
        'gpu_layers = "all"\n'
    )
    # What it wrote is what validate, plan and a dry switch read.
    assert CliRunner().invoke(main, ["validate", str(out)]).exit_code == 0
    assert tomllib.loads(text)["hosts"]["box"]["binaries"] == {
        "ik": str(ik),
        "upstream": str(upstream),
    }
    # Never over a file: the second run refuses, and the file is as it was.
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 2
    assert again.stderr.strip() == (
        f"{out}: exists already, and init never overwrites a file (name another file, e.g. "
        "llamanix init new.toml, or move this one away)"
    )
    assert out.read_text() == text


def test_init_names_what_does_not_validate_and_writes_it_once(
    here: tuple[Path, Path, Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model where the unit cannot read it: the config is written (a starter to edit), and
    the problem is named with its fix; exit 1, and the next command is validate."""
    _, models, _, base = here
    hidden = tmp_path / "models"
    shutil.copytree(models, hidden)
    out = base / "starter.toml"
    result = CliRunner().invoke(main, ["init", str(out), "--models", str(hidden), "--host", "box"])
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith(f"{out}: instances.chat.model: {hidden / 'tiny.gguf'} is under /tmp")
    assert lines[-1] == (
        f"init: {out} does not validate yet (1 problem(s) above); fix them, then: "
        f"/opt/llamanix/bin/llamanix validate {out}"
    )
    assert 'variant = "upstream"' in out.read_text()


def test_init_without_anything_found_still_says_what_to_fill_in(
    base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(init_config, "SEARCH_GLOBS", ())
    monkeypatch.setattr(machine, "NIXOS_MARKER", tmp_path / "no-NIXOS")
    monkeypatch.setattr(machine, "SYSTEMD_RUNTIME", tmp_path / "no-systemd")
    out = tmp_path / "llamanix.toml"
    result = CliRunner().invoke(main, ["init", str(out), "--host", "box"])
    assert result.exit_code == 1  # no binary for the variant: validate names it
    text = out.read_text()
    assert "# no llama-server found on PATH or in /usr/local/bin, /opt" in text
    assert "# no GGUF file found (no --models DIR given): name yours" in text
    assert "without systemd: run the instances with `llamanix up`" in text
    assert "binaries = {  }" in text
    assert "hosts.box.binaries is empty" in result.stderr


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--models", "/nonexistent"], "llamanix init: --models: /nonexistent is not a directory"),
        (
            ["--binary", "/nonexistent"],
            "llamanix init: --binary: /nonexistent is not an executable",
        ),
    ],
)
def test_init_refuses_what_it_cannot_look_at(tmp_path: Path, args: list[str], line: str) -> None:
    out = tmp_path / "llamanix.toml"
    result = CliRunner().invoke(main, ["init", str(out), *args])
    assert result.exit_code == 2
    assert result.stderr.startswith(line)
    assert not out.exists()


def test_a_real_nvidia_smi_answer_names_the_card_of_the_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What nvidia-smi printed on an H200 machine (2026-11-28, the exact query init sends):
    the table's h200, its compute capability for cuda_archs."""
    record = stand_in(tmp_path, "nvidia-smi", REPO / "tests" / "data" / "nvidia-smi-h200.csv")
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    assert init_config.find_gpus() == [init_config.FoundGpu("NVIDIA H200", "9.0", "h200")]
    assert recorded_argv(record) == list(NVIDIA_SMI_ARGV)
