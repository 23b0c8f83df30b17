"""The gateway plugin's decisions (render/litellm_plugin/llamanix_gateway.py), without LiteLLM:
which conversation a request continues, where it goes, and what moves it elsewhere. The plugin
under a real LiteLLM in front of real servers: tests/test_gateway_affinity.py."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from llamanix.render.litellm_plugin import llamanix_gateway as plugin
from llamanix.render.litellm_plugin.llamanix_gateway import (
    Router,
    Settings,
    SettingsError,
    conversation_key,
)

HEALTH = {"a": "http://a:1/health", "b": "http://b:1/health"}


def settings(**over: object) -> Settings:
    base: dict[str, object] = {
        "interval_s": 5.0,
        "routes": None,
        "conversations": 100,
        "affinity": {"chat": True, "embed": False},
        "health": HEALTH,
    }
    base.update(over)
    return Settings(**base)  # type: ignore[arg-type]


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def chat(first: str, *turns: str, system: str = "You help.") -> list[dict[str, str]]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": first}]
    for turn in turns:
        messages += [
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": turn},
        ]
    return messages


def test_a_conversation_keeps_its_key_as_it_grows() -> None:
    one = conversation_key(chat("Plan a trip."), {})
    assert one is not None
    assert conversation_key(chat("Plan a trip.", "To Rome.", "In May."), {}) == one
    assert conversation_key(chat("Plan a holiday."), {}) != one
    assert conversation_key(chat("Plan a trip.", system="You are terse."), {}) != one
    # The parts of a multi-part message count as its text.
    parts = [{"role": "user", "content": [{"type": "text", "text": "Plan a trip."}]}]
    assert conversation_key(parts, {}) == conversation_key(
        [{"role": "user", "content": "Plan a trip."}], {}
    )
    # A raw completion's prompt grows turn by turn: its first PREFIX_CHARS name it.
    prompt = "x" * plugin.PREFIX_CHARS
    assert conversation_key([{"role": "user", "content": prompt + " turn 1"}], {}) == (
        conversation_key([{"role": "user", "content": prompt + " turn 1, turn 2"}], {})
    )
    # The session header names it whatever the messages say, in any case of its name.
    assert conversation_key(chat("a"), {"X-Session-Id": "s1"}) == conversation_key(
        chat("b"), {"x-session-id": "s1"}
    )
    assert conversation_key(chat("a"), {"x-session-id": "s1"}) != one
    assert conversation_key([{"role": "system", "content": "x"}], {}) is None
    assert conversation_key(None, {}) is None


def test_new_conversations_spread_and_each_keeps_its_replica() -> None:
    router = Router(settings(), Clock())
    homes = {}
    for n in range(4):
        (homes[n],) = router.choose("chat", f"c{n}", ["a", "b"])
    assert sorted(homes.values()) == ["a", "a", "b", "b"]
    for n in range(4):
        assert router.choose("chat", f"c{n}", ["a", "b"]) == [homes[n]]
    # A request with no conversation goes to the least loaded, and is not remembered.
    router.started("x1", "a", None)
    assert router.choose("chat", None, ["a", "b"]) == ["b"]
    assert len(router.conversations) == 4


def test_the_least_loaded_replica_takes_a_new_conversation() -> None:
    router = Router(settings(), Clock())
    router.checked("a", True, 0.0, slots=2)
    router.checked("b", True, 0.0, slots=4)
    for call in ("1", "2"):
        router.started(call, "b", None)
    router.started("3", "a", None)
    # a: 1 of 2 slots busy, b: 2 of 4: equal; then fewer requests in flight wins.
    assert router.choose("chat", "new", ["a", "b"]) == ["a"]
    router.ended("3")
    router.started("4", "a", None)
    router.started("5", "a", None)
    assert router.choose("chat", "newer", ["a", "b"]) == ["b"]


def test_a_full_replica_spills_its_conversation_over() -> None:
    router = Router(settings(), Clock())
    router.checked("a", True, 0.0, slots=1)
    router.checked("b", True, 0.0, slots=1)
    assert router.choose("chat", "c", ["a", "b"]) == ["a"]
    router.started("1", "a", None)
    # Its one slot busy: it still waits there (a wait costs less than the prefill elsewhere).
    assert router.choose("chat", "c", ["a", "b"]) == ["a"]
    router.started("2", "a", None)
    # As many waiting as slots, and b has a slot free: it goes to b, and lives there now.
    assert router.choose("chat", "c", ["a", "b"]) == ["b"]
    assert router.home("chat", "c") == "b"


def test_a_replica_that_fails_is_left_out_until_a_later_check_passes() -> None:
    clock = Clock()
    router = Router(settings(), clock)
    assert router.choose("chat", "c", ["a", "b"]) == ["a"]
    router.failed("a")
    # The retry goes elsewhere, and the conversation with it.
    assert router.choose("chat", "c", ["a", "b"]) == ["b"]
    # A check sent before the failure does not bring it back; one sent after does.
    router.checked("a", True, started=clock.t - 1)
    assert router.choose("chat", "new", ["a", "b"]) == ["b"]
    clock.t += 5
    router.checked("a", True, started=clock.t)
    assert router.choose("chat", "newer", ["a", "b"]) == ["a"]
    # A replica whose /health does not answer 200 is out too.
    router.checked("b", False, started=clock.t)
    assert router.choose("chat", "c", ["a", "b"]) == ["a"]
    # With every replica out, LiteLLM gets them all: the request fails with their own error.
    router.checked("a", False, started=clock.t)
    assert router.choose("chat", "c", ["a", "b"]) == ["a", "b"]


def test_a_late_health_answer_moves_no_conversation_until_three_in_a_row(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A replica busy with prefill on a loaded host answers its /health late: two late
    answers keep its conversations there (each move is a full prefill elsewhere), the third
    in a row makes it unhealthy; a refusal or a 503 does so at once, and a late answer after
    one keeps it out. Each move is said, with its reason and without the conversation."""
    router = Router(settings(), Clock())
    assert router.choose("chat", "secret-session", ["a", "b"]) == ["a"]
    for _ in range(2):
        router.checked("a", False, 0.0, late=True)
        assert router.choose("chat", "secret-session", ["a", "b"]) == ["a"]
    router.checked("a", False, 0.0, late=True)
    assert router.choose("chat", "secret-session", ["a", "b"]) == ["b"]
    said = capsys.readouterr().err
    assert "replica a is unhealthy" in said
    assert "a conversation of chat moved from a to b: it fails its health checks" in said
    assert "secret-session" not in said
    router.checked("a", True, 0.0)
    assert "replica a passes its health checks again" in capsys.readouterr().err
    router.checked("a", False, 0.0)  # refused, or a 503: out at once
    assert router.choose("chat", "other", ["a", "b"]) == ["b"]
    router.checked("a", False, 0.0, late=True)
    assert not router.replicas["a"].healthy


