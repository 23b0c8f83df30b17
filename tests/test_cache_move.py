"""A rolling switch's cache moves as the controller orders them (deploy/fleet/cache_move.py):
which replicas move where, which go cold and why, and the agent commands a move runs, in
order (a dry run prints them). The moves themselves, against real hosts and servers:
tests/test_fleet_gateway.py."""

from __future__ import annotations

import tomllib
from pathlib import Path

from llamanix.core.config import Config, parse_config
from llamanix.deploy.fleet.cache_move import CacheMoves
from llamanix.external.process import Runner


def config(
    tmp_path: Path, warm: bool = True, gateway_kind: str = "systemd", **extra: str
) -> Config:
    text = ""
    for name in ("box1", "box2", "box3"):
        kind = gateway_kind if name == "box3" else "systemd"
        target = f'target = "admin@{name}"\n' if kind == "systemd" else ""
        binaries = 'binaries = { upstream = "/usr/local/bin/llama-server" }\n'
        text += (
            f'[hosts.{name}]\nkind = "{kind}"\n{target}{binaries if kind == "systemd" else ""}\n'
        )
    text += (
        '[gateway]\nkind = "litellm"\nhost = "box3"\nlisten = "0.0.0.0"\n'
        'api_key_file = "/etc/llamanix/gateway.key"\n' + extra.get("gateway", "") + "\n"
    )
    for name, port in (("box1", 18081), ("box2", 18082)):
        text += (
            f'[instances.chat-{name}]\nhost = "{name}"\nalias = "chat"\nmodel = "/m/tiny.gguf"\n'
            f'listen = "0.0.0.0"\nport = {port}\ncontext = 2048\nparallel = 2\n'
            f"warm_switch = {'true' if warm else 'false'}\n" + extra.get(name, "") + "\n"
        )
    path = tmp_path / "llamanix.toml"
    path.write_text(text)
    return parse_config(tomllib.loads(text), str(path))


def moves(old: Config, new: Config, batches: list[list[str]]) -> tuple[CacheMoves, list[str]]:
    said: list[str] = []
    runner = Runner(dry_run=True, echo=said.append)
    return CacheMoves(old, new, batches, runner, said.append), said


def test_a_drained_replica_moves_its_caches_to_the_replica_outside_its_batch(
    tmp_path: Path,
) -> None:
    old = config(tmp_path)
    new = config(tmp_path, box1="threads = 1\n", box2="threads = 1\n")
    plan, said = moves(old, new, [["box1"], ["box2"]])
    records = plan.before("box1")
    assert {n: (r.to, r.cold) for n, r in records.items()} == {"chat-box1": ("chat-box2", None)}
    commands = [line for line in said if line.startswith("ssh ")]
    # The gateway first (chat-box1 draining), then the save on box1.
    assert len(commands) == 2
    assert "admin@box3 -- 'sudo -n llamanix fleet-agent gateway-route --protocol 2" in commands[0]
    assert "admin@box1 -- 'sudo -n llamanix fleet-agent caches-save --protocol 2" in commands[1]
    said.clear()
    plan.after("box1")
    # The drain ends: the gateway is told, once.
    assert [line for line in said if "gateway-route" in line] != []


def test_caches_go_cold_saying_why(tmp_path: Path) -> None:
    new_text = {"box1": "threads = 1\n", "box2": "threads = 1\n"}
    # Without warm_switch there is no --slot-save-path: nothing is asked of any host.
    plan, said = moves(
        config(tmp_path, warm=False), config(tmp_path, warm=False, **new_text), [["box1"], ["box2"]]
    )
    records = plan.before("box1")
    assert records["chat-box1"].cold == (
        "chat-box1 runs without warm_switch (no --slot-save-path to move caches through)"
    )
    assert not [line for line in said if line.startswith("ssh ")]
    # Both replicas in one batch: nobody outside it takes them over.
    plan, said = moves(config(tmp_path), config(tmp_path, **new_text), [["box1", "box2"]])
    assert plan.before("box1")["chat-box1"].cold == (
        "no other replica of chat outside this batch takes them over"
    )
    # A NixOS gateway has no fleet agent to tell.
    plan, said = moves(
        config(tmp_path, gateway_kind="nixos"),
        config(tmp_path, gateway_kind="nixos", **new_text),
        [["box1"], ["box2"]],
    )
    assert plan.before("box1")["chat-box1"].cold == (
        "the gateway's host 'box3' is not reached by a fleet agent"
    )
    # A group without affinity moves nothing, and has no record.
    plan, said = moves(
        config(tmp_path, gateway="affinity = false\n"),
        config(tmp_path, gateway="affinity = false\n", **new_text),
        [["box1"], ["box2"]],
    )
    assert plan.before("box1") == {}
    # A replica the switch does not restart keeps its caches where they are.
    plan, said = moves(config(tmp_path), config(tmp_path), [["box1"], ["box2"]])
    assert plan.before("box1") == {}
