"""Routers (``[hosts.NAME.router]``): the config's checks, which members stay loaded together,
the llama-server preset, and upstream's router mode really serving two synthetic models behind
one port from what llamanix renders.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from llamanix.config.model import load_config, parse_config
from llamanix.core.errors import UserError
from llamanix.core.probe import Capabilities, parse_capabilities, parse_help
from llamanix.core.residency import GIB, plan_residency
from llamanix.core.variants import VARIANTS
from llamanix.external import systemd_analyze
from llamanix.render import router as r
from llamanix.render.units import render_host, write_render
from llamanix.server.server_process import free_port

HELP = Path(__file__).parent / "data" / "help"
# A llama-server for every variant: a plain systemd host names the one it runs for each.
ALL_BINARIES = {v: f"/opt/{v}/bin/llama-server" for v in VARIANTS}


def config(instances: dict[str, dict[str, Any]], router: dict[str, Any], **host: Any) -> Any:
    data = {
        "hosts": {"box": {"kind": "systemd", "binaries": ALL_BINARIES, **host, "router": router}},
        "instances": {name: {"model": f"/m/{name}.gguf", **i} for name, i in instances.items()},
    }
    return parse_config(data, "r.toml")


def refusal(instances: dict[str, dict[str, Any]], router: dict[str, Any], **host: Any) -> str:
    with pytest.raises(UserError) as err:
        config(instances, router, **host)
    [problem] = err.value.problems
    return str(problem)


TWO = {"big": {"port": 9001}, "small": {"port": 9001, "alias": "fast"}}
# Without a valid router their ports are theirs again, so these differ.
APART = {"big": {"port": 9001}, "small": {"port": 9002}}


# --- the config -------------------------------------------------------------------------------


def test_members_ports_are_internal_and_the_router_takes_its_own() -> None:
    c = config(TWO, {"kind": "llama-server", "members": ["big", "small"], "port": 8080})
    router = c.hosts["box"].router
    assert router is not None
    assert (router.kind, router.members, router.listen, router.port) == (
        "llama-server",
        ("big", "small"),
        "127.0.0.1",
        8080,
    )
    assert (router.idle_ttl, router.max_loaded, router.api_key_file) == (0, None, None)


@pytest.mark.parametrize(
    ("instances", "router", "expected"),
    [
        (
            {"big": {"variant": "upstream"}, "small": {"variant": "ik", "port": 9002}},
            {"kind": "llama-server", "members": ["big", "small"]},
            "r.toml: hosts.box.router.kind: a llama-server router starts every member with the "
            "router's binary, but 'big' uses variant upstream and 'small' uses variant ik (use "
            'kind = "llama-swap", which starts each member with its own binary)',
        ),
        (
            {"big": {"variant": "ik"}, "small": {"variant": "ik", "port": 9002}},
            {"kind": "llama-server", "members": ["big", "small"]},
            "r.toml: hosts.box.router.kind: variant ik has no router mode (no --models-preset "
            'in its --help) (use kind = "llama-swap")',
        ),
        (
            {"big": {"environment": {"CUDA_VISIBLE_DEVICES": "0"}}, "small": {"port": 9002}},
            {"kind": "llama-server", "members": ["big", "small"]},
            "r.toml: hosts.box.router.kind: a llama-server router passes its own environment "
            "to every member, but the members set different environments (give them the same "
            'environment, or use kind = "llama-swap")',
        ),
        (
            {"big": {"binary": "/opt/a/llama-server"}, "small": {"port": 9002}},
            {"kind": "llama-server", "members": ["big", "small"]},
            "r.toml: hosts.box.router.kind: a llama-server router starts every member with the "
            "router's binary, but the members name different binaries (/opt/a/llama-server, "
            '(the variant\'s)) (use one binary, or kind = "llama-swap")',
        ),
        (
            APART,
            {"kind": "llama-server", "members": ["big", "smal"]},
            "r.toml: hosts.box.router.members: no instance 'smal' (did you mean 'small'?)",
        ),
        (
            {"big": {"alias": "m"}, "small": {"alias": "m", "port": 9002}},
            {"kind": "llama-swap", "members": ["big", "small"]},
            "r.toml: hosts.box.router.members: two members are served as 'm' (give each member "
            "its own alias)",
        ),
        (
            {"big": {"port": 9001}, "small": {"port": 8080}},
            {"kind": "llama-swap", "members": ["big"], "port": 8080},
            "r.toml: hosts.box.router.port: port 8080 on host 'box' is already used by "
            "instance 'small' (give the router its own port)",
        ),
        (
            APART,
            {"members": ["big"]},
            'r.toml: hosts.box.router.kind: missing (set kind = "llama-server" (one variant) '
            'or "llama-swap" (any mix))',
        ),
        (
            APART,
            {"kind": "llama-swap", "members": []},
            "r.toml: hosts.box.router.members: is empty (list the instances it serves, e.g. "
            'members = ["big", "small"])',
        ),
        (
            APART,
            {"kind": "nginx", "members": ["big"]},
            "r.toml: hosts.box.router.kind: unknown value 'nginx' (known: llama-server, "
            "llama-swap)",
        ),
        (
            APART,
            {"kind": "llama-swap", "members": ["big"], "ttl": 5},
            "r.toml: hosts.box.router.ttl: unknown key (known: kind, members, listen, port, "
            "idle_ttl, max_loaded, api_key_file, keyless, binary)",
        ),
    ],
)
def test_router_refusals_are_one_line(
    instances: dict[str, dict[str, Any]], router: dict[str, Any], expected: str
) -> None:
    assert refusal(instances, router) == expected


def test_llama_swap_takes_any_mix_of_variants() -> None:
    c = config(
        {"big": {"variant": "upstream"}, "small": {"variant": "ik", "port": 9002}},
        {"kind": "llama-swap", "members": ["big", "small"]},
    )
    assert c.hosts["box"].router.kind == "llama-swap"


def test_a_member_on_another_host_is_refused() -> None:
    data = {
        "hosts": {
            "a": {"kind": "systemd", "router": {"kind": "llama-swap", "members": ["x"]}},
            "b": {"kind": "systemd", "binaries": ALL_BINARIES},
        },
        "instances": {"x": {"model": "/m/x.gguf", "host": "b"}},
    }
    with pytest.raises(UserError) as err:
        parse_config(data, "r.toml")
    assert [str(p) for p in err.value.problems] == [
        "r.toml: hosts.a.router.members: instance 'x' runs on host 'b', not 'a' (route it on "
        "host 'b', or move it to this host)"
    ]


# --- who stays loaded -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("vram", "gpu", "max_loaded", "resident", "swapping", "reason"),
    [
        (
            {"a": 10, "b": 5, "c": 8},
            32,
            None,
            ("a", "b", "c"),
            (),
            "all fit together: 23.0 GiB of 32.0 GiB",
        ),
        (
            {"a": 10, "b": 5, "c": 20},
            32,
            None,
            ("a",),
            ("b", "c"),
            "a kept loaded (10.0 GiB), with room for the largest member that takes turns "
            "(20.0 GiB) in 32.0 GiB",
        ),
        (
            {"a": 20, "b": 20, "c": 20},
            24,
            None,
            (),
            ("a", "b", "c"),
            "no two fit together in 24.0 GiB: one member at a time",
        ),
        (
            {"a": 10, "b": 5, "c": 8},
            32,
            2,
            ("a",),
            ("b", "c"),
            "a kept loaded (10.0 GiB), with room for the largest member that takes turns "
            "(8.0 GiB) in 32.0 GiB; max_loaded = 2",
        ),
        (
            {"a": 30, "b": 1, "c": 1},
            24,
            None,
            ("b", "c"),
            ("a",),
            "the others fit together: 2.0 GiB of 24.0 GiB; a does not fit even alone (30.0 GiB)",
        ),
        (
            {"a": None, "b": 1, "c": 1},
            24,
            None,
            (),
            ("a", "b", "c"),
            "VRAM need of a unknown here (model not readable): one member at a time, which "
            "never runs out of memory",
        ),
        ({}, None, None, ("a", "b", "c"), (), "no GPU memory to share: every member stays loaded"),
        (
            {},
            None,
            2,
            ("a",),
            ("b", "c"),
            "max_loaded = 2: a kept loaded, the rest take turns",
        ),
    ],
)
def test_residency(
    vram: dict[str, int | None],
    gpu: int | None,
    max_loaded: int | None,
    resident: tuple[str, ...],
    swapping: tuple[str, ...],
    reason: str,
) -> None:
    in_bytes = {k: None if v is None else v * GIB for k, v in vram.items()}
    plan = plan_residency(("a", "b", "c"), in_bytes, None if gpu is None else gpu * GIB, max_loaded)
    assert (plan.resident, plan.swapping, plan.reason) == (resident, swapping, reason)
    assert plan.max_loaded == len(resident) + (1 if swapping else 0)


# --- the llama-server preset ------------------------------------------------------------------


def test_preset_holds_each_members_argv_without_what_the_router_owns() -> None:
    c = config(
        {
            "big": {"context": 8192, "api_key_file": "/run/k", "jinja": False},
            "small": {
                "port": 9002,
                "alias": "fast",
                "speculative": {"type": "ngram-mod", "n_max": 8},
                "extra_args": ["--no-webui", "--cache-ram", "0"],
            },
        },
        {"kind": "llama-server", "members": ["big", "small"], "idle_ttl": 600},
        binaries={"upstream": "/opt/llama/bin/llama-server"},
    )
    members = r.members(c, "box")
    assert r.preset_ini(c, "box", members) == "\n".join(
        [
            "; Generated by llamanix: the router of host box.",
            "; Each section is one member's argv as llamanix renders it for its variant.",
            "version = 1",
            "",
            "[big]",
            "m = /m/big.gguf",
            "c = 8192",
            "no-jinja = true",
            "metrics = true",
            "sleep-idle-seconds = 600",
            "",
            "[fast]",
            "m = /m/small.gguf",
            "metrics = true",
            "spec-type = ngram-mod",
            "spec-ngram-mod-n-max = 8",
            "no-webui = true",
            "cache-ram = 0",
            "sleep-idle-seconds = 600",
            "",
        ]
    )
    plan = r.residency(c, "box", None, None)
    assert r.llama_server_router_argv(c, "box", members, plan, "/etc/p.ini", "/run/key") == [
        "/opt/llama/bin/llama-server",
        "--models-preset",
        "/etc/p.ini",
        "--host",
        "127.0.0.1",
        "--port",
        "8080",
        "--models-max",
        "2",
        "--api-key-file",
        "/run/key",
    ]


@pytest.mark.parametrize(
    ("inst", "expected"),
    [
        (
            {"model": "/m/a;b.gguf"},
            "r.toml: instances.big.model: '/m/a;b.gguf' holds ';', '#' or a newline, which a "
            'llama-server preset cannot hold (rename the file, or use kind = "llama-swap")',
        ),
        (
            {"extra_args": ["--cache-ram", "0", "--cache-ram", "1"]},
            "r.toml: instances.big.extra_args: --cache-ram appears twice in its argv, and a "
            'llama-server preset holds each option once (give it once, or use kind = "llama-swap")',
        ),
    ],
)
def test_preset_refuses_what_it_cannot_hold(inst: dict[str, Any], expected: str) -> None:
    c = config({"big": inst}, {"kind": "llama-server", "members": ["big"]})
    with pytest.raises(UserError) as err:
        r.preset_ini(c, "box", r.members(c, "box"))
    assert [str(p) for p in err.value.problems] == [expected]


# --- upstream's router mode, really ---------------------------------------------------------


def _long_forms(help_text: str) -> dict[str, str]:
    """Every spelling of an option -> its last (long) one, as the router writes child argv."""
    _flags, _removed, details = parse_help(help_text)
    groups: dict[tuple[str, str], list[str]] = {}
    for name, detail in details.items():
        groups.setdefault(detail, []).append(name)
    return {name: names[-1] for names in groups.values() for name in names}


def _pairs(argv: list[str], long: dict[str, str]) -> set[tuple[str, str]]:
    """(long flag, value or "") pairs of an argv, program left out."""
    out: set[tuple[str, str]] = set()
    i = 1
    while i < len(argv):
        flag = long.get(argv[i], argv[i])
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out.add((flag, argv[i + 1]))
            i += 2
        else:
            out.add((flag, ""))
            i += 1
    return out


def _chat(url: str, model: str) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        timeout=120,
    )


def _statuses(url: str) -> dict[str, dict[str, Any]]:
    data = httpx.get(f"{url}/models", timeout=10).json()["data"]
    return {m["id"]: m["status"] for m in data}


@dataclass
class RunningRouter:
    url: str
    config: Any
    config_path: Path
    members: list[r.Member]
    argv: list[str]


@pytest.fixture
def running_router(
    llama_server_bin: Path, synth_models: Any, tmp_path: Path
) -> Iterator[RunningRouter]:
    """llama-server's router mode started from what llamanix renders: two synthetic members,
    at most one loaded."""
    port = free_port()
    path = tmp_path / "llamanix.toml"
    path.write_text(
        f"""\
