"""The exact argv for every variant x speculative type, and every variant-level refusal."""

from __future__ import annotations

from typing import Any

import pytest

from llamanix.config.argv import instance_argv
from llamanix.config.model import parse_config
from llamanix.core.errors import UserError
from llamanix.core.schema import SPEC_TYPES
from llamanix.core.variants import VARIANTS

BASE: dict[str, Any] = {
    "model": "/m/target.gguf",
    "alias": "t",
    "context": 4096,
    "gpu_layers": "all",
    "flash_attn": "on",
    "cache_type_k": "q8_0",
    "cache_type_v": "q8_0",
    "parallel": 1,
}
DRAFT = {
    "draft_model": "/m/draft.gguf",
    "draft_gpu_layers": "all",
    "n_max": 8,
    "n_min": 2,
    "p_min": 0.5,
}
SPEC_INPUT: dict[str, dict[str, Any]] = {
    "none": {},
    "draft": DRAFT,
    "mtp": {"n_max": 3, "p_min": 0.75},
    "dflash": DRAFT,
    "dspark": DRAFT,
    "eagle3": DRAFT,
    "ngram-simple": {},
    "ngram-mod": {"n_max": 64, "n_min": 48},
    "ngram-cache": {},
    "ngram-map-k": {},
    "ngram-map-k4v": {},
    "copyspec": {},
    "suffix": {},
    "recycle": {},
}

