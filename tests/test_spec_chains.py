"""Speculation as a chain, the new types and the drafter's own flags, spelled as each binary's
recorded --help says (tests/data/help, sources in docs/variants.md), and BeeLlama detected from
several markers, with a build newer than the recorded v0.3 falling back to its own lists.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from recorded_help import B8770, BEE03, IK_NEW, IK_PIN, UPSTREAM, bee_after_v03, recorded

from llamanix.cli import main
from llamanix.config.argv import check_against, dialect_warning, instance_arg_pieces, instance_argv
from llamanix.config.model import parse_config
from llamanix.core.errors import UserError
from llamanix.core.variants import VARIANTS, effective_variant


def cfg(variant: str, spec: dict[str, Any], **inst: Any) -> Any:
    data = {"instances": {"a": {"model": "/m/t.gguf", "variant": variant, "speculative": spec}}}
    data["instances"]["a"].update(inst)
    return parse_config(data, "t.toml")


def problems(variant: str, spec: dict[str, Any], **inst: Any) -> list[str]:
    with pytest.raises(UserError) as err:
        cfg(variant, spec, **inst)
    return [str(p) for p in err.value.problems]


# --- what the recorded binaries say ---------------------------------------------------------


def test_recorded_upstream_lists_the_new_types_chains_and_drafter_flags() -> None:
    caps = recorded(UPSTREAM)
    assert caps.dialect == "upstream" and caps.dialect_guess == ""
    assert {"draft-dspark", "ngram-map-k4v", "draft-mtp", "draft-dflash"} <= set(caps.spec_types)
    assert caps.spec_chain == "comma"
    assert {"-ctkd", "-ctvd", "-devd", "-cmoed", "--spec-synth-len"} <= set(caps.flags)


def test_recorded_ik_stages_and_what_the_pin_lacks() -> None:
    pinned, newer = recorded(IK_PIN), recorded(IK_NEW)
    assert pinned.spec_chain == newer.spec_chain == "repeat"
    assert {"suffix", "ngram-map-k4v", "mtp"} <= set(pinned.spec_types)
    assert "dspark" in newer.spec_types and "dspark" not in pinned.spec_types
    assert "-devd" not in newer.flags and "-cmoed" not in newer.flags
    assert {"-ctkd", "-ctvd"} <= set(newer.flags)


def test_recorded_single_type_builds() -> None:
    assert recorded(BEE03).spec_chain == "single"
    assert recorded(B8770).spec_chain == "single"


# --- chains ---------------------------------------------------------------------------------


def test_upstream_chain_is_one_comma_value_and_the_binary_takes_it() -> None:
    c = cfg("upstream", {"type": ["mtp", "ngram-mod"], "n_max": 3, "p_min": 0.75})
    caps = recorded(UPSTREAM)
    argv = instance_argv(c, "a", capabilities=caps)
    assert argv[argv.index("--spec-type") :] == [
        "--spec-type",
        "draft-mtp,ngram-mod",
        "--spec-draft-n-max",
        "3",
        "--spec-draft-p-min",
        "0.75",
    ]


def test_ik_chain_is_one_stage_per_flag_with_the_parameters_on_the_first() -> None:
    # ik's common_speculative_validate_chain: a self-speculating stage, then mtp or draft.
    c = cfg("ik", {"type": ["ngram-mod", "mtp"], "n_max": 16, "p_min": 0.0})
    for name in (IK_PIN, IK_NEW):
        argv = instance_argv(c, "a", capabilities=recorded(name))
        assert argv[argv.index("--spec-type") :] == [
            "--spec-type",
            "ngram-mod:n_max=16,p_min=0",
            "--spec-type",
            "mtp",
        ]


def test_ik_suffix_and_dspark_where_the_build_has_them() -> None:
    c = cfg("ik", {"type": "suffix", "n_max": 16, "n_min": 2})
    assert instance_argv(c, "a", capabilities=recorded(IK_PIN))[-2:] == [
        "--spec-type",
        "suffix:n_max=16,n_min=2",
    ]
    spark = cfg("ik", {"type": "dspark", "draft_model": "/m/d.gguf", "dflash_cross_ctx": 512})
    assert instance_argv(spark, "a", capabilities=recorded(IK_NEW))[-2:] == [
        "--spec-type",
        "dspark:cross_ctx=512",
    ]
    with pytest.raises(UserError) as err:
        instance_argv(spark, "a", capabilities=recorded(IK_PIN))
    assert "--spec-type dspark is not known to recorded:ik-de55d9e2" in str(err.value.problems[0])


@pytest.mark.parametrize("variant", ["nixpkgs", "beellama", "mtp"])
def test_single_type_dialects_refuse_a_chain(variant: str) -> None:
    [line] = problems(variant, {"type": ["ngram-mod", "ngram-cache"]})
    assert "takes one speculative type, not a chain (ngram-mod, ngram-cache)" in line
    assert 'keep one, e.g. type = "ngram-mod"' in line


@pytest.mark.parametrize(
    ("variant", "spec", "expected"),
    [
        (
            "upstream",
            {"type": ["mtp", "draft"], "draft_model": "/m/d.gguf"},
            "a chain holds at most one drafter, got mtp and draft",
        ),
        ("ik", {"type": ["ngram-mod", "ngram-cache", "mtp"]}, "chains at most 2 types, got 3"),
        (
            "ik",
            {"type": ["mtp", "ngram-mod"]},
            "the ik variant chains a self-speculating type (n-gram, suffix) first, then mtp or "
            'draft; got mtp, ngram-mod (e.g. type = ["ngram-mod", "draft"])',
        ),
        (
            "ik",
            {"type": ["ngram-mod", "ngram-cache"]},
            "then mtp or draft; got ngram-mod, ngram-cache",
        ),
        ("upstream", {"type": ["none", "mtp"]}, "'none' in a chain"),
        ("upstream", {"type": ["mtp", "mtp"]}, "names a type twice"),
        ("upstream", {"type": []}, "is an empty list"),
        ("upstream", {"type": ["mtp", "warp"]}, "unknown value 'warp'"),
    ],
)
def test_chain_refusals(variant: str, spec: dict[str, Any], expected: str) -> None:
    lines = problems(variant, spec)
    assert len(lines) == 1 and expected in lines[0], lines
    assert lines[0].startswith("t.toml: instances.a.speculative.type: ")


def test_parameters_belong_to_the_first_type() -> None:
    [line] = problems("upstream", {"type": ["ngram-cache", "mtp"], "n_max": 3})
    assert "'ngram-cache' on the upstream variant takes no n_max" in line
    assert "parameters belong to the chain's first type" in line


# --- the drafter's cache types, device, CPU-MoE ---------------------------------------------


def test_drafter_flags_upstream() -> None:
    spec = {
        "type": "draft",
        "draft_model": "/m/d.gguf",
        "draft_cache_type_k": "q8_0",
        "draft_cache_type_v": "q4_0",
        "draft_device": "none",
        "draft_cpu_moe": True,
    }
    argv = instance_argv(cfg("upstream", spec), "a", capabilities=recorded(UPSTREAM))
    i = argv.index("-ctkd")
    assert argv[i : i + 7] == ["-ctkd", "q8_0", "-ctvd", "q4_0", "-devd", "none", "-cmoed"]


def test_ik_has_no_drafter_device_or_cpu_moe() -> None:
    lines = problems(
        "ik",
        {"type": "draft", "draft_model": "/m/d.gguf", "draft_device": "CUDA1"},
        parallel=1,
    )
    assert lines == [
        "t.toml: instances.a.speculative.draft_device: the ik variant has no flag for "
        "draft_device (remove it)"
    ]


def test_drafter_settings_need_a_drafter() -> None:
    [line] = problems("upstream", {"type": "ngram-mod", "draft_cache_type_k": "q8_0"})
    assert "only a drafter (mtp, draft, dflash, dspark, eagle3) uses draft_cache_type_k" in line


def test_synthetic_acceptance_never_serves() -> None:
    [line] = problems("upstream", {"type": "none"}, extra_args=["--spec-synth-len", "2.5"])
    assert "instances.a.extra_args: --spec-synth-len makes the server accept drafts" in line
    assert "llamanix bench synthetic" in line


# --- BeeLlama: v0.3 as recorded, anything after it from its own lists -----------------------


def test_beellama_v03_is_recognised_exactly() -> None:
    caps = recorded(BEE03)
    assert caps.dialect == "beellama" and caps.dialect_guess == ""
    c = cfg(
        "beellama",
        {"type": "dflash", "draft_model": "/m/d.gguf", "draft_ctx_size": 256},
        cache_type_k="turbo3",
        cache_type_v="turbo3",
        parallel=1,
    )
    argv = instance_argv(c, "a", capabilities=caps)
    assert argv[argv.index("--spec-type") :][:2] == ["--spec-type", "dflash"]
    assert dialect_warning(c, "a", capabilities=caps) is None


def test_beellama_after_v03_falls_back_to_its_own_lists_with_one_warning() -> None:
    caps = bee_after_v03()
    assert caps.dialect == "beellama"
    assert caps.dialect_guess == "not v0.3: kvarn*, copyspec, recycle, --spec-dflash-max-slots"
    assert caps.cache_types_v and "kvarn5" not in caps.cache_types
    c = cfg(
        "beellama",
        {"type": "dflash", "draft_model": "/m/d.gguf"},
        cache_type_k="q8_0",
        cache_type_v="kvarn5",
        parallel=1,
    )
    argv = instance_argv(c, "a", capabilities=caps)
    assert argv[argv.index("--spec-type") :][:2] == ["--spec-type", "draft-dflash"]
    assert argv[argv.index("-ctv") :][:2] == ["-ctv", "kvarn5"]
    warning = dialect_warning(c, "a", capabilities=caps)
    assert warning is not None and "\n" not in warning
    assert "is a beellama build llamanix has no recording of (not v0.3:" in warning
    assert "see docs/variants.md" in warning
    # The v0.3 binary's own list refuses it.
    with pytest.raises(UserError) as err:
        instance_argv(c, "a", capabilities=recorded(BEE03))
    assert (
        "cache type 'kvarn5' is not known to the beellama variant's build recorded:beellama-ba1fdce"
        in str(err.value)
    )
    assert "turbo3_tcq" in str(err.value)


def test_beellama_after_v03_refuses_what_it_dropped() -> None:
    caps = bee_after_v03()
    gone = cfg(
        "beellama",
        {"type": "dflash", "draft_model": "/m/d.gguf", "draft_ctx_size": 256},
        parallel=1,
    )
    with pytest.raises(UserError) as err:
        instance_argv(gone, "a", capabilities=caps)
    [problem] = err.value.problems
    assert problem.field == "instances.a.speculative.draft_ctx_size"
    assert problem.message == (
        "'dflash' on the beellama variant's build derived:beellama-after-v0.3 "
        "(version 0, commit ?) takes no draft_ctx_size"
    )
    assert problem.fix == "remove it"
    k_kvarn = cfg("beellama", {"type": "none"}, cache_type_k="kvarn5")
    pieces = instance_arg_pieces(k_kvarn, "a")  # the table alone lets it through
    [(field, message, _fix)] = check_against(caps, pieces)
    assert field == "cache_type_k" and "cache type kvarn5 is not known to" in message


def test_without_a_probe_nothing_changes() -> None:
    for name in VARIANTS:
        v = VARIANTS[name]
        assert effective_variant(v, None) == (v, None)


def test_validate_prints_the_fallback_warning_once(tmp_path: Path) -> None:
    import json

    caps = bee_after_v03()
    probe = tmp_path / "bee.json"
    probe.write_text(json.dumps(caps.to_json()))
    config = tmp_path / "llamanix.toml"
    config.write_text(
        '[instances.a]\nmodel = "/m/t.gguf"\nvariant = "beellama"\ncache_type_v = "kvarn5"\n'
        'flash_attn = "on"\n'
    )
    result = CliRunner().invoke(
        main, ["plan", str(config), "a", "--argv", "--capabilities", str(probe)]
    )
    assert result.exit_code == 0, result.output
    assert "kvarn5" in result.output