def test_a_late_answer_is_told_from_a_refusal() -> None:
    """What the check reads: no answer in time is ``LATE``; a closed port is not."""
    import socket

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)  # accepts into its backlog, never answers
        port = silent.getsockname()[1]
        status, _ = plugin._get_json(f"http://127.0.0.1:{port}/health", 0.3)
        assert status == plugin.LATE
    status, _ = plugin._get_json(f"http://127.0.0.1:{port}/health", 0.3)
    assert status == 0


def test_a_group_without_affinity_gets_every_usable_replica() -> None:
    router = Router(settings(), Clock())
    router.checked("b", False, 0.0)
    assert router.choose("embed", "c", ["a", "b"]) == ["a"]
    assert router.conversations == {}


def test_the_lru_forgets_the_least_recently_used_conversation() -> None:
    router = Router(settings(conversations=3), Clock())
    for n in range(3):
        router.choose("chat", f"c{n}", ["a", "b"])
    router.choose("chat", "c0", ["a", "b"])  # c0 used again: c1 is the oldest now
    router.choose("chat", "c3", ["a", "b"])
    assert [k for _, k in router.conversations] == ["c2", "c0", "c3"]
    assert sum(r.conversations for r in router.replicas.values()) == 3


def test_routes_drain_a_replica_and_move_its_conversations_once() -> None:
    router = Router(settings(), Clock())
    homes = {n: router.choose("chat", f"c{n}", ["a", "b"])[0] for n in range(4)}
    on_a = [n for n, h in homes.items() if h == "a"]
    assert router.apply_routes({"seq": 1, "draining": ["a"], "moves": {}}) == 1
    # Draining: no new conversation goes there; its own keep it until they move.
    assert router.choose("chat", "new", ["a", "b"]) == ["b"]
    assert router.choose("chat", f"c{on_a[0]}", ["a", "b"]) == ["a"]
    router.apply_routes({"seq": 2, "draining": ["a"], "moves": {"a": "b"}})
    assert {router.home("chat", f"c{n}") for n in range(4)} == {"b"}
    # A file applied once is not applied again: a conversation that starts on a since stays.
    router.apply_routes({"seq": 3, "draining": [], "moves": {}})
    router.started("x", "a", ("chat", "later"))
    router.apply_routes({"seq": 3, "draining": [], "moves": {"a": "b"}})
    assert router.home("chat", "later") == "a"


