"""A router under a real systemd (PID 1) on Debian 12 (systemd 252) and Debian 13 (systemd 257):
llama-server's router mode as llamanix's one unit, two members behind one port, a switch that
adds a member, and a member that cannot load rolling the whole router back.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from conftest import HOST_FIGURES
from hostbed import CONFIG, SERVER, UNITS, exposure, generations, llamanix, output, reset

from llamanix.testbed import hosts
from llamanix.testbed.hosts import Host

pytestmark = [pytest.mark.server, pytest.mark.hosts]

UNIT = "llamanix-router.service"
PORT = 8090
TINY = f"{hosts.MODELS}/tiny.gguf"
TARGET = f"{hosts.MODELS}/target.gguf"
GARBAGE = f"{hosts.MODELS}/not-a-model.gguf"


@pytest.fixture(autouse=True)
def clean(host: Host) -> Iterator[None]:
    yield
    reset(host)


def router_config(members: dict[str, str], max_loaded: int | None = None) -> str:
    """A systemd host whose instances all sit behind a llama-server router on PORT."""
    cap = f"max_loaded = {max_loaded}\n" if max_loaded else ""
    text = (
        f'[hosts.box]\nkind = "systemd"\nbinaries = {{ upstream = "{SERVER}" }}\n\n'
        f'[hosts.box.router]\nkind = "llama-server"\nmembers = {json.dumps(list(members))}\n'
        f"port = {PORT}\n{cap}\n"
    )
    for i, (name, model) in enumerate(members.items()):
        text += (
            f'[instances.{name}]\nvariant = "upstream"\nmodel = "{model}"\nport = {9100 + i}\n'
            "context = 1024\nparallel = 1\n\n"
        )
    return text


_ASK = """
import json, sys, httpx
port, model = sys.argv[1], sys.argv[2]
body = {"model": model, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}
r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=120)
models = httpx.get(f"http://127.0.0.1:{port}/models", timeout=10).json()["data"]
print(json.dumps({"status": r.status_code,
                  "model": r.json().get("model") if r.status_code == 200 else None,
                  "loaded": sorted(m["id"] for m in models if m["status"]["value"] == "loaded"),
                  "listed": sorted(m["id"] for m in models)}))
"""


def ask(host: Host, model: str) -> dict[str, object]:
    """A chat for ``model`` through the router, then which members are loaded."""
    done = host.run([f"{hosts.VENV}/bin/python", "-c", _ASK, str(PORT), model], check=True)
    data = json.loads(done.stdout)
    assert isinstance(data, dict)
    return data


def switch(host: Host) -> str:
    done = llamanix(host, "switch", CONFIG)
    return f"{done.returncode}\n{output(done)}"


def test_router_serves_two_members_behind_one_port(host: Host) -> None:
    host.write(CONFIG, router_config({"small": TINY, "big": TARGET}, max_loaded=1), mode=0o644)
    result = switch(host)
    assert result.startswith("0\n"), result
    assert host.run(["systemctl", "is-active", UNIT], check=False).stdout.strip() == "active"
    # The members are the router's children, not units of their own.
    assert not host.path(f"{UNITS}/llamanix-small.service").exists()
    unit_text = host.path(f"{UNITS}/{UNIT}").read_text()
    assert "--models-preset %d/router-presets.ini" in unit_text
    assert "SetCredential=router-presets.ini:" in unit_text
    assert "--served-model small --served-model big" in unit_text
    # On loopback, with no member downloading: ordered after network.target, as nixpkgs'
    # llama-cpp and llama-swap modules order theirs, and the boot does not wait for the network.
    shown = host.run(["systemctl", "show", "--property=After,Wants", UNIT], check=True).stdout
    deps = {k: v.split() for k, _, v in (line.partition("=") for line in shown.splitlines())}
    assert "network.target" in deps["After"], deps
    assert "network-online.target" not in deps["After"] + deps["Wants"], deps
    for model, other in (("small", "big"), ("big", "small"), ("small", "big")):
        got = ask(host, model)
        # max_loaded = 1: the router evicts one member to load the other.
        assert got == {
            "status": 200,
            "model": model,
            "loaded": [model],
            "listed": ["big", "small"],
        }, (model, other, got)
    # The loaded member runs inside the router's unit (its cgroup), sandbox and all.
    child = host.run(["pgrep", "-f", "--", "--alias small"], check=True).stdout.split()
    assert len(child) == 1, child
    cgroup = host.run(["cat", f"/proc/{child[0]}/cgroup"], check=True).stdout
    assert f"/system.slice/{UNIT}" in cgroup, cgroup
    online = exposure(host, UNIT)
    HOST_FIGURES.append(f"{host.spec.name}: router unit exposure {online} online (running)")
    assert online <= 1.0


def test_switch_adds_a_member_and_a_member_that_cannot_load_rolls_the_router_back(
    host: Host,
) -> None:
    host.write(CONFIG, router_config({"small": TINY}), mode=0o644)
    result = switch(host)
    assert result.startswith("0\n"), result
    assert ask(host, "small")["status"] == 200

    # Adding a member: the router's unit changes, and both members are gated through it.
    host.write(CONFIG, router_config({"small": TINY, "big": TARGET}), mode=0o644)
    result = switch(host)
    assert result.startswith("0\n"), result
    assert "big" in result and "small" in result
    assert ask(host, "big")["status"] == 200
    assert ask(host, "small")["status"] == 200
    good = host.path(f"{UNITS}/{UNIT}").read_text()

    # A third member whose file is no model: the router's start fails on it, and the whole
    # router (its config is in its unit) goes back to the two members that served.
    host.write(GARBAGE, "not a gguf\n", mode=0o644)
    host.write(
        CONFIG,
        router_config({"small": TINY, "big": TARGET, "broken": GARBAGE}),
        mode=0o644,
    )
    result = switch(host)
    journal = host.run(
        ["journalctl", "-u", UNIT, "-n", "80", "--no-pager", "-o", "cat"], check=False
    ).stdout
    assert result.startswith("1\n"), result
    assert "model broken failed to load (its llama-server exited with 1)" in result, result
    assert "previous generation serving again" in result, result + journal
    assert host.path(f"{UNITS}/{UNIT}").read_text() == good
    assert ask(host, "big")["status"] == 200
    assert ask(host, "small")["listed"] == ["big", "small"]
    rows = sorted(generations(host), key=lambda r: int(str(r["number"])))
    assert [(r["gate"]["result"], r["current"]) for r in rows] == [  # type: ignore[index]
        ("passed", False),
        ("passed", True),
        ("failed", False),
    ]
    failed = rows[-1]["gate"]["instances"]  # type: ignore[index]
    assert "did not start" in failed["broken"]["detail"]