COMMON = ["--alias", "t", "--host", "127.0.0.1", "--port", "8080", "-c", "4096"]
KV = ["-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0", "-np", "1"]
PREFIX = {
    "upstream": ["llama-server", "-m", "/m/target.gguf", *COMMON, "-ngl", "all", *KV, "--metrics"],
    "nixpkgs": ["llama-server", "-m", "/m/target.gguf", *COMMON, "-ngl", "all", *KV, "--metrics"],
    "mtp": ["llama-server", "-m", "/m/target.gguf", *COMMON, "-ngl", "all", *KV, "--metrics"],
    "beellama": ["llama-server", "-m", "/m/target.gguf", *COMMON, "-ngl", "all", *KV, "--metrics"],
    # ik: integer layer counts only, and --jinja said explicitly (its default is off).
    "ik": [
        "llama-server",
        "-m",
        "/m/target.gguf",
        *COMMON,
        "-ngl",
        "999",
        *KV,
        "--jinja",
        "--metrics",
    ],
}
UP_DRAFT = ["--spec-draft-n-max", "8", "--spec-draft-n-min", "2", "--spec-draft-p-min", "0.5"]
UP_NGRAM = {t: ["--spec-type", t] for t in ("ngram-simple", "ngram-cache", "ngram-map-k")}
NOT = "refused"
EXPECTED: dict[str, dict[str, list[str] | str]] = {
    "upstream": {
        "none": [],
        "draft": [
            "--spec-draft-model",
            "/m/draft.gguf",
            "--spec-draft-ngl",
            "all",
            "--spec-type",
            "draft-simple",
            *UP_DRAFT,
        ],
        "mtp": [
            "--spec-type",
            "draft-mtp",
            "--spec-draft-n-max",
            "3",
            "--spec-draft-p-min",
            "0.75",
        ],
        "dflash": [
            "--spec-draft-model",
            "/m/draft.gguf",
            "--spec-draft-ngl",
            "all",
            "--spec-type",
            "draft-dflash",
            *UP_DRAFT,
        ],
        # Read at 0c1e570: common/speculative.cpp's type names, common/arg.cpp's flags.
        "dspark": [
            "--spec-draft-model",
            "/m/draft.gguf",
            "--spec-draft-ngl",
            "all",
            "--spec-type",
            "draft-dspark",
            *UP_DRAFT,
        ],
        "eagle3": [
            "--spec-draft-model",
            "/m/draft.gguf",
            "--spec-draft-ngl",
            "all",
            "--spec-type",
            "draft-eagle3",
            *UP_DRAFT,
        ],
        "ngram-map-k4v": ["--spec-type", "ngram-map-k4v"],
        "ngram-mod": [
            "--spec-type",
            "ngram-mod",
            "--spec-ngram-mod-n-max",
            "64",
            "--spec-ngram-mod-n-min",
            "48",
        ],
        **UP_NGRAM,
        "copyspec": NOT,
        "suffix": NOT,
        "recycle": NOT,
    },
    "mtp": {
        "none": [],
        "draft": ["-md", "/m/draft.gguf", "-ngld", "all", "--spec-type", "draft-simple", *UP_DRAFT],
        "mtp": [
            "--spec-type",
            "draft-mtp",
            "--spec-draft-n-max",
            "3",
            "--spec-draft-p-min",
            "0.75",
        ],
        "dflash": NOT,
        "dspark": NOT,
        "eagle3": NOT,
        "ngram-mod": [
            "--spec-type",
            "ngram-mod",
            "--spec-ngram-mod-n-max",
            "64",
            "--spec-ngram-mod-n-min",
            "48",
        ],
        **UP_NGRAM,
        "ngram-map-k4v": ["--spec-type", "ngram-map-k4v"],
        "copyspec": NOT,
        "suffix": NOT,
        "recycle": NOT,
    },
    "nixpkgs": {
        "none": [],
        # b8770: -md alone enables draft-model speculation; no --spec-type value exists for it.
        "draft": [
            "-md",
            "/m/draft.gguf",
            "-ngld",
            "all",
            "--draft-max",
            "8",
            "--draft-min",
            "2",
            "--draft-p-min",
            "0.5",
        ],
        "mtp": NOT,
        "dflash": NOT,
        "dspark": NOT,
        "eagle3": NOT,
        "ngram-mod": ["--spec-type", "ngram-mod", "--draft-max", "64", "--draft-min", "48"],
        **UP_NGRAM,
        "ngram-map-k4v": ["--spec-type", "ngram-map-k4v"],
        "copyspec": NOT,
        "suffix": NOT,
        "recycle": NOT,
    },
    "ik": {
        "none": [],
        "draft": [
            "-md",
            "/m/draft.gguf",
            "-ngld",
            "999",
            "--spec-type",
            "draft:n_max=8,n_min=2,p_min=0.5",
        ],
        "mtp": ["--spec-type", "mtp:n_max=3,p_min=0.75"],
        "dflash": [
            "-md",
            "/m/draft.gguf",
            "-ngld",
            "999",
            "--spec-type",
            "dflash:n_max=8,n_min=2,p_min=0.5",
        ],
        "dspark": [
            "-md",
            "/m/draft.gguf",
            "-ngld",
            "999",
            "--spec-type",
            "dspark:n_max=8,n_min=2,p_min=0.5",
        ],
        # ik has no EAGLE3 stage (its type map, common/speculative.cpp, at both pins).
        "eagle3": NOT,
        "ngram-mod": ["--spec-type", "ngram-mod:n_max=64,n_min=48"],
        "ngram-simple": ["--spec-type", "ngram-simple"],
        "ngram-cache": ["--spec-type", "ngram-cache"],
        "ngram-map-k": ["--spec-type", "ngram-map-k"],
        "ngram-map-k4v": ["--spec-type", "ngram-map-k4v"],
        "copyspec": NOT,
        "suffix": ["--spec-type", "suffix"],
        "recycle": NOT,
    },
    # BeeLlama: a draft model alone drafts (no --spec-type value), DFlash takes the drafter
    # through --spec-draft-model, and copyspec/suffix/recycle are its own model-free drafters.
    "beellama": {
        "none": [],
        "draft": ["--spec-draft-model", "/m/draft.gguf", "--spec-draft-ngl", "all", *UP_DRAFT],
        "mtp": NOT,
        "dflash": [
            "--spec-draft-model",
            "/m/draft.gguf",
            "--spec-draft-ngl",
            "all",
            "--spec-type",
            "dflash",
            *UP_DRAFT,
        ],
        "dspark": NOT,
        "eagle3": NOT,
        "ngram-simple": ["--spec-type", "ngram-simple"],
        "ngram-mod": [
            "--spec-type",
            "ngram-mod",
            "--spec-ngram-mod-n-max",
            "64",
            "--spec-ngram-mod-n-min",
            "48",
        ],
        "ngram-cache": ["--spec-type", "ngram-cache"],
        "ngram-map-k": ["--spec-type", "ngram-map-k"],
        "ngram-map-k4v": ["--spec-type", "ngram-map-k4v"],
        "copyspec": ["--spec-type", "copyspec"],
        "suffix": ["--spec-type", "suffix"],
        "recycle": ["--spec-type", "recycle"],
    },
}


def config_for(variant: str, spec_type: str, **extra: Any) -> dict[str, Any]:
    inst = {**BASE, "variant": variant, **extra}
    if spec_type != "none":
        inst["speculative"] = {"type": spec_type, **SPEC_INPUT[spec_type]}
    return {"instances": {"a": inst}}


def test_matrix_covers_every_variant_and_type() -> None:
    assert set(EXPECTED) == set(VARIANTS)
    for variant in EXPECTED.values():
        assert set(variant) == set(SPEC_TYPES)


