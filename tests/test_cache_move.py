"""A rolling switch's cache moves as the controller orders them (fleet/cache_move.py):
which replicas move where, which go cold and why, and the agent commands a move runs, in
order (a dry run prints them). The moves themselves, against real hosts and servers:
tests/test_fleet_gateway.py."""

from __future__ import annotations

import base64
import json
import threading
import tomllib
from pathlib import Path

import pytest

from llamanix.config.model import Config, parse_config
from llamanix.core.errors import UserError
from llamanix.external.process import Runner
from llamanix.fleet.cache_move import CacheMoves


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
            f'listen = "0.0.0.0"\nkeyless = true\nport = {port}\ncontext = 2048\nparallel = 2\n'
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
    requests = [json.loads(line.split(": ", 1)[1]) for line in said if line.startswith("# on ")]
    # The gateway first (chat-box1 draining), then the save on box1: each a step of the
    # host's own switch, the one command its sudoers line allows for it.
    assert len(commands) == 2
    assert all(c.endswith(" -- 'sudo -n llamanix fleet-agent switch'") for c in commands)
    assert ["admin@box3" in commands[0], "admin@box1" in commands[1]] == [True, True]
    assert [(r["host"], r["cache"]["step"]) for r in requests] == [
        ("box3", "route"),
        ("box1", "save"),
    ]
    assert "order" not in requests[1] and json.loads(requests[1]["cache"]["order"]) == {
        "instance": "chat-box1"
    }
    said.clear()
    plan.after("box1")
    # The drain ends: the gateway is told, once.
    steps = [line for line in said if line.startswith("# on ") and '"step": "route"' in line]
    assert len(steps) == 1


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
    # A switch to the file as it is cannot tell here what the host runs: its replicas move.
    same = config(tmp_path)
    plan, said = moves(same, same, [["box1"], ["box2"]])
    assert plan.before("box1")["chat-box1"].to == "chat-box2"