[hosts.box]
kind = "systemd"
binaries = {{ upstream = "{llama_server_bin}" }}

[hosts.box.router]
kind = "llama-server"
members = ["alpha", "beta"]
port = {port}
max_loaded = 1

[instances.alpha]
model = "{synth_models.target}"
context = 1024
parallel = 1
threads = 1

[instances.beta]
model = "{synth_models.builtin_vocab}"
alias = "beta-model"
context = 1024
parallel = 1
threads = 1
port = 9

[instances.beta.speculative]
type = "ngram-mod"
n_max = 8
"""
    )
    c = load_config(path)
    members = r.members(c, "box")
    plan = r.residency(c, "box", None, None)
    assert (plan.swapping, plan.max_loaded) == (("alpha", "beta"), 1)
    preset = tmp_path / r.PRESET_FILE
    preset.write_text(r.preset_ini(c, "box", members))
    argv = r.llama_server_router_argv(c, "box", members, plan, str(preset))
    url = f"http://127.0.0.1:{port}"
    log = (tmp_path / "router.log").open("w")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, (tmp_path / "router.log").read_text()
            assert time.monotonic() < deadline, "router did not answer /health"
            time.sleep(0.2)
        yield RunningRouter(url, c, path, members, argv)
    finally:
        # The router and the children it started share its process group.
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


@pytest.mark.server
def test_router_mode_serves_two_members_on_one_port_and_evicts(
    running_router: RunningRouter, llama_server_bin: Path
) -> None:
    url, members = running_router.url, running_router.members
    assert running_router.argv.count("--models-preset") == 1
    assert {k: v["value"] for k, v in _statuses(url).items()} == {
        "alpha": "unloaded",
        "beta-model": "unloaded",
    }
    long = _long_forms(
        subprocess.run([str(llama_server_bin), "--help"], capture_output=True, text=True).stdout
    )
    for served, member in (
        ("alpha", members[0]),
        ("beta-model", members[1]),
        ("alpha", members[0]),
    ):
        answer = _chat(url, served)
        assert answer.status_code == 200, answer.text
        assert answer.json()["model"] == served
        status = _statuses(url)
        other = "beta-model" if served == "alpha" else "alpha"
        # --models-max 1: loading one member evicted the other.
        assert (status[served]["value"], status[other]["value"]) == ("loaded", "unloaded")
        child = status[served]["args"]
        # The child runs the member's own argv; only the address and alias are the router's.
        ours = [t for a in member.pieces if a.field not in r.ROUTER_OWNED for t in a.tokens]
        theirs = _pairs(child, long) - {(long["--host"], "127.0.0.1"), (long["--alias"], served)}
        theirs = {p for p in theirs if p[0] != long["--port"]}
        assert theirs == _pairs(ours, long)
        assert child[0] == str(llama_server_bin)


@pytest.mark.server
def test_readiness_loads_each_member_in_turn(running_router: RunningRouter) -> None:
    from llamanix.server.readiness import ReadinessCheck, wait_ready

    took = wait_ready(
        ReadinessCheck(running_router.url, served_models=("alpha", "beta-model"), deadline_s=60)
    )
    assert took > 0
    # Both answered, one after the other: with max_loaded = 1 the last one stays loaded.
    status = _statuses(running_router.url)
    assert (status["alpha"]["value"], status["beta-model"]["value"]) == ("unloaded", "loaded")


@pytest.mark.server
def test_bench_through_the_router_reports_the_cold_load_apart(
    running_router: RunningRouter, tmp_path: Path
) -> None:
    from click.testing import CliRunner

    from llamanix.cli import main

    out = tmp_path / "bench.json"
    result = CliRunner().invoke(
        main,
        [
            "bench",
            "run",
            "--url",
            running_router.url,
            "--alias",
            "beta-model",
            "--prompts",
            "builtin:fibonacci",
            "--max-tokens",
            "8",
            "--runs",
            "2",
            "--warmup",
            "1",
            "-o",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "cold load through the router: " in result.stdout
    data = json.loads(out.read_text())
    assert data["meta"]["model"] == "beta-model"
    assert data["meta"]["cold_load_s"] > 0
    # The member is warm now: a second bench has nothing to load.
    again = CliRunner().invoke(
        main,
        [
            *("bench", "run", "--url", running_router.url, "--alias", "beta-model", "--json"),
            *("--prompts", "builtin:fibonacci", "--max-tokens", "8", "--runs", "1"),
            *("--warmup", "0"),
        ],
    )
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["meta"]["cold_load_s"] is None


@pytest.mark.server
def test_doctor_probes_a_member_through_the_router(running_router: RunningRouter) -> None:
    from click.testing import CliRunner

    from llamanix.cli import main

    result = CliRunner().invoke(
        main,
        ["doctor", str(running_router.config_path), "beta", "--url", running_router.url, "--json"],
    )
    assert result.exit_code in (0, 1), result.output  # 1: a finding, not a failure to probe
    assert "HTTP 400" not in result.output and "cannot connect" not in result.output
    assert json.loads(result.stdout)


# --- the router's unit --------------------------------------------------------------------------

# What a CUDA build's probe shows in the NixOS build sandbox (its --version run on the CUDA stub):
# the upstream recording's --help, with the stub's line before the version.
CUDA_VERSION = (
    "ggml_cuda_init: failed to initialize CUDA: CUDA driver is a stub library\n"
    + (HELP / "upstream-0c1e570.version.txt").read_text()
)


def _probe(cuda: bool) -> Capabilities:
    version = CUDA_VERSION if cuda else (HELP / "upstream-0c1e570.version.txt").read_text()
    caps = parse_capabilities(
        "llama-server", version, (HELP / "upstream-0c1e570.help.txt").read_text()
    )
    assert caps.cuda is cuda
    return caps


def _unit_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith(("#", "["))]


def _routed(
    kind: str = "llama-server",
    host: dict[str, Any] | None = None,
    listen: str | None = None,
    **members: dict[str, Any],
) -> Any:
    """A NixOS host (as the module writes it) with two members behind a router on port 8080."""
    router: dict[str, Any] = {"kind": kind, "members": ["big", "small"], "port": 8080}
    if listen is not None:
        router["listen"] = listen
    store = "/nix/store/00000000000000000000000000000000-llama-cpp/bin/llama-server"
    insts = {
        "big": {"binary": store, **members.get("big", {})},
        "small": {"binary": store, "port": 9002, **members.get("small", {})},
    }
    return config(insts, router, **{"kind": "nixos", **(host or {})})


def _router_unit(c: Any, caps: dict[str, Capabilities] | None = None) -> list[str]:
    rendered = render_host(c, "box", caps)
    assert rendered.router is not None
    return _unit_lines(rendered.router.unit_text)


def _alone_unit(c: Any, name: str, caps: dict[str, Capabilities] | None = None) -> list[str]:
    """The same instance with no router: its unit of its own."""
    data = {
        **c.raw,
        "hosts": {"box": {k: v for k, v in c.raw["hosts"]["box"].items() if k != "router"}},
    }
    alone = parse_config(data, "r.toml")
    [unit] = [u for u in render_host(alone, "box", caps).instances if u.name == name]
    return _unit_lines(unit.unit_text)


DEVICES = [
    "DevicePolicy=closed",
    "DeviceAllow=char-nvidiactl rw",
    "DeviceAllow=char-nvidia-frontend rw",
    "DeviceAllow=char-nvidia-uvm rw",
    "DeviceAllow=char-nvidia-caps rw",
]


@pytest.mark.parametrize("kind", ["llama-server", "llama-swap"])
def test_router_opens_the_gpu_where_a_members_build_is_cuda_as_an_instance_would(
    kind: str,
) -> None:
    """A NixOS host without `gpu` and with cudaArchs = [ ], whose members get a CUDA build from
    their own cudaArchs or package: the probe says CUDA, so the router's unit opens the GPU as
    the same instance's own unit does."""
    c = _routed(kind)
    assert not c.hosts["box"].has_gpu
    for probe, opened in ((_probe(cuda=True), True), (_probe(cuda=False), False)):
        caps = {"*": probe}
        for lines in (_router_unit(c, caps), _alone_unit(c, "big", caps)):
            assert all(d in lines for d in DEVICES) is opened, lines
            assert ("PrivateDevices=no" in lines) is opened
            assert ("RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX" in lines) is opened
    # One CUDA member is enough; gpu_layers = 0 keeps a member on the CPU, as on its own.
    caps = {"big": _probe(cuda=True), "small": _probe(cuda=False)}
    assert all(d in _router_unit(c, caps) for d in DEVICES)
    cpu = _routed(kind, big={"gpu_layers": 0})
    assert "PrivateDevices=yes" in _router_unit(cpu, caps)
    assert "PrivateDevices=yes" in _alone_unit(cpu, "big", caps)


