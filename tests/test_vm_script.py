"""The NixOS VM test (tests/vm.nix) as far as it can be checked without nixpkgs or KVM.

- The test script the driver gets (vm-test-script.py plus vm.nix's call line, taken from an
  evaluation of vm.nix) compiles, references no undefined names except the driver's globals
  (ruff, the way the driver itself lints it with pyflakes), and type-checks against the
  driver's machine signatures (mypy, as the driver does before the VM starts).
- The VM's instance, as vm.nix declares it, goes through the module's own JSON function and
  renders for both variants of the flip.
- The script's HTTP checks (health, alias, a chat completion that drafts with draft = target,
  the build's version tell) run against a real llama-server started from that same instance.
- The VM's router (llama-server's router mode over two CPU members, at most one loaded) renders
  through the module's JSON, and the script's router checks (/v1/models, a completion through
  the router's port, a swap) run against a real router started from that render.
- The VM's gateway: a real LiteLLM (the pinned release, from the test bed's cached wheels) in
  front of that router, with the settings, the keys unit's environment file and the readiness
  check the module gives nixpkgs' services.litellm; the script's gateway checks (a chat with the
  key, refused without) run against it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from cli_run import run_llamanix
from recorded_help import UPSTREAM, probe_of, recorded, write_probe

from llamanix.config.model import load_config
from llamanix.core.json_codec import from_json_lenient
from llamanix.core.probe import Capabilities
from llamanix.render.units import render_host
from llamanix.server.server_process import LlamaServer, free_port
from llamanix.testbed.gateway_wheels import local_litellm
from llamanix.testbed.synth import SynthSpec, synth_model

ROOT = Path(__file__).resolve().parent.parent
# The plugin's directory, which the module puts on litellm.service's PYTHONPATH.
REPO_PLUGIN = ROOT / "tools/llamanix/render/litellm_plugin"
SCRIPT = ROOT / "tests/vm-test-script.py"
DRIVER_CALL = "run(machine, start_all, subtest)"
# The names the NixOS test driver puts into the script's globals (test_driver.driver's
# test_symbols, plus one per machine: this test has only `machine`).
DRIVER_SYMBOLS = (
    "machine",
    "start_all",
    "test_script",
    "machines",
    "machines_qemu",
    "machines_nspawn",
    "vlans",
    "driver",
    "log",
    "os",
    "create_machine",
    "subtest",
    "run_tests",
    "join_all",
    "retry",
    "serial_stdout_off",
    "serial_stdout_on",
    "polling_condition",
    "BaseMachine",
    "Machine",
    "t",
    "debug",
)
# What the driver prepends before running mypy on a test script, reduced to the names and
# method signatures this script uses (nixos/lib/test-script-prepend.py and the driver's
# machine class; `machine: QemuMachine` as the driver declares a VM node).
DRIVER_TYPE_HINTS = """
from typing import Callable, ContextManager


class QemuMachine:
    def start(self, allow_reboot: bool = False) -> None:
        raise NotImplementedError

    def succeed(self, *commands: str, timeout: int | None = None) -> str:
        raise NotImplementedError

    def wait_for_unit(self, unit: str, user: str | None = None, timeout: int = 900) -> None:
        raise NotImplementedError

    def wait_until_succeeds(self, command: str, timeout: int = 900) -> str:
        raise NotImplementedError

    def log(self, msg: str) -> None:
        raise NotImplementedError


start_all: Callable[[], None]
subtest: Callable[[str], ContextManager[None]]
machine: QemuMachine;
"""

needs_nix = pytest.mark.skipif(
    shutil.which("nix-instantiate") is None, reason="nix-instantiate is not installed"
)

# vm.nix evaluated with just enough of nixpkgs to read it: runNixOSTest returns its argument,
# and the node is called with a config whose package set names each build by its variant.
VM_EVAL = """
{ model }:
let
  lib = import ./tests/nix/stub-lib.nix // {
    mkForce = content: { _type = "override"; priority = 50; inherit content; };
  };
  test = import ./tests/vm.nix {
    pkgs = { inherit lib; testers.runNixOSTest = t: t; };
    module = "the-llamanix-module";
    inherit model;
  };
  store = "/nix/store/00000000000000000000000000000000";
  mkVariant = { variant, cudaArchs }: {
    outPath = "${store}-llama-cpp-${variant}-cpu";
    passthru.capabilities = "${store}-${variant}-capabilities.json";
    inherit cudaArchs;
  };
  node = test.nodes.machine {
    config.services.llamanix.packageSet = { inherit mkVariant; };
  };
