"""The dialect comes from the binary: a probe's --help decides how flags are spelled, BeeLlama
(DFlash, TurboQuant) is a variant of its own, and the nixpkgs variant follows what nixpkgs ships.

Detection is checked on the live upstream build (the test bed's server) and on help texts
recorded from local CPU builds of b8770's era, ik_llama.cpp and BeeLlama (tests/data/README.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cli_run import run_llamanix

from llamanix.config.argv import dialect_warning, instance_argv
from llamanix.config.model import parse_config
from llamanix.core.errors import UserError
from llamanix.core.probe import Capabilities, parse_capabilities
from llamanix.core.variants import VARIANTS, detect_dialect
from llamanix.external.llama_server import probe_binary

HELP = Path(__file__).parent / "data" / "help"


def recorded(name: str) -> Capabilities:
    return parse_capabilities(
        f"recorded:{name}",
        (HELP / f"{name}.version.txt").read_text(),
        (HELP / f"{name}.help.txt").read_text(),
    )


RECORDED = {"b8770": "b8770-f49e917", "ik": "ik-8337e4cd", "beellama": "beellama-ba1fdce"}


@pytest.fixture(scope="module")
def live(llama_server_bin: Path) -> Capabilities:
    return probe_binary(llama_server_bin)


def test_live_upstream_is_detected(live: Capabilities) -> None:
    assert live.dialect == "upstream"
    assert detect_dialect(live) is VARIANTS["upstream"].dialect


@pytest.mark.parametrize(("dialect", "name"), sorted(RECORDED.items()))
def test_recorded_help_texts_are_detected(dialect: str, name: str) -> None:
    caps = recorded(name)
    assert caps.dialect == dialect
    detected = detect_dialect(caps)
    assert detected is not None and detected.name == dialect


def test_the_markers_each_dialect_is_told_by() -> None:
    bee, ik, old = (
        recorded(RECORDED["beellama"]),
        recorded(RECORDED["ik"]),
        recorded(RECORDED["b8770"]),
    )
    assert {"turbo2", "turbo3", "turbo4", "turbo2_tcq", "turbo3_tcq"} <= set(bee.cache_types)
    assert {"dflash", "copyspec", "suffix", "recycle"} <= set(bee.spec_types)
    assert "--spec-dflash-max-slots" in bee.flags and "--spec-draft-ctx-size" in bee.flags
    assert {"draft", "dflash", "mtp"} <= set(ik.spec_types)  # read from its prose, not the hint
    assert "--draft-max" in old.flags and "draft-simple" not in old.spec_types


def config(variant: str, spec: dict[str, Any], **inst: Any) -> Any:
    return parse_config(
        {
            "instances": {
                "a": {
                    "model": "/m/t.gguf",
                    "variant": variant,
                    "speculative": spec,
                    **inst,
                }
            }
        },
        "t.toml",
    )


DRAFT = {"type": "draft", "draft_model": "/m/d.gguf", "n_max": 8, "p_min": 0.5}


def test_nixpkgs_follows_the_probe_of_a_post_refactor_build(live: Capabilities) -> None:
    cfg = config("nixpkgs", DRAFT)
    argv = instance_argv(cfg, "a", "nixpkgs", live)
    assert "--draft-max" not in argv
    assert argv[argv.index("--spec-type") + 1] == "draft-simple"
    assert argv[argv.index("--spec-draft-n-max") + 1] == "8"
    warning = dialect_warning(cfg, "a", "nixpkgs", live)
    assert warning is not None and warning.startswith(
        "variant nixpkgs declares the b8770 dialect, but "
    )
    assert warning.endswith("speaks upstream: spelling its flags for upstream")


def test_nixpkgs_with_a_b8770_binary_keeps_draft_max() -> None:
    cfg = config("nixpkgs", DRAFT)
    old = recorded(RECORDED["b8770"])
    argv = instance_argv(cfg, "a", "nixpkgs", old)
    assert argv[argv.index("--draft-max") + 1] == "8"
    assert "--spec-type" not in argv  # -md alone drafts there
    assert dialect_warning(cfg, "a", "nixpkgs", old) is None
    # Without a probe the declared dialect applies, as before.
    assert "--draft-max" in instance_argv(cfg, "a", "nixpkgs")


def test_the_cli_renders_for_the_probe_and_warns(tmp_path: Path, live: Capabilities) -> None:
    toml = tmp_path / "c.toml"
    toml.write_text(
        '[instances.a]\nvariant = "nixpkgs"\nmodel = "/m/t.gguf"\n'
        '[instances.a.speculative]\ntype = "draft"\ndraft_model = "/m/d.gguf"\nn_max = 8\n'
    )
    probe = tmp_path / "probe.json"
    probe.write_text(json.dumps(live.to_json()))
    proc = run_llamanix(
        *("plan", str(toml), "a", "--argv"),
        *("--variant", "nixpkgs", "--capabilities", str(probe)),
        timeout=None,
    )
    assert proc.returncode == 0, proc.stderr
    argv = json.loads(proc.stdout)
    assert "--draft-max" not in argv and "draft-simple" in argv
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("warning: variant nixpkgs declares the b8770 dialect")


# --- BeeLlama ------------------------------------------------------------------------------

SEED_004 = {
    "type": "dflash",
    "draft_model": "/m/drafter.gguf",
    "n_max": 12,
    "draft_ctx_size": 256,
    "dflash_max_slots": 1,
    "dflash_cross_ctx": 512,
}


def test_dflash_knobs_render_on_beellama() -> None:
    cfg = config("beellama", SEED_004, parallel=1, cache_type_k="turbo3", cache_type_v="turbo3")
    argv = instance_argv(cfg, "a")
    assert argv[argv.index("--spec-type") :] == [
        "--spec-type",
        "dflash",
        "--spec-draft-n-max",
        "12",
        "--spec-draft-ctx-size",
        "256",
        "--spec-dflash-max-slots",
        "1",
        "--spec-dflash-cross-ctx",
        "512",
    ]
    assert argv[argv.index("-ctk") + 1] == "turbo3" and argv[argv.index("-ctv") + 1] == "turbo3"
    assert argv[argv.index("--spec-draft-model") + 1] == "/m/drafter.gguf"
    # Spelled the same when the recorded BeeLlama probe checks every flag.
    assert instance_argv(cfg, "a", None, recorded(RECORDED["beellama"])) == argv


def one_problem(data: dict[str, Any]) -> Any:
    with pytest.raises(UserError) as err:
        parse_config({"instances": {"a": data}}, "t.toml")
    [problem] = err.value.problems
    assert "Traceback" not in str(problem)
    return problem


def test_dflash_without_a_drafter_is_refused() -> None:
    p = one_problem(
        {"model": "/m/t.gguf", "variant": "beellama", "speculative": {"type": "dflash"}}
    )
    assert (p.field, p.message) == (
        "instances.a.speculative.draft_model",
        "type 'dflash' needs a draft model",
    )


@pytest.mark.parametrize("variant", ["upstream", "nixpkgs", "ik", "mtp"])
@pytest.mark.parametrize("cache", ["turbo3", "turbo2_tcq"])
def test_turbo_caches_are_refused_on_other_variants(variant: str, cache: str) -> None:
    p = one_problem({"model": "/m/t.gguf", "variant": variant, "cache_type_k": cache})
    assert p.field == "instances.a.cache_type_k"
    assert p.message == f"cache type '{cache}' is not known to the {variant} variant"


@pytest.mark.parametrize("knob", ["dflash_max_slots", "dflash_cross_ctx", "draft_ctx_size"])
def test_dflash_only_knobs_are_refused_elsewhere(knob: str) -> None:
    spec = {"type": "draft", "draft_model": "/m/d.gguf", knob: 2}
    p = one_problem({"model": "/m/t.gguf", "variant": "upstream", "speculative": spec})
    assert p.field == f"instances.a.speculative.{knob}"
    assert p.message == f"'draft' on the upstream variant takes no {knob}"


def test_dflash_with_more_slots_than_its_state_is_refused() -> None:
    p = one_problem(
        {"model": "/m/t.gguf", "variant": "beellama", "parallel": 4, "speculative": SEED_004}
    )
    assert p.field == "instances.a.parallel"
    assert p.message.startswith("DFlash keeps its state for 1 slot(s)")
    assert p.fix == "set parallel = 1, or raise speculative.dflash_max_slots"
    # Raising the knob allows it.
    ok = {**SEED_004, "dflash_max_slots": 4}
    parse_config(
        {
            "instances": {
                "a": {"model": "/m/t.gguf", "variant": "beellama", "parallel": 4, "speculative": ok}
            }
        },
        "t.toml",
    )


# --- what a flip gains or loses ------------------------------------------------------------


def write_probe(tmp_path: Path, name: str, caps: Capabilities) -> Path:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(caps.to_json()))
    return path


def test_probe_diff_names_what_a_flip_gains_and_loses(tmp_path: Path, live: Capabilities) -> None:
    up = write_probe(tmp_path, "upstream", live)
    bee = write_probe(tmp_path, "beellama", recorded(RECORDED["beellama"]))
    proc = run_llamanix("variant", "probe", "--diff", str(up), str(bee), "--json", timeout=None)
    assert proc.returncode == 0, proc.stderr
    diff = json.loads(proc.stdout)
    assert {"copyspec", "suffix", "recycle"} <= set(diff["gained_spec_types"])
    assert "mtp" in diff["lost_spec_types"]  # upstream drafts MTP; this BeeLlama does not
    assert {"turbo3", "turbo2_tcq"} <= set(diff["gained_cache_types"])
    assert {"speculative.dflash_max_slots", "speculative.draft_ctx_size"} <= set(
        diff["gained_keys"]
    )
    # The other way round, the same items change sides.
    back = run_llamanix("variant", "probe", "--diff", str(bee), str(up), "--json", timeout=None)
    reverse = json.loads(back.stdout)
    assert reverse["lost_spec_types"] == diff["gained_spec_types"]
    assert reverse["gained_cache_types"] == diff["lost_cache_types"]


def test_plan_warns_before_a_flip_that_drops_something(tmp_path: Path, live: Capabilities) -> None:
    toml = tmp_path / "c.toml"
    toml.write_text(
        '[hosts.h]\nkind = "systemd"\nbinaries = { beellama = "/opt/beellama/llama-server" }\n'
        '[instances.q]\nmodel = "/m/t.gguf"\nvariant = "beellama"\n'
    )
    up = write_probe(tmp_path, "upstream", live)
    bee = write_probe(tmp_path, "beellama", recorded(RECORDED["beellama"]))

    def plan_warnings(previous: Path) -> list[str]:
        proc = run_llamanix(
            *("plan", str(toml), "--no-security", "--json"),
            *("--capabilities", f"q={bee}", "--previous", f"q={previous}"),
            timeout=None,
        )
        assert proc.returncode == 0, proc.stderr
        [row] = json.loads(proc.stdout)["hosts"]["h"]["instances"]
        return [w for w in row["warnings"] if w.startswith("the flip")]

    [warning] = plan_warnings(up)
    assert warning.startswith("the flip to this build loses speculative types ")
    assert "mtp" in warning and "eagle3" in warning
    assert plan_warnings(bee) == []  # same build: nothing to lose