@pytest.mark.parametrize("variant", sorted(EXPECTED))
@pytest.mark.parametrize("spec_type", SPEC_TYPES)
def test_exact_argv(variant: str, spec_type: str) -> None:
    expected = EXPECTED[variant][spec_type]
    if expected == NOT:
        with pytest.raises(UserError) as err:
            parse_config(config_for(variant, spec_type), "t.toml")
        [problem] = err.value.problems
        assert problem.field == "instances.a.speculative.type"
        assert f"not supported by the {variant} variant" in problem.message
        return
    cfg = parse_config(config_for(variant, spec_type), "t.toml")
    assert instance_argv(cfg, "a") == PREFIX[variant] + list(expected)


@pytest.mark.parametrize("variant", sorted(EXPECTED))
def test_variant_flag_previews_a_flip(variant: str) -> None:
    cfg = parse_config(config_for("upstream", "none"), "t.toml")
    assert instance_argv(cfg, "a", variant=variant) == PREFIX[variant]


def test_flip_to_a_variant_that_cannot_is_refused() -> None:
    cfg = parse_config(config_for("upstream", "mtp"), "t.toml")
    with pytest.raises(UserError, match="'mtp' is not supported by the nixpkgs variant"):
        instance_argv(cfg, "a", variant="nixpkgs")


def test_absent_keys_are_not_rendered() -> None:
    cfg = parse_config({"instances": {"a": {"model": "/m/t.gguf"}}}, "t.toml")
    assert instance_argv(cfg, "a") == [
        "llama-server",
        "-m",
        "/m/t.gguf",
        "--host",
        "127.0.0.1",
        "--port",
        "8080",
        "--metrics",
    ]
    assert instance_argv(cfg, "a", variant="ik") == [
        "llama-server",
        "-m",
        "/m/t.gguf",
        "--host",
        "127.0.0.1",
        "--port",
        "8080",
        "--jinja",
        "--metrics",
    ]


def test_jinja_off_and_metrics_off() -> None:
    cfg = parse_config(
        {"instances": {"a": {"model": "/m/t.gguf", "jinja": False, "metrics": False}}}, "t.toml"
    )
    assert instance_argv(cfg, "a")[-1] == "--no-jinja"
    # ik has no --no-jinja; its default is already off.
    assert "--jinja" not in instance_argv(cfg, "a", variant="ik")


def test_binary_from_host_table_and_instance_override() -> None:
    data = {
        "hosts": {"h": {"kind": "systemd", "binaries": {"ik": "/opt/ik/bin/llama-server"}}},
        "instances": {
            "a": {"model": "/m/t.gguf", "variant": "ik"},
            "b": {"model": "/m/t.gguf", "port": 8081, "binary": "/usr/local/bin/llama-server"},
        },
    }
    cfg = parse_config(data, "t.toml")
    assert instance_argv(cfg, "a")[0] == "/opt/ik/bin/llama-server"
    assert instance_argv(cfg, "b")[0] == "/usr/local/bin/llama-server"
    assert instance_argv(cfg, "b", variant="upstream")[0] == "/usr/local/bin/llama-server"


def test_defaults_merge_and_instance_wins() -> None:
    data = {
        "defaults": {
            "context": 8192,
            "flash_attn": "on",
            "speculative": {"type": "ngram-mod", "n_max": 64},
        },
        "instances": {
            "a": {"model": "/m/t.gguf", "context": 2048},
            "b": {"model": "/m/t.gguf", "port": 8081, "speculative": {"n_max": 32}},
        },
    }
    cfg = parse_config(data, "t.toml")
    a, b = instance_argv(cfg, "a"), instance_argv(cfg, "b")
    assert a[a.index("-c") + 1] == "2048"
    assert b[b.index("-c") + 1] == "8192"
    assert b[b.index("--spec-ngram-mod-n-max") + 1] == "32"
    assert a[a.index("--spec-ngram-mod-n-max") + 1] == "64"


def test_extra_args_appended_verbatim() -> None:
    cfg = parse_config(
        {"instances": {"a": {"model": "/m/t.gguf", "extra_args": ["--no-webui", "-cram", "0"]}}},
        "t.toml",
    )
    assert instance_argv(cfg, "a")[-3:] == ["--no-webui", "-cram", "0"]


def test_api_key_file_is_passed_as_a_file_never_as_a_key() -> None:
    cfg = parse_config(
        {"instances": {"a": {"model": "/m/t.gguf", "api_key_file": "/run/secrets/k"}}}, "t.toml"
    )
    argv = instance_argv(cfg, "a")
    assert argv[argv.index("--api-key-file") + 1] == "/run/secrets/k"
    assert "--api-key" not in argv
