"""The test script of the llamanix NixOS VM test (tests/vm.nix).

vm.nix hands this file to the NixOS test driver followed by one line,
``run(machine, start_all, subtest)``: every name of the driver that the script uses is passed to
run(), so the file has no undefined names of its own and lints like any module
(tests/test_vm_script.py lints and type-checks it, and runs its HTTP checks against a real
llama-server).

The VM runs one llamanix instance on a synthetic model, built from the CPU build of variant
`base`; the specialisation named `other` is the same instance on variant `other`. Beside it runs
a router: llama-server's router mode over two more CPU instances of `base`, at most one loaded,
and in front of the router the gateway (nixpkgs' LiteLLM, its master key in /run/secrets).
What the script expects (ports, store paths, each build's probe, the router's members) is
/etc/llamanix-vm-test.json, written by vm.nix from the same derivations the module uses.
"""

import json
import shlex
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

EXPECTED_FILE = "/etc/llamanix-vm-test.json"
PROMPT = "Write a short story about a llama who learns to read."
MAX_TOKENS = 64
# Loading the model, a chat completion on a CPU inside a VM: generous, but bounded.
SERVE_TIMEOUT_S = 300
# systemd's range for DynamicUser= UIDs (61184-65519).
DYNAMIC_UIDS = range(61184, 65520)

# `systemctl show` values of the hardening every rendered CPU unit carries.
HARDENING = {
    "DynamicUser": "yes",
    "NoNewPrivileges": "yes",
    "CapabilityBoundingSet": "",
    "AmbientCapabilities": "",
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "PrivateDevices": "yes",
    "PrivateTmp": "yes",
    "ProtectKernelModules": "yes",
    "ProtectKernelTunables": "yes",
    "ProtectControlGroups": "yes",
    "ProtectProc": "invisible",
    "ProcSubset": "pid",
    "MemoryDenyWriteExecute": "yes",
    "LockPersonality": "yes",
    "RestrictRealtime": "yes",
    "RestrictSUIDSGID": "yes",
    "UMask": "0077",
}
# CPU units speak TCP only (the readiness check included).
ADDRESS_FAMILIES = {"AF_INET", "AF_INET6"}


class Node(Protocol):
    """What the script needs of the driver's machine object."""

    def succeed(self, *commands: str, timeout: int | None = None) -> str: ...

    def wait_for_unit(self, unit: str, /) -> None: ...

    def wait_until_succeeds(self, command: str, /, timeout: int = ...) -> str: ...

    def log(self, msg: str, /) -> None: ...


# --- HTTP -------------------------------------------------------------------------------------


def curl_json(node: Node, url: str, body: dict[str, Any] | None = None) -> Any:
    argv = ["curl", "--silent", "--show-error", "--fail", "--max-time", str(SERVE_TIMEOUT_S)]
    if body is not None:
        argv += ["--header", "Content-Type: application/json", "--data", json.dumps(body)]
    return json.loads(node.succeed(shlex.join([*argv, url])))


def wait_healthy(node: Node, port: int) -> None:
    # llama-server answers 503 while it loads the model; --fail makes that a retry.
    node.wait_until_succeeds(
        f"curl --silent --fail http://127.0.0.1:{port}/health", timeout=SERVE_TIMEOUT_S
    )


def check_serving(node: Node, port: int, alias: str) -> dict[str, Any]:
    """/health, the alias in /v1/models, and a chat completion that drafted: the draft is
    the target model itself, so it proposes tokens and the target accepts them. Returns the
    completion's timings."""
    url = f"http://127.0.0.1:{port}"
    health = curl_json(node, f"{url}/health")
    assert health.get("status") == "ok", f"/health answered {health}"

    models = curl_json(node, f"{url}/v1/models")
    ids = [entry.get("id") for entry in models.get("data", [])]
    assert alias in ids, f"/v1/models lists {ids}, not the alias {alias!r}"

    request = {
        "model": alias,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
    }
    reply = curl_json(node, f"{url}/v1/chat/completions", request)
    choice = reply["choices"][0]
    assert choice["message"]["role"] == "assistant", f"no assistant message: {reply}"
    assert reply["usage"]["completion_tokens"] > 0, f"nothing generated: {reply}"

    timings: dict[str, Any] = reply.get("timings") or {}
    drafted = int(timings.get("draft_n") or 0)
    accepted = int(timings.get("draft_n_accepted") or 0)
    assert drafted > 0, f"the draft model proposed no tokens (timings {timings})"
    assert 0 < accepted <= drafted, f"{accepted} of {drafted} drafted tokens accepted"
    return timings