def test_the_agent_sends_only_a_file_a_move_saved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The controller names the file to send; only a move's own file names pass, and a link
    planted in the unit's state directory (the server's user owns it) is not followed."""
    from llamanix.switch import cache_moves

    cfg = config(tmp_path)
    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setattr(cache_moves, "state_directory", lambda name, manager: state)
    secret = tmp_path / "secret"
    secret.write_text("root's own\n")
    for name in ("../secret", "/etc/shadow", "llamanix-warm-0.bin", "llamanix-move-in.bin"):
        with pytest.raises(UserError, match="is not a file a move saves"):
            list(cache_moves.send(cfg, "box1", "chat-box1", name, "stdin"))
    (state / "llamanix-move-0.bin").symlink_to(secret)
    with pytest.raises(UserError, match=r"llamanix-move-0\.bin: Too many levels of symbolic links"):
        list(cache_moves.send(cfg, "box1", "chat-box1", "llamanix-move-0.bin", "stdin"))
    with pytest.raises(UserError, match="no instance 'chat-box2' on host 'box1'"):
        list(cache_moves.send(cfg, "box1", "chat-box2", "llamanix-move-0.bin", "stdin"))
    # A saved file: its bytes, then its size and digest, and it is gone.
    (state / "llamanix-move-0.bin").unlink()
    (state / "llamanix-move-1.bin").write_bytes(b"\x00" * 100_000)
    lines = list(cache_moves.send(cfg, "box1", "chat-box1", "llamanix-move-1.bin", "stdin"))
    data = b"".join(base64.b64decode(line) for line in lines[:-1])
    assert data == b"\x00" * 100_000
    assert json.loads(lines[-1])["bytes"] == 100_000
    assert not (state / "llamanix-move-1.bin").exists()


def test_the_gateway_routes_are_written_and_their_answer_awaited(tmp_path: Path) -> None:
    """What the gateway's agent does: the routes file written whole, then the plugin's answer
    awaited; a plugin that does not answer in time is said so, and nothing else fails."""
    from llamanix.render.litellm_plugin import llamanix_gateway as plugin
    from llamanix.switch import cache_moves

    routes = tmp_path / "routes.json"
    router = plugin.Router(
        plugin.Settings(5.0, str(routes), 10, {"chat": True}, {"chat-box1": "http://x/health"})
    )
    stop = threading.Event()
    watcher = threading.Thread(target=plugin.watch_routes, args=(router, routes, stop))
    watcher.start()
    try:
        answer = cache_moves.route({"seq": 5, "draining": ["chat-box1"], "moves": {}}, routes)
    finally:
        stop.set()
        watcher.join()
    assert answer == {"applied": True}
    assert router.draining == {"chat-box1"}
    late = cache_moves.route({"seq": 6, "draining": [], "moves": {}}, routes, wait_s=0.3)
    assert late == {"applied": False, "why": "the gateway did not apply them within 0.3 s"}
    gone = cache_moves.route({"seq": 7}, tmp_path / "none" / "routes.json")
    assert gone["applied"] is False and "the gateway never ran here" in str(gone["why"])


def test_the_agent_reads_a_moved_file_whole_from_its_request(tmp_path: Path) -> None:
    """The ``take`` step gets its header and megabytes of data lines in the request on
    ``fleet-agent switch``'s stdin: every byte reaches the restore."""
    import os
    import subprocess
    import sys

    from llamanix.fleet.protocol import ANSWER, PROTOCOL, AgentRequest, CacheStep

    config(tmp_path)
    fleet_dir = tmp_path / "fleet"
    fleet_dir.mkdir(mode=0o700)
    # The agent's copy, as a switch leaves it: its own host's target taken out.
    text = (tmp_path / "llamanix.toml").read_text().replace('target = "admin@box2"\n', "")
    (fleet_dir / "llamanix.toml").write_text(text)
    data = os.urandom(3 << 20)
    lines = [base64.b64encode(data[i : i + 49152]).decode() for i in range(0, len(data), 49152)]
    header = {"instance": "chat-box2", "bytes": len(data)}
    step = CacheStep("take", json.dumps(header), tuple(lines))
    request = AgentRequest(PROTOCOL, "box2", cache=step).text()
    stand_in = (
        "import base64, sys\n"
        "import llamanix.switch.cache_moves as m\n"
        "m.take = lambda c, h, hd, ch, s: {'bytes': sum(len(base64.b64decode(x)) for x in ch),"
        " 'header': hd}\n"
        "from llamanix.cli import main\n"
        "sys.argv[0] = 'llamanix'\n"
        "main()\n"
    )
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-c", stand_in, "fleet-agent", "switch"],
        input=request,
        env={**os.environ, "PYTHONPATH": str(root / "tools"), "LLAMANIX_FLEET_DIR": str(fleet_dir)},
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    answer = next(line for line in done.stdout.splitlines() if line.startswith(ANSWER))
    assert json.loads(answer[len(ANSWER) :]) == {"bytes": len(data), "header": header}


