"""The flag-drift report (config/drift.py) on real pairs of recorded --help texts: nixpkgs' b8770
against upstream 0c1e570 (the move a b8770 user with a draft model needs), ik's pinned de55d9e2
against 8337e4cd, and BeeLlama v0.3 against the derived after-v0.3 text (NOT a recording, see
recorded_help.py); then through `plan --previous --capabilities` and `pin --dry-run`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from cli_run import invoke
from recorded_help import B8770, BEE03, IK_NEW, IK_PIN, UPSTREAM, bee_after_v03, recorded
from recorded_help import write_probe as write_caps
from standins import recorded as recorded_calls
from standins import stand_in

from llamanix.config.drift import FieldDrift, drift_report
from llamanix.config.model import Config, load_config

ROOT = Path(__file__).resolve().parent.parent
DRAFT_EXAMPLE = ROOT / "examples" / "rtx5090-qwen27b-draft.toml"
DRAFT = "/var/lib/llama-models/Qwen3-1.7B-Q4_K_M.gguf"

BEE_CONFIG = """\
[hosts.box]
kind = "systemd"
gpu = "rtx3090ti"

[instances.coder]
variant = "beellama"
binary = "/opt/beellama.cpp/build/bin/llama-server"
model = "/srv/models/Qwen3.6-27B-Q4_K_M.gguf"
context = 131072
gpu_layers = "all"
cache_type_k = "q8_0"
cache_type_v = "turbo3"
parallel = 1

[instances.coder.speculative]
type = "dflash"
draft_model = "/srv/models/Qwen3.6-27B-DFlash-drafter.gguf"
draft_ctx_size = 4096
n_max = 12

[instances.plain]
variant = "beellama"
binary = "/opt/beellama.cpp/build/bin/llama-server"
model = "/srv/models/Qwen3.6-27B-Q4_K_M.gguf"
port = 8081
parallel = 1