# --- the router --------------------------------------------------------------------------------


def member_statuses(node: Node, port: int) -> dict[str, str]:
    """What the router's /v1/models says of each member: "loaded", "unloaded", ..."""
    listed = curl_json(node, f"http://127.0.0.1:{port}/v1/models")
    return {entry["id"]: entry["status"]["value"] for entry in listed.get("data", [])}


def ask_member(node: Node, port: int, name: str) -> None:
    """A chat completion through the router's port, for the member served as `name`."""
    request = {
        "model": name,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 8,
        "temperature": 0,
    }
    reply = curl_json(node, f"http://127.0.0.1:{port}/v1/chat/completions", request)
    assert reply.get("model") == name, f"asked {name!r}, answered by {reply.get('model')!r}"
    assert reply["usage"]["completion_tokens"] > 0, f"{name}: nothing generated: {reply}"


def check_router(node: Node, port: int, members: list[str]) -> None:
    """llama-server's router mode with at most one member loaded: /v1/models lists every
    member, each answers a completion through the router's one port, and asking for one
    unloads the other (a swap)."""
    wait_healthy(node, port)
    statuses = member_statuses(node, port)
    assert sorted(statuses) == sorted(members), f"/v1/models lists {sorted(statuses)}"
    # The unit's start check asked each member in turn, so the last one is loaded: asking it
    # swaps nothing, then every other member and it again each swap.
    for name in [members[-1], *members]:
        ask_member(node, port, name)
        statuses = member_statuses(node, port)
        others = {other: statuses[other] for other in members if other != name}
        assert statuses[name] == "loaded", f"{name} answered but is {statuses[name]}"
        assert set(others.values()) == {"unloaded"}, f"{name} loaded beside {others}"


# --- the gateway -------------------------------------------------------------------------------


def gateway_status(node: Node, port: int, model: str, key_file: str | None) -> tuple[int, Any]:
    """(HTTP status, reply) of a chat through the gateway. The key goes from its file into
    curl's config on stdin (a shell builtin writes it), never into an argv or the log."""
    request = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 8,
        "temperature": 0,
    }
    argv = [
        "curl", "--silent", "--show-error", "--max-time", str(SERVE_TIMEOUT_S),
        "--header", "Content-Type: application/json", "--data", json.dumps(request),
        "--write-out", "\n%{http_code}", f"http://127.0.0.1:{port}/v1/chat/completions",
    ]  # fmt: skip
    command = shlex.join(argv)
    if key_file is not None:
        key = f'"$(cat {shlex.quote(key_file)})"'
        command = (
            f"printf 'header = \"Authorization: Bearer %s\"\\n' {key} | "
            f"{shlex.join(argv[:1])} --config - {shlex.join(argv[1:])}"
        )
    body, _, status = node.succeed(command).rpartition("\n")
    try:
        reply = json.loads(body)
    except ValueError:
        reply = body
    return int(status), reply


def check_gateway(node: Node, port: int, key_file: str, models: list[str]) -> None:
    """LiteLLM serves: live, each model group answers a chat through it with the master key,
    and it refuses a chat without the key. Refused, not necessarily 401: LiteLLM 1.106.12 from
    PyPI answers 500 there (its error handler imports prisma, which its [proxy] extra lacks)."""
    node.succeed(f"curl --silent --fail http://127.0.0.1:{port}/health/liveliness")
    for model in models:
        status, reply = gateway_status(node, port, model, key_file)
        assert status == 200, f"{model} through the gateway: {status} {reply}"
        assert reply["choices"][0]["message"]["role"] == "assistant", reply
        assert reply["usage"]["completion_tokens"] > 0, f"{model}: nothing generated: {reply}"
    status, reply = gateway_status(node, port, models[0], None)
    refused = status in (401, 403) or status >= 500
    assert refused and "choices" not in str(reply), f"without the key: {status} {reply}"
    node.log(f"the gateway refused a chat without the key: HTTP {status}")


