"""Both front ends render the same thing.

For every example and every config in tests/data/configs, and every host in it: `llamanix render`
of the TOML writes the same units, argv files and manifest as the NixOS path, i.e.
`llamanix.lib.fromToml` -> services.llamanix -> the module's JSON -> modules/render-units.sh.
Only what differs by construction is set aside: the binary (a flake package on NixOS, the host
table's `binaries` otherwise), the header line naming the source file and its hash, and the
manifest's host kind and config hash (the module's JSON is a different text than the TOML).

The binary the module picks is checked on its own: it is the package of the instance's variant
built for the host table's `cuda_archs`, so the TOML's architectures reach the build.

CI evaluates the module path with the stub lib. With LLAMANIX_NIXPKGS_LIB set to a real nixpkgs
lib/ directory (scripts/nix-real-lib), the real modules/llamanix.nix is evaluated by
lib.evalModules instead, beside nixpkgs' own services.litellm module (LLAMANIX_NIXPKGS_LITELLM,
its nixos/modules/services/misc/litellm.nix), and the stub's answer is compared with the real one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from recorded_help import RECORDED_PROBE, probe_of, recorded, write_probe

from llamanix.config.model import load_config
from llamanix.core.probe import parse_capabilities
from llamanix.external import systemd_analyze

ROOT = Path(__file__).resolve().parent.parent
RENDER_UNITS = ROOT / "modules/render-units.sh"
REAL_LIB = os.environ.get("LLAMANIX_NIXPKGS_LIB", "")
# nixpkgs' nixos/modules/services/misc/litellm.nix, which the real evaluation loads (never
# committed: scripts/nix-real-lib says where it comes from).
LITELLM_MODULE = os.environ.get("LLAMANIX_NIXPKGS_LITELLM", "")
CONFIGS = sorted(
    [*(ROOT / "examples").glob("*.toml"), *(ROOT / "tests/data/configs").glob("*.toml")]
)

pytestmark = pytest.mark.skipif(shutil.which("nix-instantiate") is None, reason="needs Nix")


def hosts_of(path: Path) -> list[tuple[Path, str]]:
    cfg = load_config(path)
    # User units have no NixOS counterpart: the module only makes system units. A host without
    # instances (a gateway's) has no units to compare; its gateway is tested below.
    return [
        (path, name)
        for name, host in cfg.hosts.items()
        if host.kind != "systemd-user" and cfg.instances_on(name)
    ]


CASES = [case for path in CONFIGS for case in hosts_of(path)]


def module_eval_proc(
    toml: Path,
    host: str,
    lib_path: str,
    *,
    nvidia: bool = False,
    cuda_capabilities: list[str] | None = None,
    llama_swap: bool = True,
    attr: str | None = None,
    litellm_module: str | None = None,
    litellm_version: str | None = None,
    extra: dict[str, Any] | None = None,
    system: dict[str, Any] | None = None,
) -> subprocess.CompletedProcess[str]:
    """tests/nix/module-eval.nix; with a real lib, nixpkgs' litellm module beside the module
    (`litellm_module`: another file, or "none" for a NixOS without it), and `system`, one more
    module of the system (what else the host sets)."""
    argv = ["nix-instantiate", "--readonly-mode", "--eval", "--strict", "--json"]
    argv += [str(ROOT / "tests/nix/module-eval.nix"), "--argstr", "toml", str(toml)]
    argv += ["--argstr", "host", host, "--argstr", "libPath", lib_path]
    if lib_path:
        module = LITELLM_MODULE if litellm_module is None else litellm_module
        argv += ["--argstr", "litellmModule", module]
    argv += ["--argstr", "nvidia", "true" if nvidia else "false"]
    argv += ["--argstr", "cudaCapabilities", json.dumps(cuda_capabilities)]
    argv += ["--argstr", "llamaSwap", "true" if llama_swap else "false"]
    if litellm_version is not None:
        argv += ["--argstr", "litellmVersion", litellm_version]
    if extra is not None:
        argv += ["--argstr", "extra", json.dumps(extra)]
    if system is not None:
        argv += ["--argstr", "module", json.dumps(system)]
    argv += ["-A", attr] if attr else []
    return subprocess.run(argv, capture_output=True, text=True, check=False)


def module_eval(
    toml: Path,
    host: str,
    lib_path: str,
    *,
    nvidia: bool = False,
    cuda_capabilities: list[str] | None = None,
    attr: str | None = None,
    litellm_module: str | None = None,
    litellm_version: str | None = None,
    extra: dict[str, Any] | None = None,
    system: dict[str, Any] | None = None,
) -> Any:
    proc = module_eval_proc(
        toml,
        host,
        lib_path,
        nvidia=nvidia,
        cuda_capabilities=cuda_capabilities,
        attr=attr,
        litellm_module=litellm_module,
        litellm_version=litellm_version,
        extra=extra,
        system=system,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def beellama_capabilities(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """BeeLlama's probe, from the --help recorded from a local CPU build (tests/data/README.md)."""
    help_dir = ROOT / "tests/data/help"
    caps = parse_capabilities(
        "llama-server",
        (help_dir / "beellama-ba1fdce.version.txt").read_text(),
        (help_dir / "beellama-ba1fdce.help.txt").read_text(),
    )
    path = tmp_path_factory.mktemp("probe") / "beellama.json"
    path.write_text(json.dumps(caps.to_json()))
    return path


# With a recorded probe (scripts/nix-real-lib, no llama-server built) both front ends render
# against it.
if RECORDED_PROBE:

    @pytest.fixture(scope="module")
    def capabilities(tmp_path_factory: pytest.TempPathFactory) -> Path:
        path = tmp_path_factory.mktemp("probe") / "capabilities.json"
        return write_probe(recorded(RECORDED_PROBE), path)

