"""The flake's instancesFromToml reads llamanix.toml the way the Python config does."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from llamanix.config.model import load_config

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(shutil.which("nix-instantiate") is None, reason="needs Nix")


def instances_from_toml(path: Path, host: str) -> dict[str, dict[str, object]]:
    expr = f'(import {ROOT / "nix/lib.nix"}).instancesFromToml {path} "{host}"'
    out = subprocess.run(
        ["nix-instantiate", "--eval", "--strict", "--json", "-E", expr],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    result: dict[str, dict[str, object]] = json.loads(out)
    return result


def test_defaults_merge_and_host_filter(tmp_path: Path) -> None:
    cfg = tmp_path / "llamanix.toml"
    cfg.write_text(
        '[defaults]\nflash_attn = "on"\ncontext = 4096\n[defaults.speculative]\nn_max = 8\n'
        "[hosts.gpu1]\n[hosts.gpu2]\n"
        '[instances.a]\nhost = "gpu1"\nmodel = "/m/a.gguf"\ncontext = 8192\n'
        '[instances.a.speculative]\ntype = "mtp"\n'
        '[instances.b]\nhost = "gpu2"\nmodel = "/m/b.gguf"\n'
    )
    assert instances_from_toml(cfg, "gpu1") == {
        "a": {
            "flash_attn": "on",
            "context": 8192,
            "model": "/m/a.gguf",
            "speculative": {"type": "mtp", "n_max": 8},
        },
    }
    python = load_config(cfg).instances["a"]
    assert (python.context, python.flash_attn, python.speculative.n_max) == (8192, "on", 8)


@pytest.mark.parametrize(
    "example", sorted((ROOT / "examples").glob("*.toml")), ids=lambda p: p.stem
)
def test_examples_keep_every_instance_key(example: Path) -> None:
    cfg = load_config(example)
    hosts = [host for host in cfg.hosts if cfg.instances_on(host)]
    nix = {host: instances_from_toml(example, host) for host in hosts}
    assert sorted(name for per_host in nix.values() for name in per_host) == sorted(cfg.instances)
    for host, per_host in nix.items():
        assert sorted(per_host) == sorted(inst.name for inst in cfg.instances_on(host))
        for name, inst in per_host.items():
            assert inst["model"] == cfg.instances[name].model
            assert "host" not in inst and "binary" not in inst


def test_a_byte_order_mark_reads_the_same_in_both(tmp_path: Path) -> None:
    cfg = tmp_path / "llamanix.toml"
    cfg.write_bytes(
        b'\xef\xbb\xbf[hosts.gpu1]\n[instances.a]\nmodel = "/m/a.gguf"\ncontext = 4096\n'
    )
    nix = instances_from_toml(cfg, "gpu1")
    assert nix == {"a": {"model": "/m/a.gguf", "context": 4096, "speculative": {}}}
    python = load_config(cfg).instances["a"]
    assert (python.model, python.context) == ("/m/a.gguf", 4096)