[instances.plain.speculative]
type = "dflash"
draft_model = "/srv/models/Qwen3.6-27B-DFlash-drafter.gguf"
"""


def rows(fields: tuple[FieldDrift, ...]) -> list[tuple[str, str, str, str]]:
    return [(f.field, f.change, " ".join(f.old), " ".join(f.new)) for f in fields]


def test_b8770_to_upstream_respells_the_draft_and_adds_the_type() -> None:
    report = drift_report(load_config(DRAFT_EXAMPLE), recorded(B8770), recorded(UPSTREAM))
    [inst] = report.instances
    assert inst.warning is None
    assert rows(inst.fields) == [
        ("speculative.draft_model", "respelled", f"-md {DRAFT}", f"--spec-draft-model {DRAFT}"),
        ("speculative.draft_gpu_layers", "respelled", "-ngld all", "--spec-draft-ngl all"),
        ("speculative.n_max", "respelled", "--draft-max 12", "--spec-draft-n-max 12"),
        ("speculative.n_min", "respelled", "--draft-min 3", "--spec-draft-n-min 3"),
        ("speculative.p_min", "respelled", "--draft-p-min 0.6", "--spec-draft-p-min 0.6"),
        # Without it the new build loads the draft and never drafts.
        ("speculative.type", "now rendered", "", "--spec-type draft-simple"),
    ]
    assert report.refused == ()
    assert report.lines()[0] == (
        "flag drift from recorded:b8770-f49e917 (version 1, commit ?) to "
        "recorded:upstream-0c1e570 (version 0.5.0-dev, commit 0c1e570):"
    )
    assert report.lines()[-1] == (
        "  qwen27b.speculative.type: now rendered: - -> --spec-type draft-simple "
        "(none: the new build needs it)"
    )


def test_b8770_to_upstream_a_chain_becomes_possible() -> None:
    config = load_config(ROOT / "tests/data/configs/spec-chain.toml")
    report = drift_report(config, recorded(B8770), recorded(UPSTREAM))
    [field] = report.instances[0].fields
    assert (field.field, field.change, field.new) == (
        "speculative.type",
        "now accepted",
        ("--spec-type", "draft-simple,ngram-mod"),
    )
    assert field.message.startswith("the old build refused it: ")
    assert "takes one speculative type, not a chain (draft, ngram-mod)" in field.message


@pytest.mark.parametrize(
    "config",
    [
        *sorted((ROOT / "tests/data/configs").glob("*.toml")),
        *sorted((ROOT / "examples").glob("*.toml")),
    ],
    ids=lambda p: p.stem,
)
def test_ik_pin_to_8337e4cd_changes_no_flag_of_any_config(config: Path) -> None:
    """The two ik recordings differ in options none of our configs use (--spec-ckpt-mode,
    -ctx-ckpt short forms): a drift report must not invent changes."""
    report = drift_report(load_config(config), recorded(IK_PIN), recorded(IK_NEW))
    assert [f for i in report.instances for f in i.fields] == []


def test_beellama_v03_to_after_v03_refuses_turbo_and_the_draft_context(tmp_path: Path) -> None:
    config = parse_config_text(tmp_path, BEE_CONFIG)
    report = drift_report(config, recorded(BEE03), bee_after_v03())
    coder, plain = report.instances
    assert rows(coder.fields) == [
        ("cache_type_v", "refused", "-ctv turbo3", ""),
        ("speculative.draft_ctx_size", "refused", "--spec-draft-ctx-size 4096", ""),
    ]
    turbo, ctx = coder.fields
    assert "cache type 'turbo3' is not known to the beellama variant's build" in turbo.message
    assert turbo.fix.startswith("choose one of: ") and "kvarn3" in turbo.fix
    assert ctx.fix == "remove it"
    assert rows(plain.fields) == [
        ("speculative.type", "respelled", "--spec-type dflash", "--spec-type draft-dflash")
    ]
    assert plain.warning is not None
    assert "is a beellama build llamanix has no recording of" in plain.warning
    assert [f.instance for f in report.refused] == ["coder", "coder"]


def parse_config_text(tmp_path: Path, text: str) -> Config:
    path = tmp_path / "llamanix.toml"
    path.write_text(text)
    return load_config(path)


# --- through the CLI --------------------------------------------------------------------------


@pytest.fixture
def probes(tmp_path: Path) -> dict[str, Path]:
    return {
        "b8770": write_caps(recorded(B8770), tmp_path / "b8770.json"),
        "upstream": write_caps(recorded(UPSTREAM), tmp_path / "upstream.json"),
        "bee03": write_caps(recorded(BEE03), tmp_path / "bee03.json"),
        "bee-after": write_caps(bee_after_v03(), tmp_path / "bee-after.json"),
    }


@pytest.fixture
def recorder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """nix cannot run here: a stand-in records what pin would have run."""
    bin_dir = tmp_path / "standins"
    record = tmp_path / "record.jsonl"
    stand_in(bin_dir, "nix", record=record)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return record


run = invoke


def test_plan_json_lists_the_drift(probes: dict[str, Path]) -> None:
    result = run(
        "plan",
        str(DRAFT_EXAMPLE),
        "--no-security",
        "--json",
        "--previous",
        str(probes["b8770"]),
        "--capabilities",
        str(probes["upstream"]),
    )
    assert result.exit_code == 0, result.output
    [row] = json.loads(result.stdout)["hosts"]["gpu1"]["instances"]
    assert [(d["field"], d["change"]) for d in row["drift"]][-1] == (
        "speculative.type",
        "now rendered",
    )
    assert row["drift"][0] == {
        "instance": "qwen27b",
        "field": "speculative.draft_model",
        "change": "respelled",
        "old": ["-md", DRAFT],
        "new": ["--spec-draft-model", DRAFT],
        "message": "",
        "fix": "none: llamanix renders the new spelling",
        "line": f"qwen27b.speculative.draft_model: respelled: -md {DRAFT} -> "
        f"--spec-draft-model {DRAFT} (none: llamanix renders the new spelling)",
    }
    without = run("plan", str(DRAFT_EXAMPLE), "--no-security", "--json")
    assert json.loads(without.stdout)["hosts"]["gpu1"]["instances"][0]["drift"] is None


def test_plan_text_prints_the_drift_lines(probes: dict[str, Path]) -> None:
    result = run(
        "plan",
        str(DRAFT_EXAMPLE),
        "--no-security",
        "--previous",
        str(probes["b8770"]),
        "--capabilities",
        str(probes["upstream"]),
    )
    assert result.exit_code == 0, result.output
    assert "  drift from --previous: 6 field(s)\n" in result.stdout
    assert "    qwen27b.speculative.n_max: respelled: --draft-max 12 -> --spec-draft-n-max 12" in (
        result.stdout
    )


def test_plan_refusal_names_the_flag_it_has_now(tmp_path: Path, probes: dict[str, Path]) -> None:
    config = tmp_path / "llamanix.toml"
    config.write_text(BEE_CONFIG)
    result = run(
        "plan",
        str(config),
        "--no-security",
        "--previous",
        str(probes["bee03"]),
        "--capabilities",
        str(probes["bee-after"]),
    )
    assert result.exit_code == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2 and "Traceback" not in result.output
    assert lines[0].startswith(
        f"{config}: instances.coder.cache_type_v: the build of --capabilities refuses it "
        "(now: -ctv turbo3): cache type 'turbo3' is not known to"
    )
    assert lines[1] == (
        f"{config}: instances.coder.speculative.draft_ctx_size: the build of --capabilities "
        "refuses it (now: --spec-draft-ctx-size 4096): 'dflash' on the beellama variant's build "
        f"{probes['bee-after']} (version 0, commit ?) takes no draft_ctx_size (remove it)"
    )


def test_pin_dry_run_prints_the_drift_and_fails_on_a_refusal(
    tmp_path: Path, probes: dict[str, Path], recorder: Path
) -> None:
    (tmp_path / "flake.nix").write_text("{ }\n")
    config = tmp_path / "llamanix.toml"
    config.write_text(BEE_CONFIG)
    args = ["variant", "pin", str(config), "beellama", "--latest", "--flake", str(tmp_path)]
    args += ["--previous", str(probes["bee03"]), "--capabilities", str(probes["bee-after"])]
    dry = run(*args, "--dry-run")
    assert dry.exit_code == 1, dry.output
    lines = dry.stdout.splitlines()
    assert lines[0].startswith("flag drift from ")
    assert lines[1].startswith("  coder.cache_type_v: refused: -ctv turbo3 -> -: ")
    assert lines[2].startswith("  coder.speculative.draft_ctx_size: refused: ")
    assert lines[3].startswith("  plain: warning: ")
    assert lines[4] == (
        "  plain.speculative.type: respelled: --spec-type dflash -> --spec-type draft-dflash "
        "(none: llamanix renders the new spelling)"
    )
    assert lines[5] == f"(cd {tmp_path} && nix flake update beellama-cpp)"
    assert recorded_calls(recorder) == []
    # Without --dry-run the pin does not move.
    real = run(*args)
    assert real.exit_code == 1
    assert real.stderr.strip().splitlines() == [
        "llamanix variant pin: not moved: the new build refuses 2 field(s) of the config (above); "
        "fix them first, or pin without --capabilities"
    ]
    assert recorded_calls(recorder) == []


def test_pin_moves_when_nothing_is_refused(
    tmp_path: Path, probes: dict[str, Path], recorder: Path
) -> None:
    (tmp_path / "flake.nix").write_text("{ }\n")
    result = run(
        "variant",
        "pin",
        str(ROOT / "tests/data/configs/two-hosts-defaults.toml"),
        "nixpkgs",
        "--latest",
        "--flake",
        str(tmp_path),
        "--previous",
        str(probes["b8770"]),
        "--capabilities",
        str(probes["upstream"]),
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("flag drift from ")
    assert recorded_calls(recorder) == [
        {"argv": ["nix", "flake", "update", "nixpkgs"], "cwd": str(tmp_path)}
    ]


def test_pin_dry_run_without_probes_says_how_to_make_them(tmp_path: Path, recorder: Path) -> None:
    (tmp_path / "flake.nix").write_text("{ }\n")
    config = str(tmp_path / "llamanix.toml")
    result = run(
        "variant", "pin", config, "beellama", "--latest", "--dry-run", "--flake", str(tmp_path)
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        f"(cd {tmp_path} && nix flake update beellama-cpp)",
        "to list the flags this move changes for your config, probe both builds:",
        "  nix build '.#llama-cpp-beellama' --override-input beellama-cpp "
        "github:Anbeeld/beellama.cpp --no-write-lock-file -o new-beellama",
        "  llamanix variant probe new-beellama/bin/llama-server --json > new.json",
        "  llamanix variant probe BINARY-YOU-RUN-NOW --json > old.json",
        "  llamanix variant pin CONFIG beellama --latest --dry-run --previous old.json "
        "--capabilities new.json",
    ]
    assert recorded_calls(recorder) == []


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (
            ["--previous", "{bee03}"],
            "llamanix variant pin: --capabilities: the drift report needs --previous and "
            "--capabilities together (probe the build you run now (--previous) and the new one "
            "(--capabilities))",
        ),
        (
            ["--previous", "{bee03}", "--capabilities", "{bee03}"],
            "{config}: instances: no instance runs variant ik, so moving its pin changes no flag "
            "here (pin a variant your instances use (beellama))",
        ),
    ],
)
def test_pin_drift_refusals_are_one_line(
    tmp_path: Path, probes: dict[str, Path], extra: list[str], expected: str
) -> None:
    (tmp_path / "flake.nix").write_text("{ }\n")
    config = tmp_path / "llamanix.toml"
    config.write_text(BEE_CONFIG)
    subst = {"{bee03}": str(probes["bee03"]), "{config}": str(config)}
    args = [subst.get(a, a) for a in extra]
    result = run(
        "variant",
        "pin",
        str(config),
        "ik",
        "--latest",
        "--dry-run",
        "--flake",
        str(tmp_path),
        *args,
    )
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.strip().splitlines() == [expected.replace("{config}", str(config))]