@pytest.mark.parametrize("kind", ["llama-server", "llama-swap"])
def test_a_router_whose_member_downloads_has_no_ip_filter_as_an_instance_would(kind: str) -> None:
    c = _routed(kind)
    assert "IPAddressDeny=any" in _router_unit(c)
    download = {"extra_args": ["--hf-repo", "ggml-org/gemma-3-1b-it-GGUF"]}
    c = _routed(kind, small=download)
    lines = _router_unit(c)
    assert not any(line.startswith("IPAddress") for line in lines), lines
    assert not any(line.startswith("IPAddress") for line in _alone_unit(c, "small"))
    # It talks to the internet at start: the router waits for the network.
    assert "Wants=network-online.target" in lines


@pytest.mark.parametrize(
    ("kind", "host", "proc", "devices"),
    [
        ("llama-swap", {}, "ProcSubset=all", "PrivateDevices=yes"),
        ("llama-server", {}, "ProcSubset=pid", "PrivateDevices=yes"),
        ("llama-swap", {"gpu": "rtx3090"}, "ProcSubset=all", "PrivateDevices=no"),
    ],
    ids=["swap-cpu", "server-cpu", "swap-gpu"],
)
def test_a_llama_swap_router_sees_proc_meminfo(
    tmp_path: Path, kind: str, host: dict[str, Any], proc: str, devices: str
) -> None:
    """llama-swap reads /proc/meminfo, so even on a CPU host its unit has ProcSubset=all (as
    nixpkgs' services.llama-swap now has); a CPU llama-server router keeps ProcSubset=pid."""
    data = {
        "hosts": {
            "box": {
                "kind": "systemd",
                **host,
                "router": {"kind": kind, "members": ["a", "b"], "binary": sys.executable},
            }
        },
        "instances": {
            "a": {"model": "/m/a.gguf", "binary": sys.executable},
            "b": {"model": "/m/b.gguf", "binary": sys.executable, "port": 9002},
        },
    }
    if kind == "llama-server":
        del data["hosts"]["box"]["router"]["binary"]
    c = parse_config(data, str(tmp_path / "llamanix.toml"))
    lines = _router_unit(c)
    assert [line for line in lines if line.startswith(("ProcSubset=", "PrivateDevices="))] == [
        proc,
        devices,
    ]
    out = tmp_path / "out"
    write_render(render_host(c, "box"), out)
    if systemd_analyze.available():
        verified = systemd_analyze.verify(out / "llamanix-router.service")
        assert verified.returncode == 0, verified.stdout + verified.stderr