def test_a_cache_step_is_no_switch_and_names_no_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache step comes to ``switch`` instead of a config, never with one; a ``send`` step
    that names a path instead of a file a move saved is refused in one line."""
    from click.testing import CliRunner

    from llamanix.cli import main
    from llamanix.fleet.protocol import PROTOCOL, AgentRequest, CacheStep, SwitchOrder
    from llamanix.switch.switch_records import SwitchOptions

    config(tmp_path)
    fleet_dir = tmp_path / "fleet"
    fleet_dir.mkdir(mode=0o700)
    text = (tmp_path / "llamanix.toml").read_text().replace('target = "admin@box1"\n', "")
    (fleet_dir / "llamanix.toml").write_text(text)
    monkeypatch.setenv("LLAMANIX_FLEET_DIR", str(fleet_dir))
    send = CacheStep("send", json.dumps({"instance": "chat-box1", "file": "../../etc/shadow"}))
    both = AgentRequest(
        PROTOCOL, "box1", SwitchOrder("toml", text, SwitchOptions()), cache=send
    ).text()
    done = CliRunner().invoke(main, ["fleet-agent", "switch"], input=both)
    assert done.exit_code == 2, done.output
    assert "a request is a switch or a step of a cache move" in done.output
    done = CliRunner().invoke(
        main, ["fleet-agent", "switch"], input=AgentRequest(PROTOCOL, "box1", cache=send).text()
    )
    assert done.exit_code == 2, done.output
    assert "'../../etc/shadow' is not a file a move saves" in done.output
    assert len([line for line in done.output.splitlines() if "shadow" in line]) == 1


def test_a_file_larger_than_a_request_travels_in_parts_each_inside_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real model's slot is larger than the agent's bound on its stdin (a 4k-token Gemma 3
    270M slot: about 75 MB): ``send`` hands it in parts, each part's ``take`` request fits the
    bound, and the taker appends them into one file whose bytes are the saved file's."""
    import os

    from llamanix.core import file_reader
    from llamanix.fleet.protocol import PROTOCOL, AgentRequest, CacheStep
    from llamanix.hosts.warm import slot_layout, write_stamp
    from llamanix.switch import cache_moves

    cfg = config(tmp_path)
    source, target = tmp_path / "source", tmp_path / "target"
    source.mkdir()
    target.mkdir()
    dirs = {"chat-box1": source, "chat-box2": target}
    monkeypatch.setattr(cache_moves, "state_directory", lambda name, manager: dirs[name])
    monkeypatch.setattr(cache_moves, "server_build", lambda endpoint: "b1-abc")
    monkeypatch.setattr(cache_moves, "_cold_of", lambda inst: None)  # no model file here
    restored: list[bytes] = []

    def restore(
        endpoint: object, name: str, header: object, tokens: int, size: int
    ) -> dict[str, object]:
        restored.append((target / cache_moves.INCOMING).read_bytes())
        return {"outcome": "restored", "bytes": size, "tokens": tokens}

    monkeypatch.setattr(cache_moves, "_restore", restore)
    data = os.urandom(2 * cache_moves.PART_BYTES + 12345)
    (source / "llamanix-move-0.bin").write_bytes(data)
    write_stamp(source, "llamanix-move-0.bin", "b1-abc", slot_layout(cfg.instances["chat-box2"]))
    offset, parts = 0, 0
    while True:
        lines = list(
            cache_moves.send(cfg, "box1", "chat-box1", "llamanix-move-0.bin", "stdin", offset)
        )
        sent = json.loads(lines[-1])
        assert sent["offset"] == offset and sent["size"] == len(data)
        header = {"instance": "chat-box2", "tokens": 7, **sent}
        step = CacheStep("take", json.dumps(header), tuple(lines[:-1]))
        assert len(AgentRequest(PROTOCOL, "box2", cache=step).text()) < file_reader.LIMIT
        took = cache_moves.take(cfg, "box2", header, iter(lines[:-1]), "stdin")
        parts += 1
        if sent["last"]:
            break
        assert took == {"tokens": 7, "outcome": "receiving", "bytes": offset + sent["bytes"]}
        assert (source / "llamanix-move-0.bin").exists()
        offset += sent["bytes"]
    assert parts == 3
    assert took["outcome"] == "restored" and restored == [data]
    assert not (source / "llamanix-move-0.bin").exists()
    assert not (target / cache_moves.INCOMING).exists()


