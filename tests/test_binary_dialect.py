"""A switch asks each binary what it is before it installs anything: a binary that answers as
another project's build than its variant names is refused with the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_run import invoke
from standins import stand_in

from llamanix.core.projects import PROJECTS
from llamanix.core.variants import DIALECTS

HELP = Path(__file__).parent / "data" / "help"

CONFIG = """
[hosts.box]
kind = "systemd"
binaries = {{ upstream = "{upstream}", ik = "{ik}" }}

[instances.chat]
variant = "{variant}"
model = "/srv/models/q.gguf"
port = 8080
"""


def test_every_dialect_names_its_project() -> None:
    assert set(PROJECTS) == set(DIALECTS)


def ik_build(tmp_path: Path) -> Path:
    """An ik_llama.cpp llama-server, which cannot be built here: a stand-in that answers
    --version and --help as the recorded ik build did."""
    answer = tmp_path / "ik.txt"
    answer.write_text(
        (HELP / "ik-8337e4cd.version.txt").read_text() + (HELP / "ik-8337e4cd.help.txt").read_text()
    )
    stand_in(tmp_path / "ik-bin", "llama-server", answer)
    return tmp_path / "ik-bin" / "llama-server"


def switch(cfg: Path, units: Path, *args: str) -> tuple[int, str]:
    result = invoke("switch", str(cfg), "--units-dir", str(units), "--timeout", "5", *args)
    return result.exit_code, result.stderr.strip()


@pytest.mark.server
def test_a_binary_of_another_project_is_refused_before_anything_is_installed(
    tmp_path: Path, llama_server_bin: Path
) -> None:
    ik = ik_build(tmp_path)
    units = tmp_path / "units"
    cfg = tmp_path / "llamanix.toml"
    # The "ik" entry points at the upstream build, the "upstream" one at an ik build.
    cfg.write_text(CONFIG.format(upstream=ik, ik=llama_server_bin, variant="upstream"))
    before = cfg.read_text()
    code, line = switch(cfg, units, "--set", "instances.chat.variant=ik", "--dry-run")
    assert code == 2
    assert line == (
        f"{cfg}: hosts.box.binaries.ik: {llama_server_bin} (version 0.5.0-dev, commit 0c1e570) "
        "answers as a build of ggml-org llama.cpp (its --help speaks the upstream dialect), "
        "but variant ik is ik_llama.cpp (point it at a build of ik_llama.cpp, or set "
        'instances.chat.variant to "nixpkgs" or "upstream" or "mtp")'
    )
    for args in (("--set", "instances.chat.variant=ik"), ()):
        code, line = switch(cfg, units, *args)
        assert code == 2
        assert "answers as a build of" in line and line.count("\n") == 0
    assert "answers as a build of ik_llama.cpp (its --help speaks the ik dialect)" in line
    assert line.startswith(f"{cfg}: hosts.box.binaries.upstream: {ik} ")
    assert cfg.read_text() == before
    assert not units.exists()
    assert not list(tmp_path.glob(".llamanix-state/box/generations/*"))
    # Each binary labelled as what it is: the dry run goes ahead.
    cfg.write_text(CONFIG.format(upstream=llama_server_bin, ik=ik, variant="upstream"))
    for variant in ("upstream", "ik"):
        code, line = switch(cfg, units, "--set", f"instances.chat.variant={variant}", "--dry-run")
        assert code == 0, line


def test_a_binary_that_cannot_answer_is_left_to_the_gate(tmp_path: Path) -> None:
    """Missing, or not a llama-server: the probe has nothing to say, the switch goes on (its
    gate reports why the unit did not start)."""
    stand_in(tmp_path / "bin", "llama-server")  # prints nothing
    cfg = tmp_path / "llamanix.toml"
    cfg.write_text(
        CONFIG.format(
            upstream=tmp_path / "bin" / "llama-server", ik="/nonexistent/ik", variant="upstream"
        )
    )
    for variant in ("upstream", "ik"):
        code, line = switch(
            cfg, tmp_path / "units", "--set", f"instances.chat.variant={variant}", "--dry-run"
        )
        assert code == 0, line
