"""`llamanix plan` on the examples and on a config whose models exist."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from llamanix.cli import main
from llamanix.core.gpus import load_gpus
from llamanix.external import systemd_analyze
from llamanix.model.ceiling import decode_ceiling_tok_s, vram_breakdown
from llamanix.model.gguf_info import read_gguf
from llamanix.testbed.synth import SynthSpec, synth_model

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.toml"))
# Recorded `plan --json` output, pins from a made-up flake.lock beside it.
RECORDED = ROOT / "tests" / "data" / "plan"
UPDATE = os.environ.get("LLAMANIX_UPDATE_GOLDEN") == "1"
# A host that says it is NixOS: these tests read what plan shows for one, on any machine.
NIXOS_LOCAL = '[hosts.local]\nkind = "nixos"\n'


def test_the_examples_are_the_ones_the_docs_name() -> None:
    assert [p.name for p in EXAMPLES] == [
        "fleet-rtx5090-rtx3090-gateway.toml",
        "rtx3090-qwen35b-a3b.toml",
        "rtx3090-router-llama-server.toml",
        "rtx3090ti-qwen27b-dflash.toml",
        "rtx3090ti-qwen27b-mtp.toml",
        "rtx5090-qwen27b-draft.toml",
        "rtx5090-router-llama-swap.toml",
    ]


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_examples_plan_cleanly(example: Path) -> None:
    result = CliRunner().invoke(main, ["plan", "--json", str(example)])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    # A fleet example has a host per box, the gateway's without instances; the others one host.
    hosts = [host for host in plan["hosts"].values() if host["instances"]]
    assert len(hosts) == (2 if "fleet" in example.stem else 1)
    text = CliRunner().invoke(main, ["plan", str(example)])
    assert text.exit_code == 0
    for host in hosts:
        rows = host["instances"]
        # A routed example serves several members behind one port; the others
        # serve exactly one instance per host.
        if "router" in example.stem:
            assert set(host["router"]["members"]) == {row["name"] for row in rows}
            assert len(rows) >= 2
        else:
            assert host["router"] is None and len(rows) == 1
        for row in rows:
            assert row["warnings"] == []
            assert row["gpu"] is True
            if systemd_analyze.available():
                assert row["security_exposure"] <= 1.5
            assert row["name"] in text.stdout


def test_plan_reports_vram_fit_and_ceiling(tmp_path: Path) -> None:
    model = synth_model(SynthSpec(), tmp_path / "t.gguf")
    cfg = tmp_path / "llamanix.toml"
    cfg.write_text(
        '[hosts.h]\nkind = "systemd"\ngpu = "rtx3090"\n'
        'binaries = { upstream = "/usr/bin/llama-server" }\n'
        f'[instances.a]\nmodel = "{model}"\ncontext = 2048\n'
        '[instances.a.speculative]\ntype = "draft"\n'
        f'draft_model = "{model}"\n'
    )
    result = CliRunner().invoke(main, ["plan", "--json", "--no-security", str(cfg)])
    assert result.exit_code == 0, result.output
    row = json.loads(result.stdout)["hosts"]["h"]["instances"][0]
    info = read_gguf(model)
    gpu = load_gpus()["rtx3090"]
    assert row["vram"]["fits"] is True
    assert row["vram"]["gpu_memory_bytes"] == 24 * 2**30
    assert row["vram"]["ceiling_tok_s"] == pytest.approx(
        decode_ceiling_tok_s(gpu.bandwidth_gb_s, info.weight_bytes_per_token())
    )
    # The draft's weights and KV cache count too.
    assert row["vram"]["vram_bytes"] > 2 * info.tensor_bytes
    assert row["vram"]["vram_bytes"] == vram_breakdown(info, info, 2048).total
    assert list(row["vram"]) == ["gpu", "vram_bytes", "gpu_memory_bytes", "fits", "ceiling_tok_s"]
    used = row["vram"]["vram_bytes"] / 2**30
    assert row["fit"] == f"fits {used:.1f}/24 GiB, <= {row['vram']['ceiling_tok_s']:.0f} tok/s"


def test_plan_warns_about_a_draft_that_is_never_loaded(tmp_path: Path) -> None:
    cfg = tmp_path / "llamanix.toml"
    cfg.write_text(
        NIXOS_LOCAL + '[instances.a]\nmodel = "/m/t.gguf"\nlisten = "0.0.0.0"\nkeyless = true\n'
        '[instances.a.speculative]\ndraft_model = "/m/d.gguf"\n'
    )
    result = CliRunner().invoke(main, ["plan", "--json", "--no-security", str(cfg)])
    assert result.exit_code == 0, result.output
    warnings = json.loads(result.stdout)["hosts"]["local"]["instances"][0]["warnings"]
    assert warnings == [
        "draft_model set but speculative.type = none: the draft is not loaded",
        "listens on 0.0.0.0 without api_key_file: anyone who can reach it can use it",
    ]


ARCH_MISMATCH = (
    "NVIDIA GeForce RTX 5090 has compute capability 12.0 but host gpu1 builds for 8.6: kernels "
    "are JIT-compiled from PTX on first use (a first prefill of 33 s in one report) or fail "
    'outright (add "12.0" to hosts.gpu1.cuda_archs and rebuild)'
)


@pytest.mark.parametrize(
    ("archs", "gpu_layers", "warned"),
    [
        ('["8.6"]', '"all"', True),
        # The card's capability, plain or arch-specific, is there.
        ('["8.6", "12.0"]', '"all"', False),
        ('["12.0a"]', '"all"', False),
        # An instance on the CPU has no GPU to mismatch.
        ('["8.6"]', "0", False),
    ],
    ids=["left-out", "there", "arch-specific", "cpu"],
)
def test_plan_names_cuda_archs_that_leave_out_the_hosts_gpu(
    tmp_path: Path, archs: str, gpu_layers: str, warned: bool
) -> None:
    """The GPU table's compute capability against the host's cuda_archs, in doctor's words
    (its cuda-arch finding), before anything is built."""
    cfg = tmp_path / "llamanix.toml"
    cfg.write_text(
        f'[hosts.gpu1]\nkind = "nixos"\ngpu = "rtx5090"\ncuda_archs = {archs}\n'
        f'[instances.qwen]\nmodel = "/m/q.gguf"\ngpu_layers = {gpu_layers}\n'
    )
    result = CliRunner().invoke(main, ["plan", "--json", "--no-security", str(cfg)])
    assert result.exit_code == 0, result.output
    [row] = json.loads(result.stdout)["hosts"]["gpu1"]["instances"]
    assert (ARCH_MISMATCH in row["warnings"]) is warned
    text = CliRunner().invoke(main, ["plan", "--no-security", str(cfg)])
    assert (f"  warning: {ARCH_MISMATCH}" in text.stdout.splitlines()) is warned


def test_plan_shows_the_pinned_revision_from_flake_lock(tmp_path: Path) -> None:
    cfg = tmp_path / "llamanix.toml"
    cfg.write_text(NIXOS_LOCAL + '[instances.a]\nmodel = "/m/t.gguf"\nvariant = "ik"\n')
    (tmp_path / "flake.lock").write_text(
        json.dumps(
            {
                "nodes": {
                    "root": {"inputs": {"ik-llama-cpp": "ik"}},
                    "ik": {"locked": {"rev": "8337e4cd3861406fc04e0854b1409cd1b027fbc9"}},
                },
                "root": "root",
                "version": 7,
            }
        )
    )
    result = CliRunner().invoke(main, ["plan", "--json", "--no-security", str(cfg)])
    row = json.loads(result.stdout)["hosts"]["local"]["instances"][0]
    assert row["pinned_revision"] == "8337e4cd3861406fc04e0854b1409cd1b027fbc9"
    text = CliRunner().invoke(main, ["plan", "--no-security", str(cfg)])
    assert "@8337e4c" in text.stdout


@pytest.mark.parametrize(
    "config",
    [
        "examples/rtx3090-router-llama-server.toml",
        "examples/rtx5090-qwen27b-draft.toml",
        "tests/data/configs/two-hosts-defaults.toml",
        "tests/data/configs/fleet-gateway.toml",
        "tests/data/configs/spec-chain.toml",
    ],
    ids=lambda c: Path(c).stem,
)
def test_plan_json_is_what_it_was(config: str) -> None:
    """`plan --json` is read by scripts: its keys, their order and their values stay as recorded
    (a router with its members' rows, their models not readable here; a speculative instance
    with its pin; two hosts, one without a GPU; a gateway with its model group of two replicas
    on two hosts; a speculation chain in full; a readable model's fit is
    test_plan_reports_vram_fit_and_ceiling). A change on purpose rewrites the recording
    (``LLAMANIX_UPDATE_GOLDEN=1``) and its diff is reviewed with the change."""
    done = subprocess.run(
        [
            *(sys.executable, "-m", "llamanix", "plan", "--json", "--no-security"),
            *("--flake", str(RECORDED.relative_to(ROOT)), config),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    recorded = RECORDED / f"{Path(config).stem}.json"
    if UPDATE:
        recorded.write_text(done.stdout)
    assert done.stdout == recorded.read_text()


SANDBOX_CONFIGS = [*EXAMPLES, *sorted((ROOT / "tests" / "data" / "configs").glob("*.toml"))]


@pytest.mark.skipif(not systemd_analyze.available(), reason="systemd-analyze is not installed")
@pytest.mark.parametrize("path", SANDBOX_CONFIGS, ids=[p.stem for p in SANDBOX_CONFIGS])
def test_one_unit_per_sandbox_scores_every_unit(path: Path, tmp_path: Path) -> None:
    """plan scores one unit of each sandbox (units alike but for their names and command
    lines): each unit scored on its own must read what plan gave it."""
    from llamanix.config.model import load_config
    from llamanix.plan.plan import _exposures
    from llamanix.render.host_render import render_host

    config = load_config(path)
    for host in config.hosts:
        if not config.instances_on(host):
            continue
        render = render_host(config, host)
        units = [*render.instances, *([render.router] if render.router else [])]
        alone = tmp_path / host / "alone"
        alone.mkdir(parents=True)
        for rendered in units:
            (alone / rendered.unit).write_text(rendered.unit_text)
        each = systemd_analyze.security_exposures([alone / r.unit for r in units])
        assert len(each) == len(units)
        grouped = tmp_path / host / "grouped"
        grouped.mkdir()
        assert _exposures(render, grouped) == each


def test_plan_shows_a_chain_in_full(tmp_path: Path) -> None:
    cfg = tmp_path / "llamanix.toml"
    cfg.write_text(
        NIXOS_LOCAL + '[instances.a]\nmodel = "/m/t.gguf"\n'
        '[instances.a.speculative]\ntype = ["ngram-mod", "mtp"]\nn_max = 16\n'
    )
    result = CliRunner().invoke(main, ["plan", "--json", "--no-security", str(cfg)])
    assert result.exit_code == 0, result.output
    [row] = json.loads(result.stdout)["hosts"]["local"]["instances"]
    assert row["speculative"] == "ngram-mod n_max=16 then mtp"
    assert row["speculative_types"] == ["ngram-mod", "mtp"]
    text = CliRunner().invoke(main, ["plan", "--no-security", str(cfg)])
    assert "ngram-mod n_max=16 then mtp" in text.stdout


def test_plan_shows_the_gateway_and_its_model_groups() -> None:
    config = str(ROOT / "tests" / "data" / "configs" / "fleet-gateway.toml")
    text = CliRunner().invoke(main, ["plan", "--no-security", config])
    assert text.exit_code == 0, text.output
    assert text.stdout.splitlines()[-2:] == [
        "gateway litellm 1.106.12 on host box3, 0.0.0.0:4000 (simple-shuffle, 8 retries, "
        "health checks every 5 s)",
        "  qwen3-8b: qwen-a on box1 (http://box1.lan:8080/v1), qwen-b on box2 "
        "(http://10.0.0.12:8080/v1)",
    ]
    # The gateway's own host shows it; another host alone does not.
    box3 = CliRunner().invoke(main, ["plan", "--json", "--no-security", "--host", "box3", config])
    assert json.loads(box3.stdout)["gateway"]["host"] == "box3"
    box1 = CliRunner().invoke(main, ["plan", "--json", "--no-security", "--host", "box1", config])
    assert json.loads(box1.stdout)["gateway"] is None