# --- plan -------------------------------------------------------------------------------------


def test_plan_shows_who_stays_loaded_and_why(synth_models: Any, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from llamanix.cli import main

    path = tmp_path / "llamanix.toml"
    path.write_text(
        f"""\
[hosts.box]
kind = "systemd"
gpu = "rtx3090"
binaries = {{ upstream = "/usr/local/bin/llama-server" }}

[hosts.box.router]
kind = "llama-server"
members = ["alpha", "beta", "gamma"]
port = 8080
max_loaded = 2

[instances.alpha]
model = "{synth_models.target}"
port = 9001

[instances.beta]
model = "{synth_models.builtin_vocab}"
alias = "beta-model"
port = 9002

[instances.gamma]
model = "/nowhere/gamma.gguf"
port = 9003
"""
    )
    result = CliRunner().invoke(main, ["plan", str(path), "--no-security", "--json"])
    assert result.exit_code == 0, result.output
    host = json.loads(result.stdout)["hosts"]["box"]
    assert host["router"] == {
        "kind": "llama-server",
        "address": "127.0.0.1:8080",
        "members": {"alpha": "alpha", "beta": "beta-model", "gamma": "gamma"},
        "resident": [],
        "take_turns": ["alpha", "beta", "gamma"],
        "max_loaded": 1,
        "reason": "VRAM need of gamma unknown here (model not readable): one member at a time, "
        "which never runs out of memory",
        "too_big": [],
    }
    assert [row["address"] for row in host["instances"]] == [
        "127.0.0.1:8080 as alpha",
        "127.0.0.1:8080 as beta-model",
        "127.0.0.1:8080 as gamma",
    ]
    # Without the unreadable member, both fit in the RTX 3090's 24 GiB, within max_loaded.
    path.write_text(path.read_text().replace(', "gamma"]', "]"))
    text = CliRunner().invoke(main, ["plan", str(path), "--no-security"])
    assert text.exit_code == 0, text.output
    line = "router llama-server on 127.0.0.1:8080: alpha as 'alpha', beta as 'beta-model'\n"
    assert line in text.stdout
    assert "  loaded together: alpha, beta\n" in text.stdout
    assert "  why: all fit together: " in text.stdout


# --- llama-swap -------------------------------------------------------------------------------

SWAP_SCHEMA = Path(__file__).parent / "data" / "llama-swap" / "config-schema.json"


def _swap_config(**router: Any) -> Any:
    return config(
        {
            "big": {
                "variant": "upstream",
                "context": 32768,
                "api_key_file": "/run/secrets/k",
                "environment": {"GGML_CUDA_ENABLE_UNIFIED_MEMORY": "0"},
                "speculative": {"type": "draft", "draft_model": "/m/d one.gguf", "n_max": 8},
            },
            "small": {"variant": "ik", "alias": "fast", "port": 9002, "parallel": 1},
            "embed": {"variant": "nixpkgs", "port": 9003, "extra_args": ["--embeddings"]},
        },
        {"kind": "llama-swap", "members": ["big", "small", "embed"], **router},
        gpu="rtx3090",
        binaries={
            "upstream": "/opt/llama/bin/llama-server",
            "ik": "/opt/ik/bin/llama-server",
            "nixpkgs": "/usr/bin/llama-server",
        },
    )


@pytest.mark.parametrize(
    ("router", "vram", "groups"),
    [
        # Nothing known about the members' memory: they take turns.
        ({}, None, {"take-turns": (True, ["big", "fast", "embed"])}),
        (
            {"idle_ttl": 300},
            # Config order is priority: big stays, with room for the larger of the others.
            {"big": 22 * GIB, "small": 2 * GIB, "embed": 1 * GIB},
            {"resident": (False, ["big"]), "take-turns": (True, ["fast", "embed"])},
        ),
        (
            {},
            {"big": 10 * GIB, "small": 2 * GIB, "embed": 1 * GIB},
            {"resident": (False, ["big", "fast", "embed"])},
        ),
    ],
)
def test_llama_swap_yaml_validates_against_its_schema_and_runs_our_argv(
    router: dict[str, Any], vram: dict[str, int] | None, groups: dict[str, Any]
) -> None:
    import shlex

    import jsonschema
    import yaml

    c = _swap_config(**router)
    members = r.members(c, "box")
    plan = r.residency(c, "box", vram, 24 * GIB)
    text = r.swap_yaml(c, "box", members, plan, health_timeout_s=300)
    data = yaml.safe_load(text)
    jsonschema.Draft7Validator(json.loads(SWAP_SCHEMA.read_text())).validate(data)
    assert list(data["models"]) == ["big", "fast", "embed"]
    for member in members:
        entry = data["models"][member.served_as]
        argv = shlex.split(entry["cmd"])
        # The member's own argv for its variant, with llama-swap's address instead of its own
        # and no key (the proxy is the only client).
        own = [
            t
            for a in member.pieces
            if a.field not in ("listen", "port", "api_key_file")
            for t in a.tokens
        ]
        assert argv == [*own, "--host", "127.0.0.1", "--port", "${PORT}"]
        assert entry["proxy"] == "http://127.0.0.1:${PORT}"
        assert entry["checkEndpoint"] == "/health"
        assert entry.get("ttl") == router.get("idle_ttl")
    big = shlex.split(data["models"]["big"]["cmd"])
    assert big[0] == "/opt/llama/bin/llama-server"
    assert big[big.index("--spec-draft-model") + 1] == "/m/d one.gguf"
    assert "--api-key-file" not in big and "/run/secrets/k" not in data["models"]["big"]["cmd"]
    assert shlex.split(data["models"]["fast"]["cmd"])[0] == "/opt/ik/bin/llama-server"
    assert "fast:n_max" not in data["models"]["fast"]["cmd"]
    assert data["models"]["big"]["env"] == ["GGML_CUDA_ENABLE_UNIFIED_MEMORY=0"]
    assert {name: (g["swap"], g["members"]) for name, g in data.get("groups", {}).items()} == groups
    for g in data.get("groups", {}).values():
        assert g["exclusive"] is False and g["persistent"] is (not g["swap"])
    assert data["healthCheckTimeout"] == 300


def test_llama_swap_refuses_a_lower_case_environment_name() -> None:
    with pytest.raises(UserError) as err:
        config(
            {"big": {"environment": {"hf_home": "/x"}}},
            {"kind": "llama-swap", "members": ["big"]},
        )
    assert [str(p) for p in err.value.problems] == [
        "r.toml: instances.big.environment.hf_home: llama-swap takes only upper-case "
        "environment names (write it as HF_HOME)"
    ]


def test_llama_swap_refuses_its_macro_in_an_environment_value() -> None:
    with pytest.raises(UserError) as err:
        config(
            {"big": {"environment": {"HF_TOKEN": "${env.SECRET}"}}},
            {"kind": "llama-swap", "members": ["big"]},
        )
    assert [str(p) for p in err.value.problems] == [
        "r.toml: instances.big.environment.HF_TOKEN: holds '${', which llama-swap would replace "
        'with one of its macros (write the value without it, or use kind = "llama-server")'
    ]


def test_up_refuses_a_routed_host_in_one_line(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from llamanix.cli import main

    path = tmp_path / "llamanix.toml"
    path.write_text(
        '[hosts.box]\nkind = "systemd"\nbinaries = { upstream = "/usr/local/bin/llama-server" }\n'
        '\n[hosts.box.router]\nkind = "llama-server"\n'
        'members = ["a"]\nport = 8090\n\n[instances.a]\nmodel = "/m/a.gguf"\n'
    )
    result = CliRunner().invoke(main, ["up", str(path)])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        f"{path}: hosts.box.router: llamanix up does not run routers yet (let systemd run this "
        "host (switch without --manager up), or leave the router out)"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["llamanix.toml"]  # nothing written


@pytest.mark.server
def test_the_exporter_reads_each_member_through_the_router_and_loads_none(
    running_router: RunningRouter,
) -> None:
    """The exporter's reading of a routed host: a member the router has not loaded is
    `unloaded` (and stays unloaded: the scrape asks with autoload=false); a loaded one is read
    through the router with its own labels."""
    from llamanix.observe.exporter import reading_families
    from llamanix.observe.host_reading import HostReader

    reader = HostReader(running_router.config_path, "box")
    try:
        first = {r.target.instance: r for r in reader.read().instances}
        assert {n: r.scrape.state for n, r in first.items()} == {
            "alpha": "unloaded",
            "beta": "unloaded",
        }
        assert {k: v["value"] for k, v in _statuses(running_router.url).items()} == {
            "alpha": "unloaded",
            "beta-model": "unloaded",
        }
        assert _chat(running_router.url, "beta-model").status_code == 200
        reading = reader.read()
    finally:
        reader.close()
    rows = {r.target.instance: r for r in reading.instances}
    assert rows["alpha"].scrape.state == "unloaded"
    beta = rows["beta"]
    assert beta.scrape.state == "ok" and beta.figures is not None
    assert beta.figures.tokens_predicted and beta.figures.tokens_predicted > 0
    assert beta.target.labels["spec_type"] == "ngram-mod" and beta.build != "unknown"
    assert _statuses(running_router.url)["alpha"]["value"] == "unloaded"
    families = {f.name: f for f in reading_families(reading)}
    loaded = {s.labels["instance"]: s.value for s in families["llamanix_loaded"].samples}
    up = {s.labels["instance"]: s.value for s in families["llamanix_up"].samples}
    assert loaded == {"alpha": 0.0, "beta": 1.0} and up == {"alpha": 1.0, "beta": 1.0}
    predicted = families["llamacpp:tokens_predicted"].samples
    assert [s.labels["instance"] for s in predicted] == ["beta"]