in
{
  inherit (test) name testScript;
  inherit (node) imports virtualisation specialisation;
  services = node.services;
  expected = builtins.fromJSON node.environment.etc."llamanix-vm-test.json".text;
}
"""


def vm_eval(model: str = "/nix/store/00000000000000000000000000000000-model.gguf") -> Any:
    proc = subprocess.run(
        [
            "nix-instantiate",
            "--readonly-mode",
            "--eval",
            "--strict",
            "--json",
            "-E",
            VM_EVAL,
            "--argstr",
            "model",
            model,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def vm() -> Any:
    if shutil.which("nix-instantiate") is None:
        pytest.skip("nix-instantiate is not installed")
    return vm_eval()


def ruff(path: Path, builtins: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    """ruff with the repository's rules, F821 (undefined name) above all, and `builtins`."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "ruff",
            "check",
            "--no-cache",
            "--output-format",
            "concise",
            "--config",
            str(ROOT / "pyproject.toml"),
            "--config",
            f"builtins = {json.dumps(list(builtins))}",
            str(path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )


# --- the script the driver runs -----------------------------------------------------------------


@needs_nix
def test_driver_gets_the_file_and_one_call(vm: Any) -> None:
    assert vm["name"] == "llamanix-vm"
    assert vm["testScript"] == SCRIPT.read_text() + f"\n{DRIVER_CALL}\n"
    compile(vm["testScript"], "testScript", "exec")


@needs_nix
def test_script_names_nothing_undefined_but_the_driver_globals(vm: Any, tmp_path: Path) -> None:
    script = tmp_path / "test-script.py"
    script.write_text(vm["testScript"])
    proc = ruff(script, DRIVER_SYMBOLS)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # Without the driver's globals exactly its three names are undefined: the check bites, and
    # the script uses nothing else of the driver.
    proc = ruff(script, ())
    undefined = sorted(
        line.split("Undefined name ")[1].strip("`'")
        for line in proc.stdout.splitlines()
        if "F821" in line
    )
    assert undefined == ["machine", "start_all", "subtest"], proc.stdout


def test_script_file_lints_on_its_own() -> None:
    proc = ruff(SCRIPT, ())
    assert proc.returncode == 0, proc.stdout + proc.stderr


@needs_nix
@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is not installed")
def test_script_type_checks_against_the_driver(vm: Any, tmp_path: Path) -> None:
    script = tmp_path / "test_script_with_types.py"
    script.write_text(DRIVER_TYPE_HINTS + vm["testScript"])
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-incremental",
            "--cache-dir",
            str(tmp_path / "mypy-cache"),
            "--config-file",
            "/dev/null",
            str(script),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- the VM's configuration ---------------------------------------------------------------------


@needs_nix
def test_vm_flips_one_instance_between_two_cpu_builds(vm: Any) -> None:
    model = "/nix/store/00000000000000000000000000000000-model.gguf"
    expected = vm["expected"]
    assert expected["base"] == "upstream" and expected["other"] == "nixpkgs"
    assert vm["imports"] == ["the-llamanix-module"]
    assert vm["virtualisation"]["memorySize"] <= 4096

    llamanix = vm["services"]["llamanix"]
    assert llamanix["enable"] is True and llamanix["cudaArchs"] == []
    instance = llamanix["instances"][expected["instance"]]
    assert instance["variant"] == expected["base"]
    assert (instance["model"], instance["alias"], instance["port"]) == (
        model,
        expected["alias"],
        expected["port"],
    )
    # Draft = target.
    assert instance["speculative"]["type"] == "draft"
    assert instance["speculative"]["draft_model"] == model == expected["model"]

    # The specialisation changes the variant and nothing else.
    flipped = vm["specialisation"][expected["other"]]["configuration"]
    assert flipped == {
        "services": {
            "llamanix": {
                "instances": {
                    expected["instance"]: {
                        "variant": {
                            "_type": "override",
                            "priority": 50,
                            "content": expected["other"],
                        }
                    }
                }
            }
        }
    }

    # The script's expectations are the module's own CPU builds of both variants.
    assert expected["unit"] == f"llamanix-{expected['instance']}.service"
    for variant in (expected["base"], expected["other"]):
        build = expected["builds"][variant]
        assert build["out"].endswith(f"-llama-cpp-{variant}-cpu")
        assert build["capabilities"].endswith(f"-{variant}-capabilities.json")


