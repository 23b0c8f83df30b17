"""Existing configs render byte-identically: every example and every test config, as units and as
argv for every variant and every recorded --help.

The golden files under tests/data/golden/ were written before the speculative chains, the drafter
flags and BeeLlama v0.4's detection were added; a change to the renderer that alters any of them
fails here. Where a binary's probe legitimately changes a spelling, the golden file is rewritten
on purpose (``LLAMANIX_UPDATE_GOLDEN=1 pytest tests/test_golden_render.py``) and the diff is
reviewed with the change.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from llamanix.config.argv import instance_argv
from llamanix.config.model import Config, load_config
from llamanix.core.errors import UserError
from llamanix.core.probe import Capabilities, parse_capabilities
from llamanix.core.variants import VARIANTS
from llamanix.render import units
from llamanix.render.units import render_host

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "data" / "golden"
HELP = ROOT / "tests" / "data" / "help"
CONFIGS = sorted([*ROOT.glob("examples/*.toml"), *ROOT.glob("tests/data/configs/*.toml")])
UPDATE = os.environ.get("LLAMANIX_UPDATE_GOLDEN") == "1"
# Where llamanix is installed decides ProtectHome= (read-only when it is under /root or /home),
# so the units are rendered as if it were installed where docs/debian.md puts it, not wherever
# the tests happen to run from (a venv in a checkout, pyenv under /root).
LLAMANIX = "/opt/llamanix/bin/llamanix"


def _recordings() -> dict[str, Capabilities]:
    out = {}
    for help_file in sorted(HELP.glob("*.help.txt")):
        stem = help_file.name.removesuffix(".help.txt")
        version = (HELP / f"{stem}.version.txt").read_text()
        out[stem] = parse_capabilities("llama-server", version, help_file.read_text())
    return out


def _load(path: Path) -> Config:
    # The source is part of messages: make it the same wherever the checkout lives.
    return replace(load_config(path), source=str(path.relative_to(ROOT)))


def _outcome(cfg: Config, name: str, variant: str, caps: Capabilities | None) -> object:
    try:
        return instance_argv(cfg, name, variant, caps)
    except UserError as err:
        return {"refused": [str(p) for p in err.problems]}


def _every_variant_installed(cfg: Config) -> Config:
    """The config with a binary for every variant on each host that runs the ones it names
    (a host without one for a variant refuses it, tests/test_refusals.py): the matrix is about
    each variant's spelling."""
    hosts = {
        name: replace(
            host,
            binaries={v: f"/opt/{v}/bin/llama-server" for v in VARIANTS} | host.binaries,
        )
        if host.kind != "nixos"
        else host
        for name, host in cfg.hosts.items()
    }
    return replace(cfg, hosts=hosts)


def _matrix(cfg: Config) -> dict[str, object]:
    cfg = _every_variant_installed(cfg)
    recordings = _recordings()
    out: dict[str, object] = {}
    for name in cfg.instances:
        for variant in VARIANTS:
            out[f"{name} {variant}"] = _outcome(cfg, name, variant, None)
            for stem, caps in recordings.items():
                out[f"{name} {variant} {stem}"] = _outcome(cfg, name, variant, caps)
    return out


def _check(path: Path, text: str) -> None:
    text = text.replace(LLAMANIX, "@llamanix@")
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    assert path.exists(), f"{path} missing: LLAMANIX_UPDATE_GOLDEN=1 writes it"
    assert text == path.read_text(), f"{path.relative_to(ROOT)} differs from the render"


@pytest.mark.parametrize("config", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_units_render_as_recorded(config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(units, "llamanix_command", lambda: [LLAMANIX])
    cfg = _load(config)
    # A host that runs only the gateway renders its unit alone.
    gateway = cfg.gateway.host if cfg.gateway else None
    hosts = [h for h in cfg.hosts if cfg.instances_on(h) or h == gateway]
    assert hosts
    for host in hosts:
        files = render_host(cfg, host).files()
        for name, text in files.items():
            _check(GOLDEN / config.stem / host / name, text)
        if not UPDATE:
            recorded = {p.name for p in (GOLDEN / config.stem / host).iterdir()}
            assert recorded == set(files)


@pytest.mark.parametrize("config", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_argv_for_every_variant_and_recorded_help(config: Path) -> None:
    matrix = _matrix(_load(config))
    assert matrix
    _check(GOLDEN / config.stem / "argv-matrix.json", json.dumps(matrix, indent=1) + "\n")
