"""The NixOS side of [metrics]: services.llamanix.prometheus writes the scrape job
render/prometheus.py writes, takes its options from the same schema, is off by default, and the
units derivation's script renders the exporter and the rules beside the instances.

CI evaluates with the stub lib; with LLAMANIX_NIXPKGS_LIB (scripts/nix-real-lib) the real
module is evaluated by nixpkgs' lib.evalModules.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from llamanix.config.model import load_config
from llamanix.core import schema
from llamanix.render.prometheus import scrape_job

ROOT = Path(__file__).resolve().parent.parent
EVAL = ROOT / "tests/nix/prometheus-eval.nix"
REAL_LIB = os.environ.get("LLAMANIX_NIXPKGS_LIB", "")
pytestmark = pytest.mark.skipif(shutil.which("nix-instantiate") is None, reason="needs Nix")
real_lib = pytest.mark.skipif(
    not REAL_LIB, reason="set LLAMANIX_NIXPKGS_LIB to a nixpkgs lib/ directory"
)


def nix_eval(toml: Path, host: str, **argstr: str) -> Any:
    argv = ["nix-instantiate", "--readonly-mode", "--eval", "--strict", "--json", str(EVAL)]
    for name, value in {"toml": str(toml), "host": host, **argstr}.items():
        argv += ["--argstr", name, value]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def write_config(tmp_path: Path, metrics: str) -> Path:
    path = tmp_path / "llamanix.toml"
    path.write_text(
        '[hosts.box]\n[instances.chat]\nmodel = "/srv/models/chat.gguf"\nport = 8080\n'
        f"[metrics]\n{metrics}"
    )
    return path


@pytest.mark.parametrize(
    "metrics",
    [
        "",
        'listen = "0.0.0.0"\nallow_remote = true\nport = 9100\nscrape_interval = 30\n',
        'listen = "::"\nallow_remote = true\nscrape_interval = 5\n',
        'listen = "localhost"\n',
        'listen = "192.168.1.20"\nallow_remote = true\nmin_ceiling_share = 0.5\n',
    ],
    ids=["defaults", "wildcard", "ipv6", "localhost", "address"],
)
def test_the_module_scrape_job_is_the_rendered_one(tmp_path: Path, metrics: str) -> None:
    config = write_config(tmp_path, metrics)
    python = scrape_job(load_config(config))
    found = nix_eval(config, "box", libPath=REAL_LIB) if REAL_LIB else nix_eval(config, "box")
    assert found["scrapeConfigs"] == [python]


def test_toml_metrics_are_the_module_options(tmp_path: Path) -> None:
    config = write_config(tmp_path, "port = 9100\nmin_acceptance_share = 0.5\n")
    found = nix_eval(config, "box")
    expected = load_config(config).metrics
    assert found["metrics"] == {name: getattr(expected, name) for name in schema.METRICS}


@real_lib
def test_the_module_renders_the_exporter_and_rules_when_enabled(tmp_path: Path) -> None:
    config = write_config(tmp_path, "port = 9100\nscrape_interval = 10\n")
    found = nix_eval(config, "box", libPath=REAL_LIB)
    assert set(found["options"]) == {*schema.METRICS, "enable", "openFirewall"}
    assert found["ruleFiles"] == [
        f"{found['unitsPath']}/share/llamanix/prometheus/llamanix.rules.yml"
    ]
    # The JSON `llamanix render` gets holds the [metrics] table, so it renders the exporter.
    expected = load_config(config).metrics
    assert found["config"]["metrics"] == {n: getattr(expected, n) for n in schema.METRICS}
    assert found["exporter"]["wantedBy"] == ["multi-user.target"]
    assert found["exporter"]["overrideStrategy"] == "asDropin"
    assert found["ports"] == []


@real_lib
def test_the_module_leaves_prometheus_alone_by_default(tmp_path: Path) -> None:
    config = write_config(tmp_path, "")
    found = nix_eval(config, "box", libPath=REAL_LIB, enable="false")
    assert found["scrapeConfigs"] is None and found["ruleFiles"] is None
    assert "metrics" not in found["config"]
    assert found["exporter"] is None


def test_render_units_writes_the_exporter_and_rules(tmp_path: Path) -> None:
    """modules/render-units.sh, as the units derivation runs it, on a config with [metrics]."""
    llamanix = shutil.which("llamanix")
    assert llamanix, "the llamanix command is not on PATH (pip install -e .)"
    config = tmp_path / "llamanix.json"
    config.write_text(
        json.dumps(
            {
                "hosts": {"box": {"kind": "nixos"}},
                "instances": {
                    "chat": {
                        "host": "box",
                        "binary": "/nix/store/00000000000000000000000000000000-llama/bin/"
                        "llama-server",
                        "model": "/srv/models/chat.gguf",
                    }
                },
                "metrics": {"port": 9100},
            }
        )
    )
    out = tmp_path / "out"
    path = f"{Path(llamanix).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    proc = subprocess.run(
        ["bash", str(ROOT / "modules/render-units.sh"), str(config), "box", str(out)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PATH": path},
    )
    assert proc.returncode == 0, proc.stderr
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert "lib/systemd/system/llamanix-exporter.service" in files
    assert "share/llamanix/prometheus/llamanix.rules.yml" in files
    assert "share/llamanix/grafana/llamanix-overview.json" in files
    unit = (out / "lib/systemd/system/llamanix-exporter.service").read_text()
    # The config reaches the exporter as a credential: systemd reads it as root.
    assert f"LoadCredential=config.json:{config}\n" in unit
    assert "metrics %d/config.json --host box" in unit
