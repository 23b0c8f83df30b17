"""The Nix side without nixpkgs: every .nix parses, the pure Nix functions compute what the builds
need, the NixOS module's options are exactly llamanix.toml's keys, the flake's inputs and lock
agree with the variant registry, and the module's render command turns the module's JSON into
units (with a real `llamanix probe` of a real llama-server).

CI has Nix (nix-instantiate) but no nixpkgs: Nix expressions are evaluated with a stub lib
(tests/nix/stub-lib.nix) where they need one.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from recorded_help import RECORDED_PROBE, probe_of, recorded, write_probe
from standins import recorded_argv, stand_in

from llamanix.config.model import parse_config, suggest
from llamanix.core.errors import UserError
from llamanix.core.variants import VARIANTS
from llamanix.render.units import render_host

ROOT = Path(__file__).resolve().parent.parent
SCHEMA: dict[str, dict[str, dict[str, Any]]] = json.loads(
    (ROOT / "tools/llamanix/data/schema.json").read_text()
)
RENDER_UNITS = ROOT / "modules/render-units.sh"

pytestmark = pytest.mark.skipif(
    shutil.which("nix-instantiate") is None, reason="nix-instantiate is not installed"
)


def nix_eval(expr_or_file: str | Path, **argstr: str) -> Any:
    """Evaluate a Nix file (Path) or expression (str) strictly, as JSON, without a store write."""
    argv = ["nix-instantiate", "--readonly-mode", "--eval", "--strict", "--json"]
    argv += [str(expr_or_file)] if isinstance(expr_or_file, Path) else ["-E", expr_or_file]
    for name, value in argstr.items():
        argv += ["--argstr", name, value]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def lib_call(call: str) -> Any:
    return nix_eval(f"let l = import ./nix/lib.nix; in {call}")


def nix_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", "--", "*.nix"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [ROOT / name for name in listed.split("\0") if name]


# --- every file parses ---------------------------------------------------------------------


def test_every_nix_file_parses() -> None:
    files = nix_files()
    assert {"flake.nix", "modules/llamanix.nix", "pkgs/llama-cpp-variant.nix"} <= {
        str(f.relative_to(ROOT)) for f in files
    }
    for path in files:
        proc = subprocess.run(
            ["nix-instantiate", "--parse", str(path)], capture_output=True, text=True, check=False
        )
        assert proc.returncode == 0, f"{path.relative_to(ROOT)}: {proc.stderr}"


# --- pure functions the builds use ---------------------------------------------------------


@pytest.mark.parametrize(
    ("archs", "cmake"),
    [
        (["8.6", "12.0"], "86;120"),
        (["12.0"], "120"),
        (["8.6"], "86"),
        (["8.9", "12.0a", "9.0"], "89;120a;90"),
        ([], ""),
    ],
)
def test_cuda_archs_become_the_cmake_list(archs: list[str], cmake: str) -> None:
    assert lib_call(f"l.cmakeCudaArchitectures (builtins.fromJSON ''{json.dumps(archs)}'')") == (
        cmake
    )


def test_all_quants_flash_attention_flag_follows_the_source() -> None:
    # The option lines as ggml/CMakeLists.txt words them before and after the rename.
    old = 'option(GGML_CUDA_FA_ALL_QUANTS "ggml: compile all quants for FlashAttention" OFF)'
    new = old + '\nset(GGML_CUDA_FA_QUANTS "q4_0-q4_0;q8_0-q8_0;f16-f16;bf16-bf16" CACHE STRING'
    assert lib_call(f"l.cudaFaQuantsFlags ''{old}''") == ["-DGGML_CUDA_FA_ALL_QUANTS:BOOL=TRUE"]
    assert lib_call(f"l.cudaFaQuantsFlags ''{new}''") == ["-DGGML_CUDA_FA_QUANTS:STRING=all"]
    # Unknown source (nixpkgs' own, a derivation): the spelling every ggml accepts.
    assert lib_call("l.cudaFaQuantsFlags null") == ["-DGGML_CUDA_FA_ALL_QUANTS:BOOL=TRUE"]


def test_redefined_cmake_flags_are_dropped_exactly() -> None:
    flags = [
        "-DCMAKE_CUDA_ARCHITECTURES:STRING=52;61",
        "-DLLAMA_BUILD_NUMBER=8770",
        "-DLLAMA_BUILD_NUMBERS=1",
        "-DGGML_NATIVE:BOOL=FALSE",
    ]
    kept = lib_call(
        'l.dropCMakeFlags [ "CMAKE_CUDA_ARCHITECTURES" "LLAMA_BUILD_NUMBER" ] '
        f"(builtins.fromJSON ''{json.dumps(flags)}'')"
    )
    assert kept == ["-DLLAMA_BUILD_NUMBERS=1", "-DGGML_NATIVE:BOOL=FALSE"]


def test_unstable_version_from_last_modified_date() -> None:
    assert lib_call('l.unstableVersion "20260516152027"') == "0-unstable-2026-05-16"


def test_package_names_cover_every_variant_and_arch_set() -> None:
    packages = lib_call("l.variantPackages")
    variants = SCHEMA["instances"]["variant"]["values"]
    assert set(variants) == set(VARIANTS)
    expected = {
        f"llama-cpp-{v}{suffix}": archs
        for v in variants
        for suffix, archs in (
            ("", ["8.6", "12.0"]),
            ("-sm120", ["12.0"]),
            ("-sm86", ["8.6"]),
            ("-cpu", []),
        )
    }
    assert {name: p["cudaArchs"] for name, p in packages.items()} == expected
    assert all(p["variant"] == name.split("-")[2] for name, p in packages.items())


def test_gpu_smoke_checks_cover_every_cuda_package() -> None:
    packages = lib_call("l.variantPackages")
    checks = lib_call("l.gpuSmokeChecks")
    cuda = {name for name, p in packages.items() if p["cudaArchs"]}
    assert {c["package"] for c in checks.values()} == cuda
    assert not any(name.endswith("-cpu") for name in checks)
    for name, check in checks.items():
        # gpu-smoke-upstream-sm120 smokes llama-cpp-upstream-sm120, with its variant's dialect.
        assert name == "gpu-smoke-" + check["package"].removeprefix("llama-cpp-")
        assert check["variant"] == packages[check["package"]]["variant"]
        assert check["cudaArchs"] == packages[check["package"]]["cudaArchs"]
    assert checks["gpu-smoke-upstream-sm120"]["cudaArchs"] == ["12.0"]


def test_gpu_smoke_groups_hold_what_one_card_can_run() -> None:
    checks = lib_call("l.gpuSmokeChecks")
    groups = lib_call("l.gpuSmokeGroups")
    assert set(groups) == {"gpu-smoke-sm86", "gpu-smoke-sm120"}
    for group, arch in (("gpu-smoke-sm86", "8.6"), ("gpu-smoke-sm120", "12.0")):
        assert set(groups[group]) == {n for n, c in checks.items() if arch in c["cudaArchs"]}
    assert (
        "gpu-smoke-ik" in groups["gpu-smoke-sm86"]
        and "gpu-smoke-ik-sm120" not in (groups["gpu-smoke-sm86"])
    )


def test_smoke_app_arch_words_name_packages() -> None:
    archs = lib_call("l.smokeArchs")
    packages = lib_call("l.variantPackages")
    assert sorted(archs) == ["cpu", "sm120", "sm86"]
    for variant in VARIANTS:
        assert f"llama-cpp-{variant}" in packages
        assert all(f"llama-cpp-{variant}-{arch}" in packages for arch in archs)


CUDA_FALLBACK_WARNING = (
    "llamanix: this nixpkgs has no _cuda (nixpkgs' CUDA helpers): CUDA's unfree licenses are "
    "allowed by llamanix's copy of its predicate, over the NVIDIA licenses lib.licenses names "
    "(CUDA EULA); a newer nixpkgs has its own"
)


def test_the_flake_allows_the_cuda_licenses_by_nixpkgs_own_predicate() -> None:
    """CUDA is unfree: the pinned nixpkgs is imported with nixpkgs' own
    `_cuda.lib.allowUnfreeCudaPredicate`, read from that very package set: no second nixpkgs is
    instantiated for it (the stand-in's nixpkgs.legacyPackages throws)."""
    proc = flake_outputs("unfree")
    assert proc.returncode == 0, proc.stderr
    # The stand-in's _cuda admits its own licence name, and only it.
    assert json.loads(proc.stdout) == {
        "nixpkgsCuda": True,
        "nvidiaCuda": False,
        "otherUnfree": False,
        "free": True,
    }
    assert "warning" not in proc.stderr


def test_a_nixpkgs_without_cuda_helpers_still_evaluates_with_a_warning() -> None:
    """With inputs.nixpkgs.follows pointing at a nixpkgs from before _cuda, every output still
    evaluates: the NVIDIA licenses its lib names are admitted, with a warning saying so."""
    proc = flake_outputs("unfree", cuda=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {
        "nixpkgsCuda": False,
        "nvidiaCuda": True,
        "otherUnfree": False,
        "free": True,
    }
    assert CUDA_FALLBACK_WARNING in " ".join(proc.stderr.split())
    assert flake_outputs("systems", cuda=False).returncode == 0


def test_the_overlay_adds_only_the_llamanix_package_set() -> None:
    """The variants live in pkgs.llamanixPackages.variants, not as some twenty top-level
    llama-cpp-* attributes of every nixpkgs the overlay is applied to."""
    proc = flake_outputs("overlayAttrs")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == ["llamanix", "llamanixPackages"]


# --- the module's options are the schema's keys --------------------------------------------


@pytest.fixture(scope="module")
def options() -> dict[str, Any]:
    result: dict[str, Any] = nix_eval(ROOT / "tests/nix/options.nix")
    return result


def test_instance_options_are_exactly_the_instance_keys(options: dict[str, Any]) -> None:
    set_by_module = set(options["instanceKeysSetByModule"])
    assert set_by_module == {"host", "binary"}
    schema_keys = set(SCHEMA["instances"]) - set_by_module
    assert set(options["schemaInstanceOptions"]) == schema_keys
    # The module's instance submodule: the schema keys, the speculative table, and the
    # documented module-only options; nothing else.
    module_only = set(options["moduleOnlyInstanceOptions"])
    assert module_only == {"package", "cudaArchs", "openFirewall"}
    assert set(options["moduleInstanceOptions"]) == schema_keys | {"speculative"} | module_only
    assert not module_only & set(SCHEMA["instances"])


def test_speculative_options_are_exactly_the_speculative_keys(options: dict[str, Any]) -> None:
    assert set(options["schemaSpeculativeOptions"]) == set(SCHEMA["speculative"])
    assert set(options["moduleSpeculativeOptions"]) == set(SCHEMA["speculative"])


def test_router_options_are_exactly_the_router_keys(options: dict[str, Any]) -> None:
    set_by_module = set(options["routerKeysSetByModule"])
    assert set_by_module == {"binary"}
    schema_keys = set(SCHEMA["router"]) - set_by_module
    assert set(options["schemaRouterOptions"]) == schema_keys
    module_only = set(options["moduleOnlyRouterOptions"])
    assert module_only == {"package", "openFirewall"}
    assert set(options["moduleRouterOptions"]) == schema_keys | module_only
    assert not module_only & set(SCHEMA["router"])


def test_gateway_options_are_exactly_the_gateway_keys(options: dict[str, Any]) -> None:
    """[gateway] less what the module knows itself (this host runs it, LiteLLM's kind), plus
    what only a NixOS host needs: the replicas from every host, nixpkgs' package, the firewall."""
    set_by_module = set(options["gatewayKeysSetByModule"])
    assert set_by_module == {"kind", "host"}
    schema_keys = set(SCHEMA["gateway"]) - set_by_module
    assert set(options["schemaGatewayOptions"]) == schema_keys
    module_only = set(options["moduleOnlyGatewayOptions"])
    assert module_only == {"replicas", "package", "openFirewall"}
    assert set(options["moduleGatewayOptions"]) == schema_keys | module_only
    assert not module_only & set(SCHEMA["gateway"])


def test_host_keys_are_module_options_or_set_by_the_module(options: dict[str, Any]) -> None:
    mapped: dict[str, str] = options["hostKeyOptions"]
    assert set(mapped) | set(options["hostKeysSetByModule"]) == set(SCHEMA["hosts"])
    assert not set(mapped) & set(options["hostKeysSetByModule"])
    assert set(mapped.values()) <= set(options["moduleTopOptions"])
    assert set(options["moduleTopOptions"]) == {
        "enable",
        "instances",
        "gpu",
        "cudaArchs",
        "gpuSandbox",
        "router",
        "gateway",
        "useSystemNixpkgs",
        "packageSet",
        "prometheus",  # modules/prometheus.nix: the [metrics] table (tests/test_prometheus_nix.py)
    }
    assert options["moduleHostOptionTypes"]["gpu"] == {"name": "nullOr", "elem": {"name": "str"}}
    assert options["moduleHostOptionTypes"]["cudaArchs"]["name"] == "listOf"
    sandbox = SCHEMA["hosts"]["gpu_sandbox"]
    assert options["moduleHostOptionTypes"]["gpuSandbox"] == {
        "name": "enum",
        "values": sandbox["values"],
    }
    assert options["moduleHostOptionDefaults"]["gpuSandbox"] == sandbox["default"]


def _int_type(lo: int | None, hi: int | None) -> dict[str, Any]:
    """What nix/schema-options.nix's intType makes of an integer's bounds."""
    if lo is not None and hi is not None:
        return {"name": "intBetween", "min": lo, "max": hi}
    if lo == 0:
        return {"name": "intUnsigned"}
    if lo == 1:
        return {"name": "intPositive"}
    if lo is not None:
        return {
            "name": "addCheck",
            "elem": {"name": "int"},
            "description": f"integer, at least {lo}",
        }
    return {"name": "int"}


def _text_type(kind: str) -> dict[str, Any]:
    """A declared string type (core/types.py) as the module's option type: its pattern, and
    a check for the length and the refused infix (tests/test_types.py runs that check)."""
    t = SCHEMA["types"][kind]
    return {
        "name": "addCheck",
        "elem": {"name": "strMatching", "pattern": t["pattern"]},
        "description": f"{kind}: {t['doc']} (at most {t['max_length']} bytes)",
    }


def expected_type(field: dict[str, Any]) -> dict[str, Any]:
    """What nix/schema-options.nix must make of a schema field (as the stub lib shows types)."""
    kind = field["type"]
    lo, hi = field.get("minimum"), field.get("maximum")
    if kind in ("str", "path"):
        t: dict[str, Any] = _text_type(field["text"])
    elif kind == "int":
        t = _int_type(lo, hi)
    elif kind == "float":
        assert lo is not None and hi is not None, "extend this test for one-sided float bounds"
        t = {"name": "numberBetween", "min": lo, "max": hi}
    elif kind == "bool":
        t = {"name": "bool"}
    elif kind == "enum":
        t = {"name": "enum", "values": field["values"]}
    elif kind == "enum_list":
        one = {"name": "enum", "values": field["values"]}
        t = {"name": "either", "left": one, "right": {"name": "nonEmptyListOf", "elem": one}}
    elif kind == "layers":
        t = {
            "name": "either",
            "left": _int_type(lo, hi),
            "right": {"name": "enum", "values": ["all", "auto"]},
        }
    elif kind == "list_str":
        t = {"name": "listOf", "elem": _text_type(field["text"])}
    elif kind == "dict_str":
        t = {
            "name": "addCheck",
            "elem": {"name": "attrsOf", "elem": _text_type(field["text"])},
            "description": f"table of {field['text']} keyed by {field['keys']}",
        }
    else:
        raise AssertionError(f"schema kind {kind} is new: map it in nix/schema-options.nix")
    absent = field["default"] is None and not field.get("required", False)
    return {"name": "nullOr", "elem": t} if absent else t


@pytest.mark.parametrize(
    ("table", "key"),
    [
        ("instances", "schemaInstanceOptions"),
        ("speculative", "schemaSpeculativeOptions"),
        ("router", "schemaRouterOptions"),
    ],
)
def test_option_types_defaults_and_docs_follow_the_schema(
    options: dict[str, Any], table: str, key: str
) -> None:
    declared = options[key]
    for name, option in declared.items():
        field = SCHEMA[table][name]
        assert option["type"] == expected_type(field), name
        assert option["description"] == field["doc"], name
        if field.get("required"):
            assert not option["hasDefault"], f"{name} is required: it must have no default"
        else:
            assert option["hasDefault"], name
            assert option["default"] == field["default"], name
        assert option["example"] == field.get("example"), name
        if option["bounds"] is not None:
            assert option["bounds"] == {"atMinimum": True, "belowMinimum": False}, name


# --- the flake's inputs and pins -------------------------------------------------------------


def parse_github_url(url: str) -> dict[str, str]:
    m = re.fullmatch(r"github:([^/]+)/([^/]+)(?:/(.+))?", url)
    assert m, url
    out = {"type": "github", "owner": m.group(1), "repo": m.group(2)}
    if m.group(3):
        # A 40-hex third part pins a commit (rev); anything else names a branch or tag (ref).
        out["rev" if re.fullmatch(r"[0-9a-f]{40}", m.group(3)) else "ref"] = m.group(3)
    return out


def test_flake_inputs_are_the_registry_variants() -> None:
    inputs: dict[str, Any] = nix_eval("(import ./flake.nix).inputs")
    sourced = {v.flake_input: v for v in VARIANTS.values() if v.flake_input}
    assert set(inputs) == {"nixpkgs", *sourced}
    assert inputs["nixpkgs"]["url"] == "github:NixOS/nixpkgs/nixos-unstable"
    for name, variant in sourced.items():
        assert inputs[name]["flake"] is False, f"{name}: built with our nixpkgs, not its flake"
        assert inputs[name]["url"] == variant.upstream, name


# Inputs pinned by revision without a narHash, each with the reason (docs/pins.md): no hash is
# recorded that could not be verified.
WITHOUT_NARHASH = {
    "beellama-cpp": "one blob of its tree (the web UI bundle, over 4 MiB) is missing from every "
    "snapshot available offline, so its NAR hash could not be computed (docs/pins.md: the "
    "command that adds it keeps the pin)",
}


def test_flake_lock_pins_every_input_completely() -> None:
    lock = json.loads((ROOT / "flake.lock").read_text())
    inputs: dict[str, Any] = nix_eval("(import ./flake.nix).inputs")
    assert lock["version"] == 7
    root = lock["nodes"][lock["root"]]["inputs"]
    assert set(root) == set(inputs)
    build_numbers: dict[str, int] = lib_call("l.buildNumbers")
    for name, node_name in root.items():
        node = lock["nodes"][node_name]
        # Nix re-locks an input whose "original" no longer matches flake.nix.
        assert node["original"] == parse_github_url(inputs[name]["url"]), name
        locked = node["locked"]
        assert locked["type"] == "github", name
        assert locked["repo"] == node["original"]["repo"], name
        # Every pin is a commit of the repository its input names, and one pinned by URL is
        # locked at exactly that commit, so `nix flake update` cannot move it.
        assert locked["owner"] == node["original"]["owner"], name
        if "rev" in node["original"]:
            assert locked["rev"] == node["original"]["rev"], name
        assert re.fullmatch(r"[0-9a-f]{40}", locked["rev"]), name
        if name in WITHOUT_NARHASH:
            # Locked by rev alone: Nix fetches it by that commit and computes the hash itself.
            assert "narHash" not in locked, f"{name}: has a narHash now; drop it from the list"
        else:
            assert re.fullmatch(r"sha256-[A-Za-z0-9+/]{43}=", locked["narHash"]), name
        # Between 2026-01-01 and 2027-01-01: a commit date, not a placeholder.
        assert 1767225600 < locked["lastModified"] < 1798761600, name
        assert node.get("flake", True) == (name == "nixpkgs"), name
        if name != "nixpkgs":
            assert locked["rev"] in build_numbers, (
                f"{name}: record the build number of {locked['rev']} in nix/lib.nix buildNumbers"
            )


PINS = ROOT / "docs/pins.md"


def locked_nodes() -> dict[str, dict[str, Any]]:
    lock = json.loads((ROOT / "flake.lock").read_text())
    root = lock["nodes"][lock["root"]]["inputs"]
    return {name: lock["nodes"][node] for name, node in root.items()}


def test_pins_md_names_every_input_nix_flake_update_moves() -> None:
    """Every input whose URL names no commit moves with `nix flake update`; docs/pins.md says
    which, in its first paragraph."""
    moving = {name for name, node in locked_nodes().items() if "rev" not in node["original"]}
    assert "beellama-cpp" in moving
    text = " ".join(PINS.read_text().split())
    m = re.search(
        r"`nix flake update` \(and `llamanix variant pin CONFIG VARIANT --latest`\) moves (.+?) to",
        text,
    )
    assert m, "docs/pins.md no longer says what `nix flake update` moves"
    assert set(re.findall(r"`([a-z-]+)`", m.group(1))) == moving


def test_pins_md_adds_a_missing_narhash_without_moving_the_pin(tmp_path: Path) -> None:
    """The command docs/pins.md gives for an input locked without a narHash names the locked
    commit, and runs `nix flake lock --override-input` at that commit: Nix records the hash and
    the same rev (its `original` stays flake.nix's URL). `nix flake update` would move it."""
    text = PINS.read_text()
    commands = re.findall(r"^\s*\$ (llamanix variant pin .+)$", text, re.M)
    assert len(commands) == len(WITHOUT_NARHASH) == 1
    [command] = commands
    # The doc shows it as a dry run (its docs test runs it); run here for real, with nix a
    # stand-in.
    _config, variant, rev, dry_run = command.split()[3:]
    assert dry_run == "--dry-run"
    command = command.removesuffix(" --dry-run")
    name = {"beellama": "beellama-cpp"}[variant]
    assert name in WITHOUT_NARHASH
    locked = locked_nodes()[name]["locked"]
    assert rev == locked["rev"]
    bin_dir = tmp_path / "bin"
    record = stand_in(bin_dir, "nix")
    (tmp_path / "flake.nix").write_text("{ }\n")
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(
        [sys.executable, "-m", "llamanix", *command.split()[1:], "--flake", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert recorded_argv(record) == [
        "nix", "flake", "lock", "--override-input", name,
        f"github:{locked['owner']}/{locked['repo']}/{locked['rev']}",
    ]  # fmt: skip


# --- the module's render command --------------------------------------------------------------

if RECORDED_PROBE:

    @pytest.fixture(scope="module")
    def llama_server() -> Path:
        # Only named in the units: nothing runs it.
        return Path("/nix/store/00000000000000000000000000000000-llama-cpp/bin/llama-server")

    @pytest.fixture(scope="module")
    def capabilities(tmp_path_factory: pytest.TempPathFactory) -> Path:
        """The recorded probe: what `llamanix probe --json` made of that build."""
        path = tmp_path_factory.mktemp("probe") / "capabilities.json"
        return write_probe(recorded(RECORDED_PROBE), path)

else:

    @pytest.fixture(scope="module")
    def llama_server(llama_server_bin: Path) -> Path:
        # Through the session fixture, so these tests are marked as server tests.
        return llama_server_bin

    @pytest.fixture(scope="module")
    def capabilities(llama_server: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
        """The probe the module's build makes of a package's llama-server (`llamanix probe
        --json`)."""
        return probe_of(llama_server, tmp_path_factory.mktemp("probe") / "capabilities.json")


def module_json(tmp_path: Path, spec: dict[str, Any]) -> Path:
    data = nix_eval(ROOT / "tests/nix/module-json.nix", spec=json.dumps(spec))
    # The module's file is named llamanix.json too: the generator reads it by its suffix.
    path = tmp_path / "llamanix.json"
    path.write_text(json.dumps(data))
    return path


def render_units(
    config: Path, host: str, out: Path, *caps: str
) -> subprocess.CompletedProcess[str]:
    """Exactly what the module's units derivation runs (with llamanix from this checkout)."""
    llamanix = shutil.which("llamanix")
    assert llamanix, "the llamanix command is not on PATH (pip install -e .)"
    path = f"{Path(llamanix).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return subprocess.run(
        ["bash", str(RENDER_UNITS), str(config), host, str(out), *caps],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PATH": path},
    )


def test_render_command_makes_units_from_the_module_json(
    tmp_path: Path, llama_server: Path, capabilities: Path
) -> None:
    spec = {
        "host": "gpu1",
        "gpu": "rtx3090",
        "cudaArchs": ["8.6"],
        "instances": {
            "qwen": {
                "binary": str(llama_server),
                "settings": {
                    "model": "/srv/models/qwen.gguf",
                    "alias": "qwen",
                    "port": 8080,
                    "context": 32768,
                    "flash_attn": "on",
                    "cache_type_k": "q8_0",
                    "cache_type_v": "q8_0",
                    "speculative": {"type": "ngram-mod", "n_max": 16},
                    "openFirewall": True,
                },
            },
            "small": {
                "binary": str(llama_server),
                "settings": {"model": "/srv/models/small.gguf", "port": 8081},
            },
        },
    }
    config = module_json(tmp_path, spec)
    data = json.loads(config.read_text())
    # Left-out options stay out (the binary's defaults apply); module-only options never go in.
    assert data["hosts"] == {
        "gpu1": {
            "kind": "nixos",
            "gpu": "rtx3090",
            "cuda_archs": ["8.6"],
            "gpu_sandbox": "device-allow",  # the module's default, always written
        }
    }
    assert "context" not in data["instances"]["small"]
    assert "openFirewall" not in data["instances"]["qwen"]
    assert data["instances"]["small"]["binary"] == str(llama_server)

    out = tmp_path / "out"
    proc = render_units(config, "gpu1", out, f"qwen={capabilities}", f"small={capabilities}")
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [
        "lib/systemd/system/llamanix-qwen.service",
        "lib/systemd/system/llamanix-small.service",
        "share/llamanix/manifest.json",
        "share/llamanix/qwen.argv.json",
        "share/llamanix/small.argv.json",
    ]
    unit = (out / "lib/systemd/system/llamanix-qwen.service").read_text()
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    assert exec_start.startswith(f"ExecStart={llama_server} ")
    for piece in ("-m /srv/models/qwen.gguf", "-c 32768", "-ctk q8_0", "-ctv q8_0", "-fa on"):
        assert f" {piece}" in exec_start, piece
    assert "--spec-type ngram-mod" in exec_start
    assert "DeviceAllow=char-nvidia-uvm rw" in unit  # the host names a GPU
    assert "PrivateDevices=no" in unit and "BindPaths=" not in unit  # gpu_sandbox's default
    assert "StateDirectory=llamanix-qwen" in unit and "CacheDirectory=llamanix-qwen" in unit
    argv = json.loads((out / "share/llamanix/qwen.argv.json").read_text())
    assert argv[0] == str(llama_server)
    manifest = json.loads((out / "share/llamanix/manifest.json").read_text())
    assert manifest["host"] == "gpu1" and manifest["kind"] == "nixos"
    assert set(manifest["instances"]) == {"qwen", "small"}
    assert manifest["instances"]["qwen"]["argv"] == argv
    # The probe's commit is what the manifest reports as the source revision.
    probed = json.loads(capabilities.read_text())
    assert manifest["instances"]["small"]["source_revision"] == probed["commit"]


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        # The variant registry refuses it: quantized V needs flash attention.
        (
            {"model": "/m.gguf", "cache_type_v": "q4_0", "flash_attn": "off"},
            "instances.bad.flash_attn",
        ),
        # The probe of the binary refuses it.
        ({"model": "/m.gguf", "extra_args": ["--no-such-flag"]}, "instances.bad.extra_args"),
    ],
)
def test_render_command_fails_on_a_config_error_and_writes_nothing(
    tmp_path: Path,
    llama_server: Path,
    capabilities: Path,
    settings: dict[str, Any],
    field: str,
) -> None:
    spec = {"host": "h", "instances": {"bad": {"binary": str(llama_server), "settings": settings}}}
    config = module_json(tmp_path, spec)
    out = tmp_path / "out"
    proc = render_units(config, "h", out, f"bad={capabilities}")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"{config}: {field}: ")
    assert "Traceback" not in proc.stderr
    assert not out.exists()


def test_render_command_usage() -> None:
    proc = subprocess.run(["bash", str(RENDER_UNITS)], capture_output=True, text=True, check=False)
    assert proc.returncode == 2
    assert proc.stderr.startswith("usage: ")


# --- systems ----------------------------------------------------------------------------------

REAL_LIB = os.environ.get("LLAMANIX_NIXPKGS_LIB", "")


def flake_outputs(attr: str, cuda: bool = True) -> subprocess.CompletedProcess[str]:
    argv = ["nix-instantiate", "--readonly-mode", "--eval", "--strict", "--json"]
    argv += [str(ROOT / "tests/nix/flake-outputs.nix"), "--argstr", "libPath", REAL_LIB, "-A", attr]
    argv += ["--argstr", "cuda", "true" if cuda else "false"]
    return subprocess.run(argv, capture_output=True, text=True, check=False)


def test_every_output_covers_x86_64_and_aarch64_linux() -> None:
    proc = flake_outputs("systems")
    assert proc.returncode == 0, proc.stderr
    systems: dict[str, list[str]] = json.loads(proc.stdout)
    assert set(systems) == {
        "packages",
        "legacyPackages",
        "apps",
        "devShells",
        "checks",
        "formatter",
    }
    for output, names in systems.items():
        assert sorted(names) == ["aarch64-linux", "x86_64-linux"], output
    assert json.loads(flake_outputs("libFunctions").stdout) == ["fromToml", "instancesFromToml"]
    assert json.loads(flake_outputs("moduleOnSupported").stdout) is True


def test_the_module_on_another_system_fails_with_one_line() -> None:
    proc = flake_outputs("moduleOnUnsupported")
    assert proc.returncode != 0
    assert proc.stderr.splitlines()[0] == (
        "error: services.llamanix: riscv64-linux is not supported; "
        "the llamanix flake builds for x86_64-linux and aarch64-linux."
    )


def test_use_system_nixpkgs_on_read_only_pkgs_fails_with_our_message() -> None:
    """With nixpkgs' readOnlyPkgs module no module may add an overlay: nixpkgs' own error would
    say only "nixpkgs.overlays is set to read-only", so the module asserts with the fix."""
    usual = flake_outputs("systemNixpkgsUsual")
    assert usual.returncode == 0, usual.stderr
    assert json.loads(usual.stdout) == {"addsOverlay": True, "failed": []}
    read_only = flake_outputs("systemNixpkgsReadOnly")
    assert read_only.returncode == 0, read_only.stderr
    found = json.loads(read_only.stdout)
    assert found["addsOverlay"] is False
    [message] = found["failed"]
    assert message.startswith(
        "services.llamanix.useSystemNixpkgs = true needs the llamanix overlay"
    )
    assert "overlays = [ llamanix.overlays.default ]" in message


@pytest.mark.skipif(not REAL_LIB, reason="set LLAMANIX_NIXPKGS_LIB to a nixpkgs lib/ directory")
def test_variant_builds_are_named_by_arch_and_never_run_the_binary(tmp_path: Path) -> None:
    (tmp_path / "ggml").mkdir()
    (tmp_path / "ggml" / "CMakeLists.txt").write_text("")
    argv = ["nix-instantiate", "--readonly-mode", "--eval", "--strict", "--json"]
    argv += [str(ROOT / "tests/nix/variant-eval.nix"), "--argstr", "libPath", REAL_LIB]
    argv += ["--argstr", "sourceDir", str(tmp_path)]
    proc = subprocess.run([*argv, "-A", "cases"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    built = {name: d for name, d in found.items() if d["evaluates"]}
    # nixpkgs' own CPU build keeps its name (the cached derivation); every other build says
    # which variant and which architectures it is, so the store paths tell them apart.
    assert {name: d["pname"] for name, d in built.items()} == {
        "nixpkgsCpu": "llama-cpp",
        "nixpkgsCuda": "llama-cpp-nixpkgs-cuda-sm86-sm120",
        "ikSm86": "llama-cpp-ik-cuda-sm86",
        "upstreamCpu": "llama-cpp-upstream-cpu",
        "beellamaCpu": "llama-cpp-beellama-cpu",
        "sparkOnCuda129": "llama-cpp-upstream-cuda-sm121",
        "familyOnCuda129": "llama-cpp-upstream-cuda-sm120f",
        "dbOnlyCapabilityWithDb": "llama-cpp-upstream-cuda-sm88",
        "orinOnAarch64": "llama-cpp-upstream-cuda-sm87",
    }
    # Only nixpkgs' own CPU build keeps the line of its postInstall that runs the binary for
    # completions; every build keeps the rest of it (the header, the `llama` link).
    assert [n for n, d in built.items() if d["completionAtBuild"]] == ["nixpkgsCpu"]
    assert all(d["keepsNixpkgsPostInstall"] for d in built.values())
    # nixpkgs' CUDA database decides where it is there (8.8 is only in the test's); Jetson's
    # capabilities need aarch64-linux, nixpkgs' Jetson packages, and no other GPU beside them.
    for case in ("dbOnlyCapabilityWithoutDb", "orinWithoutJetsonPackages", "orinBesideAnRtx3090"):
        assert found[case] == {"evaluates": False}, case
    jetson = subprocess.run(
        [*argv, "-A", "jetsonOnX86"], capture_output=True, text=True, check=False
    )
    assert "llama-cpp-upstream: Jetson compute capabilities (8.7) are built only for " in (
        " ".join(jetson.stderr.split())
    )
    # BeeLlama embeds its UI from its own tree; the others' UI needs npm or a download.
    assert [n for n, d in built.items() if d["webui"]] == ["beellamaCpu"]
    # 12.1 (DGX Spark) and 10.3 (B300) need CUDA 12.9; CUDA 13 calls 10.1 11.0 and builds no
    # Pascal: each stops the evaluation (nixpkgs' CUDA database, or nix/lib.nix
    # cudaCapabilities) rather than nvcc.
    for case in ("sparkOnCuda128", "b300OnCuda128", "thorOnCuda130", "pascalOnCuda130"):
        assert found[case] == {"evaluates": False}, case
    refused = subprocess.run([*argv, "-A", "refused"], capture_output=True, text=True, check=False)
    assert refused.returncode != 0
    assert (
        "llama-cpp-upstream: compute capability 10.3 (Blackwell) needs CUDA 12.9 or newer, this "
        "nixpkgs has cudaPackages 12.8; use .override { cudaPackages = cudaPackages_12_9; } (or "
        "newer)."
    ) in " ".join(refused.stderr.split())


# --- the override against nixpkgs' own llama-cpp recipe --------------------------------------

# nixpkgs' pkgs/by-name/ll/llama-cpp/package.nix, one file or several (os.pathsep between them):
# never committed, scripts/nix-real-lib says where it comes from.
NIXPKGS_LLAMA_CPP = [
    p for p in os.environ.get("LLAMANIX_NIXPKGS_LLAMA_CPP", "").split(os.pathsep) if p
]
LLAMA_CPP_RECORD = ROOT / "tests/data/nixpkgs-llama-cpp.json"
# The line of nixpkgs' postInstall a CUDA build cannot run (pkgs/llama-cpp-variant.nix drops it).
COMPLETION = (
    "installShellCompletion --cmd llama-server --bash <($out/bin/llama-server --completion-bash)"
)


@pytest.mark.skipif(
    not (REAL_LIB and NIXPKGS_LLAMA_CPP),
    reason="set LLAMANIX_NIXPKGS_LIB and LLAMANIX_NIXPKGS_LLAMA_CPP (scripts/nix-real-lib)",
)
@pytest.mark.parametrize(
    "recipe", NIXPKGS_LLAMA_CPP, ids=[Path(p).parent.name for p in NIXPKGS_LLAMA_CPP]
)
def test_the_variants_override_nixpkgs_own_llama_cpp_recipe(tmp_path: Path, recipe: str) -> None:
    """pkgs/llama-cpp-variant.nix on nixpkgs' real recipe, called as callPackage calls it: the
    line it drops is the recipe's word for word, the npm inputs it drops are the recipe's own,
    nixpkgs' CPU build is left exactly as nixpkgs builds it, and every other build sets each
    cmake flag once, builds its own tree's ggml and keeps the rest of nixpkgs' postInstall."""
    record = json.loads(LLAMA_CPP_RECORD.read_text())
    assert (record["repo"], record["path"], record["license"]) == (
        "NixOS/nixpkgs",
        "pkgs/by-name/ll/llama-cpp/package.nix",
        "MIT",
    )
    digest = hashlib.sha256(Path(recipe).read_bytes()).hexdigest()
    assert digest in [c["sha256"] for c in record["checked"]], (
        f"{recipe} (sha256 {digest}) is not in {LLAMA_CPP_RECORD.relative_to(ROOT)}: record its "
        "revision there once this test passes with it"
    )
    (tmp_path / "ggml").mkdir()
    (tmp_path / "ggml" / "CMakeLists.txt").write_text('option(GGML_CUDA_FA_QUANTS "")\n')
    argv = ["nix-instantiate", "--readonly-mode", "--eval", "--strict", "--json"]
    argv += [str(ROOT / "tests/nix/recipe-eval.nix"), "--argstr", "libPath", REAL_LIB]
    argv += ["--argstr", "recipe", recipe, "--argstr", "sourceDir", str(tmp_path)]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    own, cuda = found["recipe"]["cpu"], found["recipe"]["cuda"]
    cases = found["cases"]
    assert all(case["evaluates"] for case in cases.values()), cases
    # What the override matches is there, as it reads.
    assert COMPLETION in [line.strip() for line in own["postInstall"].splitlines()]
    npm = ["nodejs", "npm-config-hook"]
    assert all(name in own["nativeBuildInputs"] for name in npm)
    # nixpkgs' own CPU build: not one attribute changed (cache.nixos.org has it).
    assert cases["nixpkgsCpu"] == own
    for name, case in cases.items():
        assert {n: v for n, v in case["flags"].items() if len(v) > 1} == {}, name
        if name != "nixpkgsCpu":
            assert "--completion-bash" not in case["postInstall"], name
            assert case["postInstall"] == own["postInstall"].replace(COMPLETION, ""), name
            assert case["flags"].get("LLAMA_USE_SYSTEM_GGML", ["FALSE"]) == ["FALSE"], name
        if name.endswith("Cuda"):
            assert case["flags"]["GGML_CUDA"] == ["TRUE"], name
            assert (
                case["flags"]["CMAKE_CUDA_ARCHITECTURES"]
                != cuda["flags"]["CMAKE_CUDA_ARCHITECTURES"]
            ), name
        if not name.startswith("nixpkgs"):
            # Another tree: no npm, no UI build, the tree's commit as a flag, its own source.
            assert not set(npm) & set(case["nativeBuildInputs"]), name
            assert case["preConfigure"] == "" and case["npmDeps"] is None, name
            assert case["src"] == str(tmp_path), name
            assert case["flags"]["LLAMA_BUILD_COMMIT"] == ["0253fb2"], name
    # nixpkgs' tree with CUDA keeps nixpkgs' UI, from the very npm dependencies nixpkgs fetches.
    assert cases["nixpkgsCuda"]["npmDeps"] == own["npmDeps"]
    assert cases["nixpkgsCuda"]["nativeBuildInputs"] == cuda["nativeBuildInputs"]
    assert cases["nixpkgsCuda"]["flags"]["CMAKE_CUDA_ARCHITECTURES"] == ["86;120"]


# --- scripts/nix-real-lib builds nothing ------------------------------------------------------

NIX_REAL_LIB = ROOT / "scripts/nix-real-lib"


def stand_in_lib(tmp_path: Path) -> Path:
    """A directory that looks like a nixpkgs lib to scripts/nix-real-lib, and stand-ins for
    nixpkgs' litellm module and llama-cpp recipe beside it, for tests that evaluate none."""
    lib = tmp_path / "lib"
    lib.mkdir(parents=True)
    for name in ("default.nix", "modules.nix"):
        (lib / name).write_text("{ }\n")
    (tmp_path / "litellm.nix").write_text("{ }\n")
    (tmp_path / "llama-cpp.nix").write_text("{ }\n")
    return lib


def nix_real_lib(tmp_path: Path, env: dict[str, str], *pytest_args: str) -> str:
    """scripts/nix-real-lib on a stand-in lib directory, for tests that do not evaluate it."""
    lib = stand_in_lib(tmp_path)
    env = {
        **env,
        "LLAMANIX_NIXPKGS_LITELLM": str(tmp_path / "litellm.nix"),
        "LLAMANIX_NIXPKGS_LLAMA_CPP": str(tmp_path / "llama-cpp.nix"),
    }
    proc = subprocess.run(
        [str(NIX_REAL_LIB), str(lib), "-q", *pytest_args],
        capture_output=True,
        text=True,
        check=False,
        env=env,
        # A full llama-server build takes far longer: before the fix this ran into it.
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_nix_real_lib_uses_the_recorded_probe_and_builds_nothing(tmp_path: Path) -> None:
    """No llama-server built (an empty cache, no $LLAMANIX_LLAMA_SERVER): the script says so,
    its render tests pass on the recorded probe, and nothing lands in the cache."""
    cache = tmp_path / "cache"
    cache.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("LLAMANIX_LLAMA_SERVER", "LLAMANIX_RECORDED_PROBE")
    }
    out = nix_real_lib(tmp_path, {**env, "LLAMANIX_CACHE": str(cache)}, "-k", "test_render_command")
    lines = out.splitlines()
    assert lines[1] == (
        "nix-real-lib: no llama-server is built, and none will be: the render tests use the probe "
        "recorded in tests/data/help/upstream-0c1e570.*, and the tests that run llama-server are "
        "skipped (scripts/build-llama-server builds one)"
    )
    assert re.search(r"^4 passed", lines[-1]), out
    assert list(cache.iterdir()) == []
    # A test that runs llama-server is left out rather than building one.
    selected = "probes_a_built or render_command_usage"
    out = nix_real_lib(
        tmp_path / "again", {**env, "LLAMANIX_CACHE": str(cache)}, "--co", "-k", selected
    )
    assert [line for line in out.splitlines() if "::" in line] == [
        "tests/test_nix.py::test_render_command_usage"
    ]


def test_nix_real_lib_probes_a_built_llama_server(tmp_path: Path, llama_server_bin: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "LLAMANIX_RECORDED_PROBE"}
    env["LLAMANIX_LLAMA_SERVER"] = str(llama_server_bin)
    out = nix_real_lib(tmp_path, env, "-k", "test_render_command_usage")
    assert out.splitlines()[1] == (
        f"nix-real-lib: the render tests probe the llama-server at {llama_server_bin}"
    )


def test_nix_real_lib_needs_nixpkgs_litellm_module(tmp_path: Path) -> None:
    """The gateway's checks load nixpkgs' own litellm.nix: without it the script stops in one
    line rather than checking against a stand-in; a nixpkgs checkout brings its own."""
    lib = stand_in_lib(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "LLAMANIX_NIXPKGS_LITELLM"}
    env["LLAMANIX_NIXPKGS_LLAMA_CPP"] = str(tmp_path / "llama-cpp.nix")
    proc = subprocess.run(
        [str(NIX_REAL_LIB), str(lib)], capture_output=True, text=True, check=False, env=env
    )
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"{NIX_REAL_LIB}: nixpkgs' nixos/modules/services/misc/litellm.nix is needed (the "
        "gateway's checks load it); pass a nixpkgs checkout, or set LLAMANIX_NIXPKGS_LITELLM to "
        "that file of NixOS/nixpkgs"
    ]
    module = tmp_path / "nixos/modules/services/misc/litellm.nix"
    module.parent.mkdir(parents=True)
    module.write_text("{ }\n")
    proc = subprocess.run(
        [str(NIX_REAL_LIB), str(tmp_path), "-q", "-k", "test_render_command_usage"],
        capture_output=True,
        text=True,
        check=False,
        env={**env, "LLAMANIX_RECORDED_PROBE": "upstream-0c1e570"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    digest = hashlib.sha256(module.read_bytes()).hexdigest()
    assert proc.stdout.splitlines()[0].endswith(
        f"with nixpkgs' litellm module {module} (sha256 {digest})"
    )


def test_nix_real_lib_needs_nixpkgs_llama_cpp_recipe(tmp_path: Path) -> None:
    """The variants override nixpkgs' own llama-cpp recipe: without it the script stops in one
    line; each file given is named with its hash (the record the test checks it against)."""
    lib = stand_in_lib(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "LLAMANIX_NIXPKGS_LLAMA_CPP"}
    env["LLAMANIX_NIXPKGS_LITELLM"] = str(tmp_path / "litellm.nix")
    proc = subprocess.run(
        [str(NIX_REAL_LIB), str(lib)], capture_output=True, text=True, check=False, env=env
    )
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"{NIX_REAL_LIB}: nixpkgs' pkgs/by-name/ll/llama-cpp/package.nix is needed (the "
        "variants override it); pass a nixpkgs checkout, or set LLAMANIX_NIXPKGS_LLAMA_CPP to "
        "that file of NixOS/nixpkgs"
    ]
    missing = tmp_path / "nowhere.nix"
    proc = subprocess.run(
        [str(NIX_REAL_LIB), str(lib)],
        capture_output=True,
        text=True,
        check=False,
        env={**env, "LLAMANIX_NIXPKGS_LLAMA_CPP": f"{tmp_path / 'llama-cpp.nix'}:{missing}"},
    )
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"{NIX_REAL_LIB}: LLAMANIX_NIXPKGS_LLAMA_CPP: {missing} is not a file (nixpkgs' "
        "pkgs/by-name/ll/llama-cpp/package.nix)"
    ]
    recipe = tmp_path / "pkgs/by-name/ll/llama-cpp/package.nix"
    recipe.parent.mkdir(parents=True)
    recipe.write_text("{ }\n")
    (tmp_path / "nixos/modules/services/misc").mkdir(parents=True)
    (tmp_path / "nixos/modules/services/misc/litellm.nix").write_text("{ }\n")
    env.pop("LLAMANIX_NIXPKGS_LITELLM")
    proc = subprocess.run(
        [str(NIX_REAL_LIB), str(tmp_path), "-q", "-k", "test_render_command_usage"],
        capture_output=True,
        text=True,
        check=False,
        env={**env, "LLAMANIX_RECORDED_PROBE": "upstream-0c1e570"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    digest = hashlib.sha256(recipe.read_bytes()).hexdigest()
    assert (
        f"nix-real-lib: the variants override nixpkgs' llama-cpp recipe {recipe} (sha256 {digest})"
    ) in proc.stdout.splitlines()


@pytest.mark.skipif(not REAL_LIB, reason="set LLAMANIX_NIXPKGS_LIB to a nixpkgs lib/ directory")
def test_the_litellm_module_checked_against_is_recorded() -> None:
    """The nixpkgs litellm.nix the real evaluation loaded is one tests/data names, with its
    source: a newer one is recorded before its results are trusted."""
    record = json.loads((ROOT / "tests/data/nixpkgs-litellm.json").read_text())
    assert (record["repo"], record["path"], record["license"]) == (
        "NixOS/nixpkgs",
        "nixos/modules/services/misc/litellm.nix",
        "MIT",
    )
    module = Path(os.environ["LLAMANIX_NIXPKGS_LITELLM"])
    digest = hashlib.sha256(module.read_bytes()).hexdigest()
    assert digest in [c["sha256"] for c in record["checked"]], (
        f"{module} (sha256 {digest}) is not in tests/data/nixpkgs-litellm.json: record its "
        "commit there once the tests pass with it"
    )


def test_nix_real_lib_refuses_a_bad_llama_server_in_one_line(tmp_path: Path) -> None:
    lib = stand_in_lib(tmp_path)
    env = {
        **os.environ,
        "LLAMANIX_LLAMA_SERVER": str(tmp_path / "missing"),
        "LLAMANIX_NIXPKGS_LITELLM": str(tmp_path / "litellm.nix"),
        "LLAMANIX_NIXPKGS_LLAMA_CPP": str(tmp_path / "llama-cpp.nix"),
    }
    proc = subprocess.run(
        [str(NIX_REAL_LIB), str(lib)], capture_output=True, text=True, check=False, env=env
    )
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"nix-real-lib: LLAMANIX_LLAMA_SERVER: {tmp_path / 'missing'} is not an executable file "
        "(point LLAMANIX_LLAMA_SERVER at a built binary or unset it)"
    ]


# --- CUDA architectures against the CUDA release ----------------------------------------------


def cuda_problems(
    cuda: str, archs: list[str], system: str = "x86_64-linux", jetson: bool = False
) -> list[str]:
    spec = json.dumps({"cudaVersion": cuda, "cudaArchs": archs, "system": system})
    found: list[str] = lib_call(
        f"l.cudaArchProblems (builtins.fromJSON ''{spec}'' // "
        f"{{ capabilities = l.cudaCapabilities; jetsonPackages = {str(jetson).lower()}; }})"
    )
    return found


@pytest.mark.parametrize(
    ("cuda", "archs", "problem"),
    [
        ("12.8", ["8.6", "12.0"], None),
        ("12.8", ["12.0a", "10.0", "9.0a", "8.9"], None),
        # Ampere from 11.2, Blackwell's 10.0 from 12.7, as nixpkgs' database has them.
        ("11.2", ["8.0", "8.6"], None),
        (
            "11.1",
            ["8.6"],
            "compute capability 8.6 (Ampere) needs CUDA 11.2 or newer, this nixpkgs has "
            "cudaPackages 11.1; use .override { cudaPackages = cudaPackages_11_2; } (or newer)",
        ),
        ("12.7", ["10.0"], None),
        # B300 and the family-specific targets came with 12.9.
        (
            "12.8",
            ["8.6", "10.3"],
            "compute capability 10.3 (Blackwell) needs CUDA 12.9 or newer, this nixpkgs has "
            "cudaPackages 12.8; use .override { cudaPackages = cudaPackages_12_9; } (or newer)",
        ),
        (
            "12.8",
            ["12.0f"],
            "compute capability 12.0f (Blackwell) needs CUDA 12.9 or newer, this nixpkgs has "
            "cudaPackages 12.8; use .override { cudaPackages = cudaPackages_12_9; } (or newer)",
        ),
        ("12.9", ["10.3", "12.0f", "12.1"], None),
        (
            "12.8",
            ["12.1"],
            "compute capability 12.1 (Blackwell) needs CUDA 12.9 or newer, this nixpkgs has "
            "cudaPackages 12.8; use .override { cudaPackages = cudaPackages_12_9; } (or newer)",
        ),
        # ... and dropped everything before Turing.
        (
            "13.0",
            ["6.1"],
            "compute capability 6.1 (Pascal) was dropped after CUDA 12.9, and this nixpkgs has "
            "cudaPackages 13.0; use .override { cudaPackages = cudaPackages_12_9; }",
        ),
        (
            "12.0",
            ["3.7"],
            "compute capability 3.7 (Kepler) was dropped after CUDA 11.8, and this nixpkgs has "
            "cudaPackages 12.0; use .override { cudaPackages = cudaPackages_11_8; }",
        ),
        ("13.0", ["12.0", "7.5"], None),
        # `a` targets exist from Hopper on.
        ("12.8", ["8.6a"], "compute capability 8.6a is not one nixpkgs' CUDA packages know "),
    ],
)
def test_cuda_archs_are_checked_against_the_cuda_release(
    cuda: str, archs: list[str], problem: str | None
) -> None:
    found = cuda_problems(cuda, archs)
    if problem is None:
        assert found == []
    else:
        [message] = found
        assert message.startswith(problem), message


@pytest.mark.parametrize(
    ("cuda", "archs", "problem"),
    [
        # Xavier (7.2) went with CUDA 12.2.
        ("12.2", ["7.2"], None),
        (
            "12.3",
            ["7.2"],
            "compute capability 7.2 (Volta) was dropped after CUDA 12.2, and this nixpkgs has "
            "cudaPackages 12.3; use .override { cudaPackages = cudaPackages_12_2; }",
        ),
        ("12.9", ["10.1"], None),
        # CUDA 13.0 renamed Jetson Thor's 10.1 to 11.0, which older releases do not know.
        (
            "13.0",
            ["10.1a"],
            "compute capability 10.1a (Blackwell, Jetson Thor) is called 11.0a from CUDA 13.0 on, "
            'and this nixpkgs has cudaPackages 13.0; write "11.0a" instead',
        ),
        (
            "12.9",
            ["11.0"],
            "compute capability 11.0 (Blackwell) needs CUDA 13.0 or newer, this nixpkgs has "
            "cudaPackages 12.9; use .override { cudaPackages = cudaPackages_13_0; } (or newer)",
        ),
        ("13.0", ["11.0", "11.0a"], None),
        (
            "12.8",
            ["8.7", "8.6"],
            "Jetson compute capabilities (8.7) cannot be built together with others (8.6): "
            "nixpkgs' CUDA packages for Jetson are not those of other GPUs; build them as "
            "separate packages",
        ),
    ],
)
def test_jetson_capabilities_on_aarch64_with_jetson_packages(
    cuda: str, archs: list[str], problem: str | None
) -> None:
    found = cuda_problems(cuda, archs, "aarch64-linux", jetson=True)
    assert found == ([] if problem is None else [problem])


def test_jetson_capabilities_follow_nixpkgs_rules() -> None:
    """nixpkgs' _cuda/lib/flags.nix: Jetson capabilities only on aarch64-linux, and the Jetson
    CUDA packages only when nixpkgs' own config names them."""
    assert cuda_problems("12.8", ["8.7"], "x86_64-linux", jetson=True) == [
        "Jetson compute capabilities (8.7) are built only for aarch64-linux, and this is "
        "x86_64-linux; build them for the Jetson"
    ]
    assert cuda_problems("12.8", ["8.7"], "aarch64-linux", jetson=False) == [
        "Jetson compute capabilities (8.7) need nixpkgs' Jetson CUDA packages, which it picks "
        "only when its own config.cudaCapabilities names Jetson capabilities; set "
        'nixpkgs.config.cudaCapabilities = [ "8.7" ] and services.llamanix.useSystemNixpkgs = '
        "true"
    ]
    # GH200 and DGX Spark are not Jetsons.
    assert cuda_problems("12.9", ["9.0"], "aarch64-linux") == []
    assert cuda_problems("12.9", ["12.1"], "aarch64-linux") == []


NIXPKGS_CUDA = ROOT / "tests/data/nixpkgs-cuda-capabilities.json"


def test_the_cuda_table_is_nixpkgs_database() -> None:
    """nix/lib.nix's copy (for a nixpkgs without _cuda.db) has exactly the capabilities, CUDA
    ranges and Jetson flags of nixpkgs' cudaCapabilityToInfo, as recorded from its file."""
    record = json.loads(NIXPKGS_CUDA.read_text())
    assert (record["repo"], record["path"], record["license"]) == (
        "NixOS/nixpkgs",
        "pkgs/development/cuda-modules/_cuda/db/bootstrap/cuda.nix",
        "MIT",
    )
    assert lib_call("l.cudaCapabilities") == record["cudaCapabilityToInfo"]


NIXPKGS_CUDA_DB = os.environ.get("LLAMANIX_NIXPKGS_CUDA_DB", "")


@pytest.mark.skipif(
    not (REAL_LIB and NIXPKGS_CUDA_DB),
    reason="set LLAMANIX_NIXPKGS_LIB and LLAMANIX_NIXPKGS_CUDA_DB (nixpkgs' "
    "pkgs/development/cuda-modules/_cuda/db/bootstrap/cuda.nix)",
)
def test_the_recorded_cuda_database_is_nixpkgs_file() -> None:
    """The record is what nixpkgs' file evaluates to (with the real lib)."""
    expr = (
        f"let lib = import {REAL_LIB}; in builtins.mapAttrs (_: i: {{ inherit (i) archName "
        "minCudaMajorMinorVersion maxCudaMajorMinorVersion isJetson; }) "
        f"(import {NIXPKGS_CUDA_DB} {{ inherit lib; }}).cudaCapabilityToInfo"
    )
    argv = ["nix-instantiate", "--readonly-mode", "--eval", "--strict", "--json", "--expr", expr]
    found = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
    assert found == json.loads(NIXPKGS_CUDA.read_text())["cudaCapabilityToInfo"]


def test_every_arch_set_the_flake_builds_compiles_with_cuda_12_8() -> None:
    """The pinned nixpkgs has CUDA 12.8 or newer (docs/nixos.md): every package builds there."""
    for name, archs in lib_call("l.archSets").items():
        assert cuda_problems("12.8", archs) == [], name


def test_the_router_package_is_nixpkgs_llama_swap_by_mk_package_option(
    options: dict[str, Any],
) -> None:
    package = options["moduleRouterPackage"]
    assert package["type"] == {"name": "package"}  # not nullOr: lib.mkPackageOption's type
    assert package["defaultText"] == {"_type": "literalExpression", "text": "pkgs.llama-swap"}
    assert package["description"].startswith("The llama-swap package to use.")


@pytest.mark.parametrize(
    ("word", "choices"),
    [
        ("smal", ["big", "small"]),
        ("zzz", ["big", "small"]),
        ("a", ["ab", "ba"]),
        ("abcd", ["bcda", "dabc"]),
        ("qwen", ["qwen27b", "qwen35"]),
        ("qwen27", ["qwen27b", "qwen35b-a3b", "coder"]),
        ("reasonign", ["fast", "reasoning"]),
        ("embed", ["embedding", "embeddings"]),
        ("x", []),
        ("abcabcabc", ["cbacbacba", "abcxabc", "aabbcc"]),
    ],
)
def test_the_modules_suggestion_is_the_generators(word: str, choices: list[str]) -> None:
    expected = suggest(word, tuple(choices))
    found = lib_call(f"l.suggest \"{word}\" (builtins.fromJSON ''{json.dumps(choices)}'')")
    assert found == expected


def router_problems(router: dict[str, Any], instances: list[str]) -> list[str]:
    spec = json.dumps({"router": router, "instanceNames": instances})
    found: list[str] = lib_call(f"l.routerProblems (builtins.fromJSON ''{spec}'')")
    return found


def python_refusal(router: dict[str, Any], instances: list[str], tmp_path: Path) -> list[str]:
    """What `llamanix render` says at build time of the module's JSON for this router."""
    data = {
        "hosts": {"h": {"kind": "nixos", "router": router}},
        "instances": {
            name: {"model": f"/m/{name}.gguf", "port": 9000 + i} for i, name in enumerate(instances)
        },
    }
    with pytest.raises(UserError) as err:
        render_host(parse_config(data, str(tmp_path / "llamanix.json")), "h")
    return [
        f"{p.field}: {p.message}" + (f" ({p.fix})" if p.fix else "") for p in err.value.problems
    ]


@pytest.mark.parametrize(
    ("router", "instances"),
    [
        ({"kind": "llama-server", "members": ["reasoning", "fsat"]}, ["fast", "reasoning"]),
        ({"kind": "llama-server", "members": ["nothing", "fast"]}, ["fast", "reasoning"]),
        ({"kind": "llama-swap", "members": ["a"], "api_key_file": "/run/k"}, ["a"]),
    ],
    ids=["close-name", "far-name", "swap-key"],
)
def test_router_assertions_use_the_generators_words(
    tmp_path: Path, router: dict[str, Any], instances: list[str]
) -> None:
    """What the module asserts at evaluation is what `llamanix render` would refuse at build
    time, in the same words; only the field is named as a NixOS option."""
    assertions = router_problems(router, instances)
    generator = python_refusal(router, instances, tmp_path)
    assert [a.removeprefix("services.llamanix.") for a in assertions] == [
        g.removeprefix("hosts.h.") for g in generator
    ]
    assert all(a.startswith("services.llamanix.router.") for a in assertions)


def test_a_sound_router_asserts_nothing() -> None:
    assert router_problems({"kind": "llama-server", "members": ["a", "b"]}, ["a", "b", "c"]) == []
    assert (
        router_problems({"kind": "llama-swap", "members": ["a"], "api_key_file": None}, ["a"]) == []
    )
    assert lib_call("l.routerProblems { router = null; instanceNames = [ ]; }") == []


def firewall_warnings(
    instances: dict[str, Any],
    router: dict[str, Any] | None,
    gateway: dict[str, Any] | None = None,
    firewall: dict[str, Any] | None = None,
) -> list[str]:
    spec = json.dumps(
        {"instances": instances, "router": router, "gateway": gateway, "firewall": firewall}
    )
    found: list[str] = lib_call(f"l.firewallWarnings (builtins.fromJSON ''{spec}'')")
    return found


def test_firewall_settings_that_open_nothing_warn() -> None:
    def inst(listen: str, port: int, opened: bool = True) -> dict[str, Any]:
        return {"listen": listen, "port": port, "openFirewall": opened}

    router = {"members": ["m"], "listen": "127.0.0.1", "port": 8080, "openFirewall": True}
    found = firewall_warnings(
        {
            "lo": inst("127.0.0.2", 8081),
            "six": inst("::1", 8082),
            "any": inst("0.0.0.0", 8083),
            "closed": inst("127.0.0.1", 8084, opened=False),
            "m": inst("0.0.0.0", 8085),
        },
        router,
    )
    assert found == [
        "services.llamanix: port 8081 is opened in the firewall but the instance listens on "
        "127.0.0.2 only.",
        "services.llamanix: port 8082 is opened in the firewall but the instance listens on ::1 "
        "only.",
        "services.llamanix.instances.m.openFirewall: m is a member of the router, which gives it "
        "an internal port on 127.0.0.1, so nothing is opened for it; open the router's port "
        "instead (services.llamanix.router.openFirewall).",
        "services.llamanix: port 8080 is opened in the firewall but the router listens on "
        "127.0.0.1 only (set services.llamanix.router.listen).",
    ]
    # A router others can reach, opened: nothing to say.
    assert firewall_warnings({"any": inst("0.0.0.0", 8083)}, router | {"listen": "0.0.0.0"}) == []


def test_a_listener_the_firewall_keeps_closed_warns() -> None:
    """The opposite: an instance, router or gateway beyond loopback whose port no firewall rule
    opens cannot be reached from another machine (another host's gateway, say)."""

    def inst(listen: str, port: int) -> dict[str, Any]:
        return {"listen": listen, "port": port, "openFirewall": False}

    instances = {"any": inst("0.0.0.0", 8083), "lo": inst("127.0.0.1", 8084), "m": inst("::", 1)}
    router = {"members": ["m"], "listen": "10.0.0.5", "port": 8080, "openFirewall": False}
    gateway = {"listen": "::", "port": 4000, "openFirewall": False}
    firewall: dict[str, Any] = {"enable": True, "allowedTCPPorts": [22]}
    assert firewall_warnings(instances, router, gateway, firewall) == [
        "services.llamanix.instances.any: the instance listens on 0.0.0.0, but the firewall keeps "
        "port 8083 closed, so no other machine reaches it (set "
        "services.llamanix.instances.any.openFirewall = true, or listen on 127.0.0.1).",
        "services.llamanix.router: the router listens on 10.0.0.5, but the firewall keeps port "
        "8080 closed, so no other machine reaches it (set services.llamanix.router.openFirewall "
        "= true, or listen on 127.0.0.1).",
        "services.llamanix.gateway: LiteLLM listens on ::, but the firewall keeps port 4000 "
        "closed, so no other machine reaches it (set services.llamanix.gateway.openFirewall = "
        "true, or listen on 127.0.0.1).",
    ]
    # Opened by any rule, or no firewall at all: nothing to say.
    for opened in (
        {"enable": False},
        {"allowedTCPPorts": [8083, 8080, 4000]},
        {"allowedTCPPortRanges": [{"from": 4000, "to": 9000}]},
        {"interfaces": {"eth0": {"allowedTCPPorts": [8083, 8080, 4000]}}},
    ):
        assert firewall_warnings(instances, router, gateway, firewall | opened) == [], opened
    # A gateway opened on loopback opens nothing, as an instance's port.
    assert firewall_warnings({}, None, gateway | {"listen": "::1", "openFirewall": True}) == [
        "services.llamanix: port 4000 is opened in the firewall but the gateway listens on ::1 "
        "only (set services.llamanix.gateway.listen)."
    ]


def test_the_flake_module_is_one_module_however_often_imported() -> None:
    """nixosModules.default names itself by key (and _file, for messages): the module system
    keeps one module per key, so a second import defines nothing twice."""
    proc = flake_outputs("moduleIdentity")
    assert proc.returncode == 0, proc.stderr
    name = "/nix/store/00000000000000000000000000000000-source/flake.nix#nixosModules.default"
    assert json.loads(proc.stdout) == {"key": name, "_file": name}


@pytest.mark.skipif(not REAL_LIB, reason="set LLAMANIX_NIXPKGS_LIB to a nixpkgs lib/ directory")
def test_every_module_gets_the_flake_as_llamanix_without_special_args() -> None:
    """The docs write modules `{ llamanix, ... }:` and pass no specialArgs: the flake's module
    hands every module the flake; a llamanix of the user's own takes its place, no conflict."""
    proc = flake_outputs("llamanixArgument")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {
        "flake": "/nix/store/00000000000000000000000000000000-source",
        "own": "the user's",
        "special": "specialArgs'",
    }


@pytest.mark.skipif(not REAL_LIB, reason="set LLAMANIX_NIXPKGS_LIB to a nixpkgs lib/ directory")
def test_importing_the_flake_module_twice_evaluates() -> None:
    proc = flake_outputs("importedTwice")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {
        "packageSet": "the system's llamanix package set",
        # The overlay is added once.
        "overlays": 1,
        "failed": [],
    }