def check_gateway_unit(node: Node, unit: str, keys_unit: str, key_file: str) -> None:
    """What the module adds to nixpkgs' unit: restart, ordering after the network is online and
    after the keys unit; and no key in either unit's text or any process's argv."""
    shown = node.succeed(f"systemctl show --property=Restart,After,Wants,Requires {unit}")
    props = {k: v for k, _, v in (line.partition("=") for line in shown.splitlines())}
    assert props["Restart"] == "on-failure", props
    assert {"network-online.target", keys_unit} <= set(props["After"].split()), props
    assert "network-online.target" in props["Wants"].split(), props
    assert keys_unit in props["Requires"].split(), props
    # grep reads the key from its file: in its argv, grep would find the key in its own.
    find = f"grep --fixed-strings --quiet --file={shlex.quote(key_file)}"
    node.succeed(f"! systemctl cat {unit} {keys_unit} | {find}")
    node.succeed(f"! cat /proc/[0-9]*/cmdline | {find}")


# --- which build answers ----------------------------------------------------------------------


def expected_tells(capabilities: dict[str, Any]) -> list[str]:
    """How a build names itself: /props' build_info ("b9187-0253fb2") and its log line
    ("build: 9187 (0253fb2) ..."), from the build's own `llamanix probe --json`."""
    build, commit = capabilities.get("build"), capabilities.get("commit")
    return [f"b{build}-{commit}", f"build: {build} ({commit})"]


def build_tell(node: Node, port: int, unit: str) -> str:
    """/props' build_info; where a build has none, the build line this run of the unit logged."""
    props = curl_json(node, f"http://127.0.0.1:{port}/props")
    info = props.get("build_info")
    if isinstance(info, str) and info:
        return info
    invocation = node.succeed(f"systemctl show --property=InvocationID --value {unit}").strip()
    return node.succeed(
        f"journalctl --no-pager --output=cat _SYSTEMD_INVOCATION_ID={invocation}"
        " | grep --max-count=1 -E 'build: [0-9]+ \\('"
    ).strip()


def main_pid(node: Node, unit: str) -> int:
    pid = int(node.succeed(f"systemctl show --property=MainPID --value {unit}").strip())
    assert pid > 0, f"{unit} has no main process"
    return pid


def wait_for_build(node: Node, unit: str, out: str, port: int) -> None:
    """Until the unit's main process runs a binary of the store path `out` and is healthy:
    after a switch the old process may still be shutting down."""
    node.wait_for_unit(unit)
    node.wait_until_succeeds(
        f"pid=$(systemctl show --property=MainPID --value {unit}) && "
        f'case "$(readlink -f /proc/$pid/exe)" in {shlex.quote(out)}/*) ;; *) exit 1 ;; esac',
        timeout=SERVE_TIMEOUT_S,
    )
    wait_healthy(node, port)


def check_build(
    node: Node, expected: dict[str, Any], capabilities: dict[str, Any], variant: str
) -> None:
    """The instance runs `variant`'s build: the process, the rendered argv and the build's
    own version and commit agree."""
    unit, port = expected["unit"], expected["port"]
    out = expected["builds"][variant]["out"]
    exe = node.succeed(f"readlink -f /proc/{main_pid(node, unit)}/exe").strip()
    assert exe.startswith(out + "/"), f"{unit} runs {exe}, not the {variant} build {out}"

    argv = json.loads(node.succeed(f"cat /etc/llamanix/{expected['instance']}.argv.json"))
    assert argv[0] == f"{out}/bin/llama-server", f"rendered argv starts with {argv[0]}"
    # Once as the model, once as the draft model, in whatever spelling the variant takes.
    assert argv.count(expected["model"]) == 2, f"model and draft model not both in {argv}"

    tell = build_tell(node, port, unit)
    wanted = expected_tells(capabilities[variant])
    assert any(t in tell for t in wanted), f"{variant}: the server says {tell!r}, not {wanted}"


# --- hardening --------------------------------------------------------------------------------