def test_a_part_out_of_place_or_damaged_ends_the_move_and_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A part that does not start where the taken bytes end, or whose digest does not match,
    is refused and the half-taken file deleted; a discarded file is deleted at its source."""
    import hashlib

    from llamanix.hosts.warm import slot_layout
    from llamanix.switch import cache_moves

    cfg = config(tmp_path)
    target = tmp_path / "target"
    target.mkdir()
    monkeypatch.setattr(cache_moves, "state_directory", lambda name, manager: target)
    monkeypatch.setattr(cache_moves, "server_build", lambda endpoint: "b1-abc")
    monkeypatch.setattr(cache_moves, "_cold_of", lambda inst: None)  # no model file here
    stamp = {"build": "b1-abc", "layout": slot_layout(cfg.instances["chat-box2"])}
    part = b"x" * 1000
    line = base64.b64encode(part).decode()
    good = {
        "instance": "chat-box2",
        "bytes": 1000,
        "sha256": hashlib.sha256(part).hexdigest(),
        "size": 3000,
        "last": False,
        "stamp": stamp,
    }
    first = cache_moves.take(cfg, "box2", {**good, "offset": 0}, iter([line]), "stdin")
    assert first["outcome"] == "receiving"
    skipped = cache_moves.take(cfg, "box2", {**good, "offset": 2000}, iter([line]), "stdin")
    assert skipped["outcome"] == "not restored"
    assert "came out of place" in str(skipped["why"])
    assert not (target / cache_moves.INCOMING).exists()
    cache_moves.take(cfg, "box2", {**good, "offset": 0}, iter([line]), "stdin")
    damaged = {**good, "offset": 1000, "sha256": "0" * 64}
    answer = cache_moves.take(cfg, "box2", damaged, iter([line]), "stdin")
    assert answer["why"] == "the bytes arrived damaged"
    assert not (target / cache_moves.INCOMING).exists()
    # Another build's file is refused before its first part is written.
    other = {**good, "offset": 0, "stamp": {**stamp, "build": "b2-def"}}
    refused = cache_moves.take(cfg, "box2", other, iter([line]), "stdin")
    assert "each build reads only its own files" in str(refused["why"])
    assert not (target / cache_moves.INCOMING).exists()
    # The controller gives up on a file: its source deletes it and its stamp.
    (target / "llamanix-move-3.bin").write_bytes(part)
    (target / "llamanix-move-3.json").write_text("{}")
    said = list(
        cache_moves.send(cfg, "box2", "chat-box2", "llamanix-move-3.bin", "stdin", discard=True)
    )
    assert said == ['{"discarded": true}']
    assert list(target.iterdir()) == []
    with pytest.raises(UserError, match="is not a byte offset"):
        list(cache_moves.send(cfg, "box2", "chat-box2", "llamanix-move-3.bin", "stdin", -1))


def test_a_fifo_a_directory_or_a_link_planted_by_the_servers_user_hangs_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The state directories are the server's and the gateway's users': a FIFO where a move
    reads or appends, or a directory where it writes, is refused at once (root never waits on
    it), and a file written there gets its mode on the descriptor, never through a name."""
    import hashlib
    import os

    from llamanix.external.files import atomic_write
    from llamanix.switch import cache_moves

    cfg = config(tmp_path)
    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setattr(cache_moves, "state_directory", lambda name, manager: state)
    monkeypatch.setattr(cache_moves, "server_build", lambda endpoint: "b1")
    monkeypatch.setattr(cache_moves, "_cold_of", lambda inst: None)
    os.mkfifo(state / "llamanix-move-0.bin")
    with pytest.raises(UserError, match=r"llamanix-move-0\.bin: not a regular file"):
        list(cache_moves.send(cfg, "box1", "chat-box1", "llamanix-move-0.bin", "stdin"))
    os.mkfifo(state / cache_moves.INCOMING)
    line = base64.b64encode(b"x").decode()
    part = {"instance": "chat-box2", "offset": 1, "bytes": 1, "last": False}
    part["sha256"] = hashlib.sha256(b"x").hexdigest()
    answer = cache_moves.take(cfg, "box2", part, iter([line]), "stdin")
    assert answer["outcome"] == "not restored" and "not written" in str(answer["why"])
    (state / cache_moves.INCOMING).unlink(missing_ok=True)
    (state / cache_moves.INCOMING).mkdir()
    first = {**part, "offset": 0, "stamp": None}
    answer = cache_moves.take(cfg, "box2", first, iter([line]), "stdin")
    assert answer["outcome"] == "not restored"
    gateway = tmp_path / "gateway"
    gateway.mkdir()
    os.mkfifo(gateway / "routes-applied.json")
    said = cache_moves.route({"seq": 1}, gateway / "routes.json", wait_s=0.3)
    assert said == {"applied": False, "why": "the gateway did not apply them within 0.3 s"}
    atomic_write(gateway / "stamp.json", "{}\n", mode=0o600)
    assert (gateway / "stamp.json").stat().st_mode & 0o777 == 0o600