@needs_nix
def test_vm_routes_two_cpu_members_of_the_base_variant(vm: Any) -> None:
    expected = vm["expected"]
    llamanix = vm["services"]["llamanix"]
    router = llamanix["router"]
    assert router["kind"] == "llama-server"
    assert router["members"] == expected["router"]["members"] == ["alpha", "beta"]
    assert router["port"] == expected["router"]["port"] != expected["port"]
    # At most one member loaded: asking for the other one is a swap.
    assert router["max_loaded"] == 1
    assert expected["router"]["unit"] == "llamanix-router.service"
    for name in router["members"]:
        member = llamanix["instances"][name]
        # One variant and one model for both (llama-server's router runs one binary), served by
        # the instance's name, on the CPU (the host's cudaArchs = [ ]).
        assert member["variant"] == expected["base"], name
        assert member["model"] == expected["model"], name
        assert "alias" not in member and "cudaArchs" not in member, name
    # The flip leaves the router alone: only the tiny instance changes variant.
    assert set(
        vm["specialisation"][expected["other"]]["configuration"]["services"]["llamanix"][
            "instances"
        ]
    ) == {expected["instance"]}


def module_config(
    tmp_path: Path, vm_config: Any, binary: Path, port: int, router_port: int | None = None
) -> Path:
    """The llamanix.json the module writes for the VM's instance (via tests/nix/module-json.nix,
    the module's own configData), with this machine's binary and a free port; with
    `router_port`, the VM's router and its members too, the router on that port."""
    expected = vm_config["expected"]
    instances = vm_config["services"]["llamanix"]["instances"]
    settings = dict(instances[expected["instance"]])
    settings["port"] = port
    spec: dict[str, Any] = {
        "host": "machine",
        "instances": {expected["instance"]: {"binary": str(binary), "settings": settings}},
    }
    if router_port is not None:
        router = dict(vm_config["services"]["llamanix"]["router"])
        router["port"] = router_port
        spec["router"] = router
        for name in router["members"]:
            spec["instances"][name] = {"binary": str(binary), "settings": instances[name]}
    proc = subprocess.run(
        [
            "nix-instantiate",
            "--readonly-mode",
            "--eval",
            "--strict",
            "--json",
            str(ROOT / "tests/nix/module-json.nix"),
            "--argstr",
            "spec",
            json.dumps(spec),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    path = tmp_path / "llamanix.json"
    path.write_text(proc.stdout)
    return path


def instance_argv(config: Path, instance: str, *options: str) -> list[str]:
    proc = run_llamanix("plan", str(config), instance, "--argv", *options, timeout=None)
    assert proc.returncode == 0, proc.stderr
    argv: list[str] = json.loads(proc.stdout)
    return argv


@needs_nix
@pytest.mark.parametrize("variant", ["upstream", "nixpkgs"])
def test_vm_instance_renders_for_both_variants(vm: Any, tmp_path: Path, variant: str) -> None:
    config = module_config(tmp_path, vm, Path("/nix/store/x-llama-cpp/bin/llama-server"), 8091)
    argv = instance_argv(config, vm["expected"]["instance"], "--variant", variant)
    model = vm["expected"]["model"]
    assert argv.count(model) == 2  # what the script asserts of the rendered argv
    draft_flag = argv[argv.index(model, argv.index(model) + 1) - 1]
    assert draft_flag in ("-md", "--spec-draft-model")


# --- the script's HTTP checks against a real llama-server ----------------------------------------


class LocalShell:
    """The script's Node, running its commands (curl) in a shell on this machine."""

    def succeed(self, *commands: str, timeout: int | None = None) -> str:
        output = ""
        for command in commands:
            proc = subprocess.run(
                ["bash", "-c", command],
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
            assert proc.returncode == 0, f"{command}: exit {proc.returncode}: {proc.stderr}"
            output += proc.stdout
        return output

    def wait_for_unit(self, unit: str, /) -> None:
        raise NotImplementedError("no systemd here")

    def wait_until_succeeds(self, command: str, /, timeout: int = 900) -> str:
        deadline = time.monotonic() + timeout
        while True:
            proc = subprocess.run(
                ["bash", "-c", command], capture_output=True, text=True, check=False
            )
            if proc.returncode == 0:
                return proc.stdout
            assert time.monotonic() < deadline, f"{command}: still failing after {timeout} s"
            time.sleep(0.2)

    def log(self, msg: str, /) -> None:
        print(msg)


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vm_test_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def vm_instance(tmp_path: Path) -> dict[str, Any]:
    """The VM's instance with a real synthetic model (synth-model's defaults, as in the VM)."""
    if shutil.which("nix-instantiate") is None:
        pytest.skip("nix-instantiate is not installed")
    model = synth_model(SynthSpec(), tmp_path / "model.gguf")
    result: dict[str, Any] = vm_eval(str(model))
    return result


def serve(
    tmp_path: Path, vm_config: Any, binary: Path, capabilities: Path, name: str
) -> LlamaServer:
    config = module_config(tmp_path, vm_config, binary, free_port())
    argv = instance_argv(
        config, vm_config["expected"]["instance"], "--capabilities", str(capabilities)
    )
    return LlamaServer(argv, tmp_path / f"{name}.log").start()


@needs_nix
def test_vm_router_renders_through_the_module(vm: Any, tmp_path: Path) -> None:
    """The VM's router as the module renders it: one unit for the router, none for its members,
    llama-server's router mode with one member loaded, and a CPU unit's sandbox."""
    binary = Path("/nix/store/00000000000000000000000000000000-llama-cpp/bin/llama-server")
    config = module_config(tmp_path, vm, binary, 8091, router_port=8092)
    probe = write_probe(recorded(UPSTREAM), tmp_path / "probe.json")
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "llamanix", "render", str(config), "--host", "machine"),
            *("--out", str(out), "--capabilities", str(probe)),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    units = sorted(p.name for p in out.glob("*.service"))
    assert units == ["llamanix-router.service", vm["expected"]["unit"]]
    manifest = json.loads((out / "manifest.json").read_text())
    router = manifest["router"]
    assert router["served"] == {"alpha": "alpha", "beta": "beta"}
    assert router["argv"] == [
        str(binary), "--models-preset", "%d/router-presets.ini",
        "--host", "127.0.0.1", "--port", "8092", "--models-max", "1",
    ]  # fmt: skip
    text = (out / "llamanix-router.service").read_text()
    lines = text.splitlines()
    # What the script's check_hardening expects of a CPU unit, and a loopback unit's ordering.
    for line in ("ProcSubset=pid", "PrivateDevices=yes", "After=network.target"):
        assert line in lines, line
    assert "Wants=network-online.target" not in lines


@needs_nix
@pytest.mark.server
def test_script_http_checks_pass_on_the_vm_instance(
    tmp_path: Path, vm_instance: Any, llama_server_bin: Path
) -> None:
    script = load_script()
    capabilities = probe_of(llama_server_bin, tmp_path / "capabilities.json")
    server = serve(tmp_path, vm_instance, llama_server_bin, capabilities, "vm")
    try:
        node = LocalShell()
        alias = vm_instance["expected"]["alias"]
        timings = script.check_serving(node, server.port, alias)
        assert timings["draft_n"] > 0 and timings["draft_n_accepted"] > 0
        tell = script.build_tell(node, server.port, "llamanix-tiny.service")
        wanted = script.expected_tells(json.loads(capabilities.read_text()))
        assert tell in wanted, (tell, wanted)
    finally:
        server.stop()


@needs_nix
@pytest.mark.server
def test_script_drafting_check_fails_without_a_draft(
    tmp_path: Path, vm_instance: Any, llama_server_bin: Path
) -> None:
    script = load_script()
    capabilities = probe_of(llama_server_bin, tmp_path / "capabilities.json")
    instance = vm_instance["services"]["llamanix"]["instances"][vm_instance["expected"]["instance"]]
    instance["speculative"] = {"type": "none"}
    server = serve(tmp_path, vm_instance, llama_server_bin, capabilities, "plain")
    try:
        with pytest.raises(AssertionError, match="proposed no tokens"):
            script.check_serving(LocalShell(), server.port, vm_instance["expected"]["alias"])
    finally:
        server.stop()


def start_vm_router(
    tmp_path: Path, vm_config: Any, binary: Path, capabilities: Path
) -> tuple[LlamaServer, list[str]]:
    """The VM's router, started as its unit would start it: the rendered argv, with the preset
    that the unit carries as a credential written to a file."""
    config = module_config(tmp_path, vm_config, binary, free_port(), router_port=free_port())
    cfg = load_config(config)
    rendered = render_host(
        cfg, "machine", {"*": from_json_lenient(Capabilities, json.loads(capabilities.read_text()))}
    )
    router = rendered.router
    assert router is not None and router.config_name is not None and router.config_text
    preset = tmp_path / router.config_name
    preset.write_text(router.config_text)
    argv = [str(preset) if a == f"%d/{router.config_name}" else a for a in router.argv]
    server = LlamaServer(argv, tmp_path / "router.log").start()
    return server, list(router.served.values())


@needs_nix
@pytest.mark.server
def test_script_router_checks_pass_on_the_vm_router(
    tmp_path: Path, vm_instance: Any, llama_server_bin: Path
) -> None:
    script = load_script()
    capabilities = probe_of(llama_server_bin, tmp_path / "capabilities.json")
    server, served = start_vm_router(tmp_path, vm_instance, llama_server_bin, capabilities)
    try:
        assert served == vm_instance["expected"]["router"]["members"]
        script.check_router(LocalShell(), server.port, served)
        # Both members answered and only the one asked last is loaded.
        assert script.member_statuses(LocalShell(), server.port) == {
            served[0]: "unloaded",
            served[-1]: "loaded",
        }
    finally:
        server.stop()


@needs_nix
@pytest.mark.server
def test_script_router_swap_check_fails_when_both_stay_loaded(
    tmp_path: Path, vm_instance: Any, llama_server_bin: Path
) -> None:
    script = load_script()
    capabilities = probe_of(llama_server_bin, tmp_path / "capabilities.json")
    vm_instance["services"]["llamanix"]["router"]["max_loaded"] = 2
    server, served = start_vm_router(tmp_path, vm_instance, llama_server_bin, capabilities)
    try:
        with pytest.raises(AssertionError, match="loaded beside"):
            script.check_router(LocalShell(), server.port, served)
    finally:
        server.stop()


# --- the gateway: a real LiteLLM in front of the VM's router --------------------------------

# What nix/lib.nix gives the module for the VM's gateway, its options' defaults applied as the
# module system applies them: the settings, the keys unit's script and the readiness check.
GATEWAY_EVAL = """
{ spec }:
let
  lib = import ./tests/nix/stub-lib.nix;
  l = import ./nix/lib.nix;
  args = builtins.fromJSON spec;
  options = (import ./nix/schema-options.nix { inherit lib; }).gatewayOptions;
  gateway = builtins.mapAttrs (name: o: args.gateway.${name} or (o.default or null)) options;
  given = { inherit gateway; inherit (args) replicas; };
in
{
  settings = l.gatewaySettings given;
  keysScript = l.gatewayKeysScript (given // { shellArg = lib.escapeShellArg; });
  readyScript = l.gatewayReadyScript { inherit gateway; curl = "curl"; };
  environmentFile = l.gatewayEnvironmentFile;
}
"""


def gateway_eval(gateway: dict[str, Any], replicas: list[dict[str, Any]]) -> Any:
    spec = json.dumps({"gateway": gateway, "replicas": replicas})
    proc = subprocess.run(
        ["nix-instantiate", "--readonly-mode", "--eval", "--strict", "--json", "-E",
         GATEWAY_EVAL, "--argstr", "spec", spec],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def environment_file(text: str) -> dict[str, str]:
    """NAME='value' lines, as systemd reads a single-quoted EnvironmentFile= value."""
    out = {}
    for line in text.splitlines():
        m = re.fullmatch(r"([A-Z_][A-Z0-9_]*)='([^']*)'", line)
        assert m, line
        out[m.group(1)] = m.group(2)
    return out


def test_vm_gateway_runs_nixpkgs_litellm_in_front_of_the_router(vm: Any) -> None:
    expected = vm["expected"]
    gateway = vm["services"]["llamanix"]["gateway"]
    assert gateway["port"] == expected["gateway"]["port"]
    assert gateway["api_key_file"] == expected["gateway"]["keyFile"]
    assert gateway["api_key_file"].startswith("/run/secrets/")
    router = expected["router"]
    assert gateway["replicas"] == [
        {"instance": name, "alias": name, "url": f"http://127.0.0.1:{router['port']}/v1",
         "apiKeyFile": None}
        for name in router["members"]
    ]  # fmt: skip
    assert expected["gateway"]["models"] == router["members"]
    assert expected["gateway"]["unit"] == "litellm.service"
    assert expected["gateway"]["keysUnit"] == "llamanix-gateway-keys.service"


class Gateway:
    """LiteLLM as the VM's litellm.service runs it: nixpkgs' command line, the module's
    settings, the keys from the environment file the keys unit's script wrote."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, key_file: Path) -> None:
        self.proc, self.port, self.key_file = proc, port, key_file

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@pytest.fixture(scope="module")
def vm_gateway(
    tmp_path_factory: pytest.TempPathFactory, llama_server_bin: Path
) -> Iterator[tuple[Gateway, list[str], Any]]:
    """The VM's router (real llama-server) and in front of it a real LiteLLM, set up from
    what the module gives services.litellm."""
    if shutil.which("nix-instantiate") is None:
        pytest.skip("nix-instantiate is not installed")
    tmp = tmp_path_factory.mktemp("gateway")
    litellm = local_litellm()
    vm_config = vm_eval(str(synth_model(SynthSpec(), tmp / "model.gguf")))
    capabilities = probe_of(llama_server_bin, tmp / "capabilities.json")
    router, served = start_vm_router(tmp, vm_config, llama_server_bin, capabilities)
    gateway: dict[str, Any] = dict(vm_config["services"]["llamanix"]["gateway"])
    gateway["port"] = free_port()
    replicas = [r | {"url": f"http://127.0.0.1:{router.port}/v1"} for r in gateway.pop("replicas")]
    given = gateway_eval(gateway, replicas)
    # The keys unit: its credential (the key file), its runtime directory.
    key_file = tmp / "llamanix-gateway-key"
    key_file.write_text(os.urandom(12).hex())
    creds, run = tmp / "credentials", tmp / "run"
    creds.mkdir()
    run.mkdir()
    shutil.copy(key_file, creds / "master-key")
    keys = subprocess.run(
        ["sh", "-c", given["keysScript"]],
        env={**os.environ, "CREDENTIALS_DIRECTORY": str(creds), "RUNTIME_DIRECTORY": str(run)},
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert keys.returncode == 0, keys.stderr
    keys_env = environment_file((run / "litellm.env").read_text())
    assert set(keys_env) == {"LITELLM_MASTER_KEY"}
    config = tmp / "config.yaml"
    config.write_text(json.dumps(given["settings"]))
    env = {
        **os.environ,
        **keys_env,
        "HOME": str(tmp),
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        # What the module adds to litellm.service (modules/llamanix.nix): llamanix's plugin.
        "PYTHONPATH": str(REPO_PLUGIN),
        # nixpkgs' services.litellm.environment default.
        "SCARF_NO_ANALYTICS": "True",
        "DO_NOT_TRACK": "True",
        "ANONYMIZED_TELEMETRY": "False",
    }
    log = (tmp / "litellm.log").open("wb")
    proc = subprocess.Popen(
        [str(litellm), "--host", "127.0.0.1", "--port", str(gateway["port"]),
         "--config", str(config)],
        env=env, cwd=tmp, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    running = Gateway(proc, gateway["port"], key_file)
    started = time.monotonic()
    try:
        # The unit's ExecStartPost=, as systemd runs it: $MAINPID is LiteLLM.
        ready = subprocess.run(
            ["sh", "-c", given["readyScript"]],
            env={**os.environ, "MAINPID": str(proc.pid)},
            capture_output=True, text=True, check=False, timeout=300,
        )  # fmt: skip
        log.flush()
        assert ready.returncode == 0, (tmp / "litellm.log").read_text()[-3000:]
        print(f"LiteLLM live {time.monotonic() - started:.1f} s after its start")
        yield running, served, given
    finally:
        running.stop()
        router.stop()
        log.close()


@needs_nix
@pytest.mark.server
def test_the_gateway_health_checks_load_no_router_member(
    vm_gateway: tuple[Gateway, list[str], Any],
) -> None:
    """The VM's router (at most one member loaded) behind LiteLLM with the module's settings:
    three check intervals after LiteLLM came up, before any client asked, every member is
    still unloaded. llamanix's plugin asks the router's /health, which loads nothing; LiteLLM's
    own checks sent each member a completion every interval, loading one after the other, and
    raced check_router's loaded and unloaded assertions in the VM test. (Runs first of the
    gateway's tests: they load members.)"""
    _, served, given = vm_gateway
    settings = given["settings"]
    assert settings["general_settings"]["background_health_checks"] is False
    plugin = json.loads(settings["environment_variables"]["LLAMANIX_GATEWAY"])
    time.sleep(3 * plugin["interval"])
    base = settings["model_list"][0]["litellm_params"]["api_base"].removesuffix("/v1")
    port = int(base.rsplit(":", 1)[1])
    script = load_script()
    statuses = script.member_statuses(LocalShell(), port)
    assert statuses == dict.fromkeys(served, "unloaded"), statuses
    assert set(plugin["health"].values()) == {f"{base}/health"}


@needs_nix
@pytest.mark.server
def test_script_gateway_checks_pass_on_the_vm_gateway(
    vm_gateway: tuple[Gateway, list[str], Any],
) -> None:
    """A chat through LiteLLM with the master key reaches each member behind the router; one
    without the key is refused."""
    script = load_script()
    gateway, served, _ = vm_gateway
    script.check_gateway(LocalShell(), gateway.port, str(gateway.key_file), served)


@needs_nix
@pytest.mark.server
def test_script_gateway_check_fails_with_the_wrong_key(
    vm_gateway: tuple[Gateway, list[str], Any], tmp_path: Path
) -> None:
    script = load_script()
    gateway, served, _ = vm_gateway
    wrong = tmp_path / "wrong-key"
    wrong.write_text("not-the-master-key")
    # LiteLLM looks a key that is not the master key up among its virtual keys: 400 or 401.
    with pytest.raises(AssertionError, match=r"alpha through the gateway: 40[01] "):
        script.check_gateway(LocalShell(), gateway.port, str(wrong), served)


@needs_nix
@pytest.mark.server
def test_the_readiness_check_fails_once_litellm_has_exited(
    vm_gateway: tuple[Gateway, list[str], Any],
) -> None:
    """The ExecStartPost= that passed above fails at once for a LiteLLM that exited before it
    served: the dead pid, a port where nothing listens."""
    _, _, given = vm_gateway
    dead = subprocess.Popen(["true"])
    dead.wait()
    script = given["readyScript"].replace(
        "127.0.0.1:" + str(vm_gateway[0].port), f"127.0.0.1:{free_port()}"
    )
    # Without the pid check it would wait for ever: the time limit fails the test then.
    proc = subprocess.run(
        ["sh", "-c", script], env={**os.environ, "MAINPID": str(dead.pid)},
        capture_output=True, text=True, check=False, timeout=30,
    )  # fmt: skip
    assert proc.returncode == 1