def test_the_routes_file_is_applied_and_answered(tmp_path: Path) -> None:
    routes = tmp_path / "routes.json"
    router = Router(settings(routes=str(routes)), Clock())
    router.choose("chat", "c", ["a", "b"])
    stop = threading.Event()
    watcher = threading.Thread(target=plugin.watch_routes, args=(router, routes, stop))
    watcher.start()
    try:
        routes.write_text(json.dumps({"seq": 7, "draining": ["b"], "moves": {"a": "b"}}))
        applied = tmp_path / plugin.ROUTES_APPLIED
        deadline = time.monotonic() + 10
        while not applied.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert json.loads(applied.read_text()) == {"seq": 7}
        assert router.home("chat", "c") == "b" and router.draining == {"b"}
    finally:
        stop.set()
        watcher.join()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "LLAMANIX_GATEWAY is not set"),
        ("{", "not JSON"),
        ('{"version": 2}', "not version 1"),
        (
            '{"version": 1, "interval": 0, "routes": null, "conversations": 1, '
            '"affinity": {}, "health": {}}',
            "interval",
        ),
        (
            '{"version": 1, "interval": 5, "routes": "relative", "conversations": 1, '
            '"affinity": {}, "health": {}}',
            "routes",
        ),
    ],
)
def test_settings_that_do_not_parse_stop_litellm(text: str | None, message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        Settings.parse(text)


def test_the_rendered_settings_parse(tmp_path: Path) -> None:
    from llamanix.config.model import load_config
    from llamanix.render import gateway

    cfg = load_config(Path(__file__).parent / "data/configs/fleet-gateway.toml")
    parsed = Settings.parse(gateway.plugin_settings_text(cfg))
    assert parsed.health == {
        "qwen-a": "http://box1.lan:8080/health",
        "qwen-b": "http://10.0.0.12:8080/health",
    }
    assert parsed.affinity == {"qwen3-8b": True} and parsed.interval_s == 5.0


def test_a_client_cannot_name_the_conversation_its_request_continues() -> None:
    """The filter alone says which conversation a request continues: a client's own metadata
    naming another conversation is dropped before the request is routed, so it moves nothing
    and fills no memory; a malformed one is not taken by the hooks either."""
    import asyncio

    router = Router(settings(), Clock())
    handler = plugin.Handler(router)
    victim = conversation_key([{"role": "user", "content": "the victim's start"}], {})
    assert victim is not None
    assert router.choose("chat", victim, ["a", "b"]) == ["a"]
    deployments = [{"model_info": {"id": "a"}}, {"model_info": {"id": "b"}}]
    forged = {"metadata": {plugin.CONVERSATION: ["chat", victim], "headers": {}}}
    asyncio.run(handler.async_filter_deployments("chat", deployments, [], forged))
    assert plugin.CONVERSATION not in forged["metadata"]
    # The request's own start names no conversation: nothing is remembered for it.
    call = {"litellm_call_id": "c1", "metadata": {**forged["metadata"], "model_info": {"id": "b"}}}
    handler.log_pre_api_call("chat", [], call)
    assert router.home("chat", victim) == "a"
    odd = {"litellm_call_id": "c2", "metadata": {plugin.CONVERSATION: ["chat", "x" * 10**6]}}
    assert plugin._call_of(odd)[2] is None