else:

    @pytest.fixture(scope="module")
    def capabilities(tmp_path_factory: pytest.TempPathFactory, llama_server_bin: Path) -> Path:
        return probe_of(llama_server_bin, tmp_path_factory.mktemp("probe") / "capabilities.json")


def llamanix_path() -> str:
    llamanix = shutil.which("llamanix")
    assert llamanix, "the llamanix command is not on PATH (pip install -e .)"
    return f"{Path(llamanix).parent}{os.pathsep}{os.environ.get('PATH', '')}"


def rendered(out: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(out.rglob("*")) if p.is_file()}


def normalised(files: dict[str, str]) -> dict[str, Any]:
    """Set aside what differs by construction (see the module docstring)."""
    manifest = json.loads(files["manifest.json"])
    binaries = {name: inst["argv"][0] for name, inst in manifest["instances"].items()}
    if "router" in manifest:
        # llama-server's router runs its members' binary, which differs the same way.
        binaries["router"] = manifest["router"]["argv"][0]
        manifest["router"]["argv"] = ["BINARY", *manifest["router"]["argv"][1:]]
    out: dict[str, Any] = {}
    for name, text in files.items():
        # llama-swap's commands name each member's binary, which differs the same way.
        text = re.sub(r'cmd: "\S+ ', 'cmd: "BINARY ', text)
        if name.endswith((".yaml", ".ini")):
            out[name] = text
        elif name == "llamanix-exporter.service":
            # No llama-server in it; line 1 names the source, as for the instances, and the
            # command reads the config it was rendered from (the TOML, or the module's JSON).
            body = text.split("\n", 1)[1]
            # It reads the config as a credential, and the records beside it in a bind.
            body = re.sub(r"LoadCredential=config\.(toml|json):\S+", "LoadCredential=CONFIG", body)
            body = re.sub(r"BindReadOnlyPaths=-\S+:", "BindReadOnlyPaths=-STATE:", body)
            out[name] = re.sub(r" metrics \S+ ", " metrics CONFIG ", body)
        elif name.endswith(".service"):
            instance = name.removeprefix("llamanix-").removesuffix(".service")
            body = text.split("\n", 1)[
                1
            ]  # line 1: "# Generated by llamanix from SOURCE (config H)."
            exec_start = f"\nExecStart={binaries[instance]} "
            assert exec_start in body, name
            out[name] = body.replace(exec_start, "\nExecStart=BINARY ")
        elif name.endswith(".argv.json"):
            argv = json.loads(text)
            out[name] = ["BINARY", *argv[1:]]
    for inst in manifest["instances"].values():
        inst["argv"] = ["BINARY", *inst["argv"][1:]]
    out["manifest.json"] = {k: v for k, v in manifest.items() if k not in ("kind", "config_hash")}
    return out