def check_hardening(node: Node, unit: str) -> None:
    """The unit's sandbox as systemd applies it, and what the running process really has."""
    names = [*HARDENING, "RestrictAddressFamilies", "SystemCallFilter"]
    shown = node.succeed(f"systemctl show --property={','.join(names)} {unit}")
    props = {k: v for k, _, v in (line.partition("=") for line in shown.splitlines())}
    wrong = {k: props.get(k) for k, v in HARDENING.items() if props.get(k) != v}
    assert not wrong, f"{unit}: hardening differs from {HARDENING}: {wrong}"
    families = set(props["RestrictAddressFamilies"].split())
    assert families == ADDRESS_FAMILIES, f"RestrictAddressFamilies={families}"
    # An allow-list (no leading ~) without the @privileged calls.
    syscalls = props["SystemCallFilter"]
    assert not syscalls.startswith("~"), "SystemCallFilter is a deny-list"
    allowed = set(syscalls.split())
    assert "read" in allowed and not {"reboot", "init_module", "swapon"} & allowed, syscalls
    # No thread pinning or priority flags in the test config: the @resources calls are refused.
    assert not {"sched_setaffinity", "setpriority", "mbind"} & allowed, syscalls

    status = node.succeed(f"cat /proc/{main_pid(node, unit)}/status")
    fields = {k: v.strip() for k, _, v in (line.partition(":") for line in status.splitlines())}
    uid = int(fields["Uid"].split()[0])
    assert uid in DYNAMIC_UIDS, f"llama-server runs as uid {uid}, not a dynamic user"
    assert int(fields["CapEff"], 16) == 0, f"effective capabilities {fields['CapEff']}"
    assert int(fields["CapBnd"], 16) == 0, f"bounding set {fields['CapBnd']}"
    assert fields["NoNewPrivs"] == "1", "no_new_privs is not set"
    assert fields["Seccomp"] == "2", "no seccomp filter"


# --- the test ---------------------------------------------------------------------------------


def run(
    machine: Node,
    start_all: Callable[[], None],
    subtest: Callable[[str], AbstractContextManager[None]],
) -> None:
    start_all()
    machine.wait_for_unit("multi-user.target")
    expected = json.loads(machine.succeed(f"cat {EXPECTED_FILE}"))
    unit, port, alias = expected["unit"], expected["port"], expected["alias"]
    base, other = expected["base"], expected["other"]
    builds = expected["builds"]
    capabilities = {
        variant: json.loads(machine.succeed(f"cat {build['capabilities']}"))
        for variant, build in builds.items()
    }
    assert builds[base]["out"] != builds[other]["out"], "both configurations use one build"
    assert expected_tells(capabilities[base]) != expected_tells(capabilities[other]), (
        f"{base} and {other} report the same version and commit: the flip would go unseen"
    )

    def serves(variant: str) -> None:
        wait_for_build(machine, unit, builds[variant]["out"], port)
        check_build(machine, expected, capabilities, variant)
        timings = check_serving(machine, port, alias)
        machine.log(
            f"{variant}: {timings.get('predicted_n')} tokens, drafted {timings.get('draft_n')},"
            f" accepted {timings.get('draft_n_accepted')}"
        )

    with subtest(f"{unit} serves from the {base} build and drafts with draft = target"):
        serves(base)

    with subtest(f"{unit} is hardened"):
        check_hardening(machine, unit)

    router = expected["router"]
    with subtest(f"{router['unit']} routes to {', '.join(router['members'])} and swaps them"):
        machine.wait_for_unit(router["unit"])
        check_router(machine, router["port"], router["members"])
        check_hardening(machine, router["unit"])

    gateway = expected["gateway"]
    with subtest(f"{gateway['unit']} serves {', '.join(gateway['models'])} with its key only"):
        machine.wait_for_unit(gateway["unit"])
        check_gateway_unit(machine, gateway["unit"], gateway["keysUnit"], gateway["keyFile"])
        check_gateway(machine, gateway["port"], gateway["keyFile"], gateway["models"])

    with subtest(f"the specialisation flips {unit} to the {other} build"):
        machine.succeed(
            f"/run/booted-system/specialisation/{other}/bin/switch-to-configuration test"
        )
        serves(other)
        check_hardening(machine, unit)

    with subtest(f"switching back brings the {base} build back"):
        machine.succeed("/run/booted-system/bin/switch-to-configuration test")
        serves(base)