@pytest.mark.parametrize(("toml", "host"), CASES, ids=[f"{p.stem}:{h}" for p, h in CASES])
def test_toml_and_module_render_the_same_units(
    tmp_path: Path, capabilities: Path, beellama_capabilities: Path, toml: Path, host: str
) -> None:
    cfg = load_config(toml)
    names = [inst.name for inst in cfg.instances_on(host)]
    # Each instance is checked against a probe of its own kind of binary.
    probe_of = {"beellama": beellama_capabilities}
    caps = [f"{n}={probe_of.get(cfg.instances[n].variant, capabilities)}" for n in names]
    env = {**os.environ, "PATH": llamanix_path()}

    direct = tmp_path / "direct"
    argv = ["llamanix", "render", str(toml), "--host", host, "--out", str(direct)]
    for spec in caps:
        argv += ["--capabilities", spec]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, env=env)
    assert proc.returncode == 0, proc.stderr

    evaluated = module_eval(toml, host, REAL_LIB)
    # The host table's GPU sandbox reaches the module (its default where the table has none).
    assert evaluated["config"]["hosts"][host]["gpu_sandbox"] == cfg.hosts[host].gpu_sandbox
    module_json = tmp_path / "llamanix.json"
    module_json.write_text(json.dumps(evaluated["config"]))
    via_module = tmp_path / "module"
    proc = subprocess.run(
        ["bash", str(RENDER_UNITS), str(module_json), host, str(via_module), *caps],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr

    direct_files, module_files = rendered(direct), rendered(via_module)
    assert sorted(direct_files) == sorted(module_files)
    # The module links each file the render writes under /etc/llamanix, one by one: the
    # directory stays one where a key file can live beside them.
    shared = sorted(p.name for p in (via_module / "share/llamanix").iterdir())
    assert sorted(evaluated["etc"]) == [f"llamanix/{name}" for name in shared]
    router = cfg.hosts[host].router
    members = router.members if router else ()
    assert sorted(n for n in direct_files if n.endswith(".service")) == sorted(
        [f"llamanix-{name}.service" for name in names if name not in members]
        + (["llamanix-router.service"] if router else [])
        + (["llamanix-exporter.service"] if cfg.metrics is not None else [])
    )
    assert normalised(direct_files) == normalised(module_files)

    # The module's binary is the variant's package built for the TOML's cuda_archs.
    # Absent from the host table: the module's default for a host without the NVIDIA driver
    # (module_eval's), the CPU.
    host_archs = cfg.raw["hosts"][host].get("cuda_archs", [])
    manifest = json.loads(module_files["manifest.json"])
    for name in names:
        variant = cfg.instances[name].variant
        archs = list(host_archs)
        assert evaluated["cudaArchs"][name] == archs, name
        # The binary the module hands the generator for each instance (routed or not).
        binary = evaluated["config"]["instances"][name]["binary"]
        assert binary == (
            "/nix/store/00000000000000000000000000000000-"
            f"llama-cpp-{variant}-{'_'.join(archs)}/bin/llama-server"
        )
        # ... and what its unit runs: its own, or (llama-server) the router's, with that binary.
        if name not in members:
            assert manifest["instances"][name]["argv"][0] == binary
        elif router is not None and router.kind == "llama-server":
            assert manifest["router"]["argv"][0] == binary


@pytest.mark.parametrize(
    "example", sorted((ROOT / "examples").glob("*.toml")), ids=lambda p: p.stem
)
def test_examples_keep_their_cuda_archs(example: Path) -> None:
    cfg = load_config(example)
    # Every host that serves (a fleet's gateway box serves no instance and builds nothing).
    serving = [(name, host) for name, host in cfg.hosts.items() if cfg.instances_on(name)]
    assert serving
    for name, host in serving:
        assert host.cuda_archs, f"{example.name}: {name}: an example names its architectures"
        evaluated = module_eval(example, name, REAL_LIB)
        assert evaluated["config"]["hosts"][name]["cuda_archs"] == list(host.cuda_archs)
        assert set(map(tuple, evaluated["cudaArchs"].values())) == {host.cuda_archs}
        if host.gpu:
            assert evaluated["config"]["hosts"][name]["gpu"] == host.gpu


@pytest.mark.skipif(not REAL_LIB, reason="set LLAMANIX_NIXPKGS_LIB to a nixpkgs lib/ directory")
@pytest.mark.parametrize(("toml", "host"), CASES, ids=[f"{p.stem}:{h}" for p, h in CASES])
def test_stub_and_real_lib_agree(toml: Path, host: str) -> None:
    """The stub CI uses gives the same module JSON and option tree as nixpkgs' own lib."""
    real = module_eval(toml, host, REAL_LIB)
    stub = module_eval(toml, host, "")
    assert stub["config"] == real["config"]
    assert stub["cudaArchs"] == real["cudaArchs"]
    argv = ["nix-instantiate", "--readonly-mode", "--eval", "--strict", "--json"]
    options = json.loads(
        subprocess.run(
            [*argv, str(ROOT / "tests/nix/options.nix")], capture_output=True, text=True, check=True
        ).stdout
    )
    assert sorted(real["options"]["top"]) == sorted(options["moduleTopOptions"])
    assert sorted(real["options"]["instance"]) == sorted(options["moduleInstanceOptions"])
    assert sorted(real["options"]["speculative"]) == sorted(options["moduleSpeculativeOptions"])


@pytest.mark.parametrize(
    "lib_path", ["", REAL_LIB] if REAL_LIB else [""], ids=["stub", "real"][: 2 if REAL_LIB else 1]
)
@pytest.mark.parametrize(
    ("nvidia", "capabilities", "archs"),
    [
        (False, None, []),
        (True, None, ["8.6", "12.0"]),
        # nixpkgs' own cudaCapabilities win over llamanix's default: an A100 with a T4 beside.
        (True, ["7.5", "8.0"], ["7.5", "8.0"]),
        (False, ["9.0"], ["9.0"]),
        # nixpkgs declares the setting with [ ] for "not set".
        (True, [], ["8.6", "12.0"]),
    ],
    ids=["cpu", "nvidia", "nixpkgs-capabilities", "capabilities-without-driver", "unset"],
)
def test_cuda_archs_default_to_nixpkgs_then_the_driver_then_the_cpu(
    tmp_path: Path, lib_path: str, nvidia: bool, capabilities: list[str] | None, archs: list[str]
) -> None:
    """The CUDA architectures a host builds for, when neither it nor its TOML names them:
    nixpkgs' config.cudaCapabilities where the system sets it, else llamanix's default with the
    NVIDIA driver; a host without either must not start a multi-hour CUDA build."""
    source = ROOT / "tests/data/configs/draft-and-key.toml"
    text = "\n".join(
        line for line in source.read_text().splitlines() if not line.startswith("cuda_archs")
    )
    toml = tmp_path / "no-archs.toml"
    toml.write_text(text + "\n")
    name = "gpu5090"
    assert load_config(toml).hosts[name].cuda_archs == ()
    evaluated = module_eval(toml, name, lib_path, nvidia=nvidia, cuda_capabilities=capabilities)
    assert set(map(tuple, evaluated["cudaArchs"].values())) == {tuple(archs)}
    assert evaluated["config"]["hosts"][name].get("cuda_archs", []) == archs


def waited_for(boot: dict[str, Any], target: str) -> set[str]:
    """The units `target` is not reached before, by systemd.target(5): a target is ordered
    after each unit it wants or requires when both keep their default dependencies and the unit
    is not ordered before it; a target it waits for passes on what that one waits for. NixOS'
    own targets keep their default dependencies."""
    units = {f"{n}.service": u for n, u in boot["services"].items()}
    units |= {f"{n}.target": u for n, u in boot["targets"].items()}

    def defaults(name: str) -> bool:
        return bool(units[name]["defaultDependencies"]) if name in units else True

    out: set[str] = set()
    todo = [target]
    while todo:
        waiting = todo.pop()
        for name, unit in units.items():
            wanted = waiting in unit["wantedBy"] + unit["requiredBy"]
            ordered = defaults(waiting) and defaults(name) and waiting not in unit["before"]
            if wanted and ordered and name not in out:
                out.add(name)
                todo.append(name)
    return out


def started_at_boot(boot: dict[str, Any], unit: str) -> bool:
    """Whether multi-user.target pulls the unit in, directly or through targets it wants."""
    units = {f"{n}.service": u for n, u in boot["services"].items()}
    units |= {f"{n}.target": u for n, u in boot["targets"].items()}
    wanted_by = units[unit]["wantedBy"] + units[unit]["requiredBy"]
    return "multi-user.target" in wanted_by or any(
        t in units and started_at_boot(boot, t) for t in wanted_by
    )


@pytest.mark.skipif(not REAL_LIB, reason="set LLAMANIX_NIXPKGS_LIB to a nixpkgs lib/ directory")
@pytest.mark.parametrize(
    ("toml", "host"),
    [(p, h) for p, h in CASES if p.parent.name == "examples"],
    ids=[f"{p.stem}:{h}" for p, h in CASES if p.parent.name == "examples"],
)
def test_boot_starts_the_servers_and_does_not_wait_for_them_to_serve(toml: Path, host: str) -> None:
    """A server's unit is started once it serves, which may take 20 minutes for a big model:
    multi-user.target (boot) must not wait for that. Boot still starts every server."""
    boot = module_eval(toml, host, REAL_LIB, attr="boot")
    cfg = load_config(toml)
    router = cfg.hosts[host].router
    members = router.members if router else ()
    servers = [
        f"llamanix-{i.name}.service" for i in cfg.instances_on(host) if i.name not in members
    ]
    servers += ["llamanix-router.service"] if router else []
    assert servers
    waited = waited_for(boot, "multi-user.target")
    assert not [s for s in servers if s in waited], waited
    assert all(started_at_boot(boot, s) for s in servers)


@pytest.mark.skipif(not REAL_LIB, reason="set LLAMANIX_NIXPKGS_LIB to a nixpkgs lib/ directory")
def test_a_routed_host_enables_the_router_unit_and_no_member_unit(tmp_path: Path) -> None:
    toml = ROOT / "tests/data/configs/router-llama-server.toml"
    evaluated = module_eval(toml, "gpu1", REAL_LIB)
    assert evaluated["units"] == ["llamanix-router"]
    assert evaluated["ports"] == []
    opened = tmp_path / "open.toml"
    opened.write_text(
        toml.read_text().replace("idle_ttl = 900\n", "idle_ttl = 900\nopenFirewall = true\n")
    )
    # openFirewall is an option of the module only (llamanix.toml has no such key); fromToml
    # passes the table on as it is, which is enough to see the port opened.
    assert module_eval(opened, "gpu1", REAL_LIB)["ports"] == [8080]


# --- the module's own checks, at evaluation (nixpkgs' lib.evalModules) -------------------------

needs_real_lib = pytest.mark.skipif(
    not REAL_LIB, reason="set LLAMANIX_NIXPKGS_LIB to a nixpkgs lib/ directory"
)


def routed_toml(tmp_path: Path, router: str, **instances: str) -> Path:
    """A NixOS host whose router table is `router` (TOML lines) over instances fast and
    reasoning (plus lines of their own); fromToml hands the tables to the module as they are."""
    text = '[hosts.gpu1]\nkind = "nixos"\n\n[hosts.gpu1.router]\n' + router + "\n"
    for name in ("fast", "reasoning"):
        text += f'\n[instances.{name}]\nmodel = "/m/{name}.gguf"\n' + instances.get(name, "")
    path = tmp_path / "llamanix.toml"
    path.write_text(text)
    return path


@needs_real_lib
@pytest.mark.parametrize(
    ("router", "failed"),
    [
        (
            'kind = "llama-server"\nmembers = ["reasoning", "fsat"]',
            ["services.llamanix.router.members: no instance 'fsat' (did you mean 'fast'?)"],
        ),
        (
            'kind = "llama-swap"\nmembers = ["fast"]\napi_key_file = "/run/keys/router"',
            [
                "services.llamanix.router.api_key_file: a llama-swap router cannot take a key file "
                "yet (its apiKeys would put the key into its config) (leave it out and keep the "
                'router on loopback, or use kind = "llama-server")'
            ],
        ),
        ('kind = "llama-swap"\nmembers = ["fast", "reasoning"]', []),
    ],
    ids=["member-not-an-instance", "swap-with-key", "sound"],
)
def test_router_mistakes_fail_the_evaluation(
    tmp_path: Path, router: str, failed: list[str]
) -> None:
    """Module assertions, so `nixos-rebuild` stops while evaluating, before any build."""
    toml = routed_toml(tmp_path, router)
    checks = module_eval(toml, "gpu1", REAL_LIB, attr="checks")
    assert checks["failed"] == failed
    proc = module_eval_proc(toml, "gpu1", REAL_LIB, attr="config")
    if failed:
        assert proc.returncode != 0
        assert failed[0] in " ".join(proc.stderr.split())
    else:
        assert proc.returncode == 0, proc.stderr


@needs_real_lib
def test_firewall_settings_that_open_nothing_warn_at_evaluation(tmp_path: Path) -> None:
    toml = routed_toml(
        tmp_path,
        'kind = "llama-server"\nmembers = ["fast"]\nport = 8080\nopenFirewall = true',
        fast='listen = "0.0.0.0"\nopenFirewall = true\n',
        reasoning="port = 8081\nopenFirewall = true\n",
    )
    assert module_eval(toml, "gpu1", REAL_LIB, attr="checks")["warnings"] == [
        "services.llamanix: port 8081 is opened in the firewall but the instance listens on "
        "127.0.0.1 only.",
        "services.llamanix.instances.fast.openFirewall: fast is a member of the router, which "
        "gives it an internal port on 127.0.0.1, so nothing is opened for it; open the router's "
        "port instead (services.llamanix.router.openFirewall).",
        "services.llamanix: port 8080 is opened in the firewall but the router listens on "
        "127.0.0.1 only (set services.llamanix.router.listen).",
    ]
    # Nothing of the member's is opened; the router's port and the plain instance's are.
    assert sorted(module_eval(toml, "gpu1", REAL_LIB, attr="ports")) == [8080, 8081]


@needs_real_lib
def test_router_package_is_nixpkgs_llama_swap_read_only_by_a_llama_swap_router(
    tmp_path: Path,
) -> None:
    package = module_eval(
        routed_toml(tmp_path, 'kind = "llama-server"\nmembers = ["fast"]'),
        "gpu1",
        REAL_LIB,
        attr="routerPackage",
    )
    assert (package["type"], package["defaultText"]) == ("package", "pkgs.llama-swap")
    # A nixpkgs without llama-swap evaluates a llama-server router ...
    server = routed_toml(tmp_path, 'kind = "llama-server"\nmembers = ["fast"]')
    proc = module_eval_proc(server, "gpu1", REAL_LIB, llama_swap=False, attr="config")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["hosts"]["gpu1"]["router"]["kind"] == "llama-server"
    # ... and says what is missing for a llama-swap router (lib.mkPackageOption's words).
    swap = routed_toml(tmp_path, 'kind = "llama-swap"\nmembers = ["fast"]')
    proc = module_eval_proc(swap, "gpu1", REAL_LIB, llama_swap=False, attr="config")
    assert proc.returncode != 0
    assert "llama-swap cannot be found in pkgs" in proc.stderr
    with_swap = module_eval(swap, "gpu1", REAL_LIB, attr="config")
    assert with_swap["hosts"]["gpu1"]["router"]["binary"] == (
        "/nix/store/00000000000000000000000000000000-llama-swap/bin/llama-swap"
    )


# --- the gateway on a NixOS host: nixpkgs' services.litellm ------------------------------------

GATEWAY_TOML = ROOT / "tests/data/fleet-gateway-nixos.toml"
LIB_PATHS = ["", REAL_LIB] if REAL_LIB else [""]
LIB_IDS = ["stub", "real"][: len(LIB_PATHS)]
# What the keys reach LiteLLM through: an environment file the keys unit writes.
KEYS_UNIT = "llamanix-gateway-keys"
ENVIRONMENT_FILE = f"/run/{KEYS_UNIT}/litellm.env"


def gateway_eval(
    lib_path: str,
    litellm_version: str | None = None,
    toml: Path = GATEWAY_TOML,
    extra: dict[str, Any] | None = None,
    litellm_module: str | None = None,
    system: dict[str, Any] | None = None,
) -> Any:
    return module_eval(
        toml,
        "box3",
        lib_path,
        attr="gateway",
        litellm_version=litellm_version,
        extra=extra,
        litellm_module=litellm_module,
        system=system,
    )


def gateway_toml(tmp_path: Path, old: str, new: str) -> Path:
    path = tmp_path / "llamanix.toml"
    text = GATEWAY_TOML.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    return path


@pytest.mark.parametrize("lib_path", LIB_PATHS, ids=LIB_IDS)
def test_the_module_gives_litellm_the_settings_python_renders(lib_path: str) -> None:
    from llamanix.render import gateway

    cfg = load_config(GATEWAY_TOML)
    assert cfg.hosts["box3"].kind == "nixos"
    evaluated = gateway_eval(lib_path)
    text = gateway.config_text(cfg)
    assert text.startswith("# Generated by llamanix")
    python = json.loads(text.split("\n", 1)[1])
    # nixpkgs' settings option has a default section, environment_variables, which the
    # plugin's settings fill.
    assert evaluated["settings"] == python
    assert [r["url"] for r in evaluated["replicas"]] == [
        d.api_base for d in gateway.deployments(cfg)
    ]
    # The replica on the gateway's own host (box3) is reached on loopback.
    assert evaluated["replicas"][-1]["url"] == "http://127.0.0.1:8080/v1"
    credentials = [
        "master-key:/run/secrets/llamanix-gateway-key",
        "key-qwen-b:/run/secrets/qwen-b-key",
        "key-qwen-c:/run/secrets/qwen-c-key",
    ]
    script = evaluated["keysUnit"]["scripts"]["ExecStart"] if lib_path else evaluated["keysScript"]
    for credential in credentials:
        name, path = credential.split(":")
        # Each key from its credential, the file named only where a key is refused.
        assert f" {name} {path}\n" in script
    assert evaluated["failed"] == []
    if lib_path:
        assert evaluated["keysUnit"]["serviceConfig"]["LoadCredential"] == credentials
        assert evaluated["service"] == {
            "enable": True,
            "host": "0.0.0.0",
            "port": 4000,
            "openFirewall": False,
            "package": "/nix/store/00000000000000000000000000000000-litellm",
            # nixpkgs' way to hand a service its secrets stays the user's: the keys are one
            # more EnvironmentFile= of the unit.
            "environmentFile": None,
        }
        assert evaluated["litellmUnit"]["serviceConfig"]["EnvironmentFile"] == [ENVIRONMENT_FILE]
        env = evaluated["litellmUnit"]["environment"]
        assert env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
        # llamanix's plugin, which the settings load as a callback: its directory alone.
        assert env["PYTHONPATH"].endswith("-litellm_plugin")
        # nixpkgs' telemetry-off default stays: the module does not define its option.
        assert env["DO_NOT_TRACK"] == "True"
    else:
        assert evaluated["loadCredential"] == credentials


@needs_real_lib
def test_the_nixos_gateway_restarts_waits_for_the_network_and_is_checked() -> None:
    """What the Debian gateway unit has: restart on failure, ordering after the network is
    online, and an ExecStartPost= that fails the start (and `nixos-rebuild switch`) when
    LiteLLM does not serve; and the keys unit before it."""
    evaluated = gateway_eval(REAL_LIB)
    unit = evaluated["litellmUnit"]
    config = unit["serviceConfig"]
    assert (config["Restart"], config["RestartSec"], config["TimeoutStartSec"]) == (
        "on-failure",
        "10s",
        180,
    )
    assert (unit["startLimitIntervalSec"], unit["startLimitBurst"]) == (600, 5)
    assert {"network-online.target", f"{KEYS_UNIT}.service"} <= set(unit["after"])
    assert unit["wants"] == ["network-online.target"]
    assert unit["requires"] == [f"{KEYS_UNIT}.service"]
    [ready] = unit["scripts"]["ExecStartPost"]
    stub = gateway_eval("")
    assert ready == stub["readyScript"]
    assert "http://127.0.0.1:4000/health/liveliness" in ready
    assert 'kill -0 "$MAINPID"' in ready
    keys = evaluated["keysUnit"]
    assert keys["before"] == ["litellm.service"] and keys["partOf"] == ["litellm.service"]
    assert keys["serviceConfig"]["Type"] == "oneshot"
    assert keys["serviceConfig"]["RemainAfterExit"] is True
    assert keys["serviceConfig"]["RuntimeDirectory"] == KEYS_UNIT
    assert keys["scripts"]["ExecStart"] == stub["keysScript"]


@needs_real_lib
def test_the_module_keeps_everything_nixpkgs_litellm_unit_has() -> None:
    """nixpkgs' ExecStart, ExecStartPre and hardening stay as nixpkgs' module alone makes them
    (no mkForce): the module only adds to the unit."""
    evaluated = gateway_eval(REAL_LIB)
    merged, alone = evaluated["litellmUnit"], evaluated["litellmAlone"]
    for key, value in alone["serviceConfig"].items():
        if key == "EnvironmentFile":
            # nixpkgs' list (the user's services.litellm.environmentFile), then the keys'.
            assert merged["serviceConfig"][key] == [*value, ENVIRONMENT_FILE]
            continue
        assert merged["serviceConfig"][key] == value, key
    assert merged["serviceConfig"]["ExecStart"].startswith(
        "/nix/store/00000000000000000000000000000000-litellm/bin/litellm --host "
    )
    assert merged["serviceConfig"]["EnvironmentFile"] == [ENVIRONMENT_FILE]
    added = set(merged["serviceConfig"]) - set(alone["serviceConfig"])
    assert added <= {"Restart", "RestartSec", "TimeoutStartSec", "ExecStartPost", "EnvironmentFile"}
    assert added >= {"Restart", "RestartSec", "TimeoutStartSec", "ExecStartPost"}
    assert set(alone["after"]) <= set(merged["after"])
    for key, value in alone["environment"].items():
        assert merged["environment"][key] == value, key


@needs_real_lib
def test_the_users_litellm_environment_file_stays_beside_the_keys() -> None:
    """services.litellm.environmentFile takes one file: the module leaves it to the user (a
    provider's key, say) and hands LiteLLM the keys as one more EnvironmentFile= of the unit."""
    own = "/run/secrets/litellm-providers.env"
    evaluated = gateway_eval(REAL_LIB, system={"services": {"litellm": {"environmentFile": own}}})
    assert evaluated["service"]["environmentFile"] == own
    files = evaluated["litellmUnit"]["serviceConfig"]["EnvironmentFile"]
    assert sorted(files) == sorted([own, ENVIRONMENT_FILE])
    assert evaluated["litellmAlone"]["serviceConfig"]["EnvironmentFile"] == [own]


@pytest.mark.parametrize("lib_path", LIB_PATHS, ids=LIB_IDS)
def test_a_compromised_litellm_package_is_refused_in_one_line(lib_path: str) -> None:
    assert gateway_eval(lib_path, "1.82.7")["failed"] == [
        "services.llamanix.gateway.package: LiteLLM 1.82.7 was a compromised release on PyPI "
        "and is refused (use a litellm package of another release)"
    ]


FIREWALL_WARNING = (
    "services.llamanix.gateway: LiteLLM listens on 0.0.0.0, but the firewall keeps port 4000 "
    "closed, so no other machine reaches it (set services.llamanix.gateway.openFirewall = true, "
    "or listen on 127.0.0.1)."
)


@needs_real_lib
def test_a_gateway_the_firewall_closes_warns_and_open_firewall_opens_it() -> None:
    """fromToml's gateway on 0.0.0.0 with the port closed says so; openFirewall, written beside
    fromToml, opens it through nixpkgs' services.litellm.openFirewall."""
    closed = gateway_eval(REAL_LIB)
    assert closed["warnings"] == [FIREWALL_WARNING]
    # docs/gateway.md shows this very line.
    assert FIREWALL_WARNING in (ROOT / "docs/gateway.md").read_text()
    assert module_eval(GATEWAY_TOML, "box3", REAL_LIB, attr="firewall") == []
    extra = {"gateway": {"openFirewall": True}}
    opened = gateway_eval(REAL_LIB, extra=extra)
    assert opened["warnings"] == []
    assert opened["service"]["openFirewall"] is True
    assert module_eval(GATEWAY_TOML, "box3", REAL_LIB, attr="firewall", extra=extra) == [4000]


def unit_file(path: Path, description: str, service_config: dict[str, Any]) -> Path:
    """A [Service] section as NixOS writes one from serviceConfig: a list is one line per
    item, a bool true or false."""
    lines = ["[Unit]", f"Description={description}", "", "[Service]"]
    for key, value in service_config.items():
        for item in value if isinstance(value, list) else [value]:
            text = ("true" if item else "false") if isinstance(item, bool) else str(item)
            lines.append(f"{key}={text}")
    path.write_text("\n".join(lines) + "\n")
    return path


@needs_real_lib
@pytest.mark.skipif(not systemd_analyze.available(), reason="needs systemd-analyze")
def test_the_gateway_keys_unit_is_hardened(tmp_path: Path) -> None:
    """The keys unit reads the key files only through its credentials and writes one file into
    its runtime directory: no root, no network, no devices. systemd-analyze scores the unit as
    NixOS writes it."""
    keys = gateway_eval(REAL_LIB)["keysUnit"]["serviceConfig"]
    assert keys["DynamicUser"] is True and "User" not in keys
    assert keys["CapabilityBoundingSet"] == "" and keys["RestrictAddressFamilies"] == "none"
    unit = unit_file(tmp_path / f"{KEYS_UNIT}.service", "keys", keys)
    exposure = systemd_analyze.security_exposure(unit)
    assert exposure is not None and exposure <= 1.0, exposure


def fake_litellm(version: str) -> dict[str, Any]:
    """A package as JSON: what NixOS' package type takes."""
    return {
        "type": "derivation",
        "name": f"litellm-{version}",
        "version": version,
        "outPath": f"/nix/store/00000000000000000000000000000000-litellm-{version}",
        "meta": {"mainProgram": "litellm"},
    }


@needs_real_lib
@pytest.mark.parametrize("where", ["services.litellm", "services.llamanix.gateway"])
def test_the_gateway_package_and_firewall_are_services_litellms(where: str) -> None:
    """gateway.package and gateway.openFirewall are aliases of nixpkgs' services.litellm
    options: set either way, it is services.litellm's value that runs, is checked and opens."""

    def set_(values: dict[str, Any]) -> dict[str, Any]:
        if where == "services.litellm":
            return {"system": {"services": {"litellm": values}}}
        return {"extra": {"gateway": values}}

    refused = gateway_eval(REAL_LIB, **set_({"package": fake_litellm("1.82.7")}))
    assert refused["failed"] == [
        "services.llamanix.gateway.package: LiteLLM 1.82.7 was a compromised release on PyPI "
        "and is refused (use a litellm package of another release)"
    ]
    chosen = gateway_eval(REAL_LIB, **set_({"package": fake_litellm("1.106.12")}))
    assert chosen["service"]["package"].endswith("-litellm-1.106.12")
    assert chosen["litellmUnit"]["serviceConfig"]["ExecStart"].startswith(
        "/nix/store/00000000000000000000000000000000-litellm-1.106.12/bin/litellm "
    )
    opened = gateway_eval(REAL_LIB, **set_({"openFirewall": True}))
    assert opened["service"]["openFirewall"] is True
    assert opened["warnings"] == []
    ports = module_eval(
        GATEWAY_TOML, "box3", REAL_LIB, attr="firewall", **set_({"openFirewall": True})
    )
    assert ports == [4000]


@needs_real_lib
def test_the_default_gateway_config_warns_of_nothing() -> None:
    """A config that names no LiteLLM version runs nixpkgs' package, whatever its release,
    without a warning (nixpkgs' release is never the pinned default)."""
    assert "version" not in load_config(GATEWAY_TOML).raw["gateway"]
    opened = {"gateway": {"openFirewall": True}}
    for version in ("1.80.0", "1.106.12"):
        assert gateway_eval(REAL_LIB, version, extra=opened)["warnings"] == [], version


@needs_real_lib
def test_a_package_of_another_version_than_the_config_names_warns(tmp_path: Path) -> None:
    toml = gateway_toml(tmp_path, 'kind = "litellm"\n', 'kind = "litellm"\nversion = "1.106.12"\n')
    opened = {"gateway": {"openFirewall": True}}
    assert gateway_eval(REAL_LIB, "1.80.0", toml, extra=opened)["warnings"] == [
        "services.llamanix.gateway.version: llamanix.toml names LiteLLM 1.106.12, but this "
        "NixOS runs nixpkgs' LiteLLM 1.80.0 (services.litellm.package), which "
        'validate did not check the config against (set version = "1.80.0" in [gateway], or '
        "pick a package of 1.106.12)"
    ]
    assert gateway_eval(REAL_LIB, "1.106.12", toml, extra=opened)["warnings"] == []


@needs_real_lib
def test_a_key_under_etc_llamanix_can_exist_on_a_host_that_also_serves(tmp_path: Path) -> None:
    """/etc/llamanix is a directory of single links, so a key file can be created beside them
    (the documented Debian path) on the NixOS host that serves and runs the gateway."""
    toml = gateway_toml(tmp_path, "/run/secrets/llamanix-gateway-key", "/etc/llamanix/gateway.key")
    etc = module_eval(toml, "box3", REAL_LIB, attr="etc")
    assert etc == ["llamanix/manifest.json", "llamanix/qwen-c.argv.json"]
    keys = gateway_eval(REAL_LIB, toml=toml)["keysUnit"]["serviceConfig"]["LoadCredential"]
    for credential in keys:
        path = credential.split(":", 1)[1]
        for entry in etc:
            linked = f"/etc/{entry}"
            assert path != linked and not path.startswith(linked + "/"), (path, entry)


FLEET_EXAMPLE = ROOT / "examples/fleet-rtx5090-rtx3090-gateway.toml"
PROMETHEUS_ON = {"services": {"prometheus": {"enable": True}}}


@needs_real_lib
def test_a_gateway_only_host_evaluates_with_prometheus_on() -> None:
    """The fleet example's gateway box serves no instance: fromToml turns the exporter on (the
    TOML has [metrics]), but the exporter, its drop-in and the Prometheus parts belong to hosts
    with instances, as `llamanix render` renders them. Its gateway evaluates in full."""
    cfg = load_config(FLEET_EXAMPLE)
    assert cfg.metrics is not None and not cfg.instances_on("gateway")
    found = module_eval(FLEET_EXAMPLE, "gateway", REAL_LIB, attr="prometheus", system=PROMETHEUS_ON)
    assert found == {"prometheus": {"enable": True}, "exporter": None}
    assert module_eval(FLEET_EXAMPLE, "gateway", REAL_LIB, attr="units", system=PROMETHEUS_ON) == [
        "litellm",
        KEYS_UNIT,
    ]
    assert module_eval(FLEET_EXAMPLE, "gateway", REAL_LIB, attr="etc", system=PROMETHEUS_ON) == []
    gateway = module_eval(FLEET_EXAMPLE, "gateway", REAL_LIB, attr="gateway", system=PROMETHEUS_ON)
    assert gateway["failed"] == []
    assert [r["instance"] for r in gateway["replicas"]] == ["qwen-3090", "qwen-5090"]
    # A host with instances still gets all of it.
    served = module_eval(
        FLEET_EXAMPLE, "gpu5090", REAL_LIB, attr="prometheus", system=PROMETHEUS_ON
    )
    assert served["exporter"]["overrideStrategy"] == "asDropin"
    [job] = served["prometheus"]["scrapeConfigs"]
    assert job["job_name"] == "llamanix"
    [rules] = served["prometheus"]["ruleFiles"]
    assert rules.endswith("/share/llamanix/prometheus/llamanix.rules.yml")


@needs_real_lib
def test_a_nixos_without_the_litellm_module_evaluates_without_a_gateway(tmp_path: Path) -> None:
    """Before NixOS 25.05 there is no services.litellm: a host without a gateway evaluates, and
    one with a gateway stops with the module's line instead of "option does not exist"."""
    router = ROOT / "tests/data/configs/router-llama-server.toml"
    config = module_eval(router, "gpu1", REAL_LIB, attr="config", litellm_module="none")
    assert config["hosts"]["gpu1"]["router"]["kind"] == "llama-server"
    assert gateway_eval(REAL_LIB, litellm_module="none")["failed"] == [
        "services.llamanix.gateway: this NixOS has no services.litellm, nixpkgs' LiteLLM "
        "module, which runs the gateway (use a nixpkgs of NixOS 25.05 or later, or run the "
        "gateway on a Debian host)"
    ]


def test_the_keys_unit_writes_litellms_environment_file(tmp_path: Path) -> None:
    """The keys unit's script, run as systemd runs it (credentials and a runtime directory):
    one NAME='key' line per key; a key an environment file cannot carry fails it, naming the
    file, and writes nothing."""
    script = tmp_path / "keys.sh"
    script.write_text(gateway_eval("")["keysScript"])
    creds, run = tmp_path / "credentials", tmp_path / "run"
    creds.mkdir()
    run.mkdir()
    env = {"PATH": os.environ["PATH"], "CREDENTIALS_DIRECTORY": str(creds)}
    env["RUNTIME_DIRECTORY"] = str(run)
    keys = {"master-key": "m-1\n", "key-qwen-b": "b.2", "key-qwen-c": "c_3\n\n"}
    for name, key in keys.items():
        (creds / name).write_text(key)
    proc = subprocess.run(["sh", str(script)], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    written = run / "litellm.env"
    assert written.read_text() == (
        "LITELLM_MASTER_KEY='m-1'\nLLAMANIX_KEY_QWEN_B='b.2'\nLLAMANIX_KEY_QWEN_C='c_3'\n"
    )
    assert written.stat().st_mode & 0o777 == 0o600
    written.unlink()
    for bad, why in (
        ("it's", "holds a quote"),
        ("a\nb", "holds a quote or a line break"),
        ("", "is empty"),
        # What core/api_key.py refuses on Debian: another file's secret is never sent.
        ("root:$y$j9T$FAKE:19000:0:99999:7:::", "is not a bearer token"),
        ("sk live 1", "is not a bearer token"),
    ):
        (creds / "key-qwen-c").write_text(bad)
        proc = subprocess.run(["sh", str(script)], env=env, capture_output=True, text=True)
        assert proc.returncode == 1
        assert why in proc.stderr and "/run/secrets/qwen-c-key" in proc.stderr
        assert not written.exists()


def nix_lib_value(expr: str) -> Any:
    lib = ROOT / "nix/lib.nix"
    argv = ["nix-instantiate", "--readonly-mode", "--eval", "--strict", "--json", "--expr"]
    proc = subprocess.run(
        [*argv, f"let lib = import {lib}; in {expr}"], capture_output=True, text=True, check=True
    )
    return json.loads(proc.stdout)


def test_nix_refuses_the_releases_python_refuses() -> None:
    from llamanix.core.schema import LITELLM_REFUSED

    assert nix_lib_value("lib.litellmRefused") == LITELLM_REFUSED


ADDRESSES = [
    ("0.0.0.0", "root@box1.lan", "box1"),
    ("0.0.0.0", "root@10.0.0.12:2222", "box2"),
    ("0.0.0.0", "[fd00::1]:22", "box2"),
    ("0.0.0.0", "root@fd00::1", "box2"),
    ("0.0.0.0", "ssh://admin@box5.lan:2222", "box5"),
    ("0.0.0.0", "ssh://box6", "box6"),
    ("0.0.0.0", "admin@[fd00::7]:2222", "box7"),
    ("0.0.0.0", None, "box4"),
    ("::", "gpu1", "gpu1"),
    ("[::]", None, "gpu1"),
    ("0:0::0", "gpu1", "gpu1"),
    ("10.0.0.5", "gpu1", "gpu1"),
    ("localhost", None, "gpu1"),
    ("LocalHost.", None, "gpu1"),
    ("[fd00::2]", None, "gpu1"),
    ("gpu1.lan", None, "gpu1"),
]


def test_nix_reaches_replicas_at_the_addresses_python_does() -> None:
    from llamanix.core.address import remote_host, url_host

    def nix(value: str | None) -> str:
        return "null" if value is None else json.dumps(value)

    exprs = [
        f"lib.urlHost (lib.remoteHost {nix(listen)} {nix(target)} {nix(host)})"
        for listen, target, host in ADDRESSES
    ]
    got = nix_lib_value("[ " + " ".join(f"({e})" for e in exprs) + " ]")
    assert got == [url_host(remote_host(*case)) for case in ADDRESSES]
    names = ["qwen-b", "a.b c", "x9"]
    from llamanix.core.api_key import key_env

    assert nix_lib_value(f"map lib.gatewayKeyEnv {json.dumps(names).replace(',', ' ')}") == [
        key_env(n) for n in names
    ]


def test_nix_checks_the_liveliness_url_python_checks() -> None:
    """The NixOS gateway's ExecStartPost= asks the URL the Debian unit's does."""
    from llamanix.core.address import connect_url

    listens = ["0.0.0.0", "::", "[::]", "127.0.0.1", "localhost", "10.0.0.5", "fd00::2"]
    exprs = [f'(lib.gatewayLivelinessUrl {{ listen = "{h}"; port = 4000; }})' for h in listens]
    assert nix_lib_value("[ " + " ".join(exprs) + " ]") == [
        connect_url(h, 4000) + "/health/liveliness" for h in listens
    ]
