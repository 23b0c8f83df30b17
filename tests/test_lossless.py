"""llamanix lossless: two real llama-servers (synthetic models, CPU) compared at temperature 0.

End to end: the target with itself as its draft against the target alone answers identically
while really drafting; the target against another model differs, with an edit distance; exit 1
only for a differing prompt marked must_match; a terminal gets a progress bar. The synthetic
models write noise and never call a tool (and this llama-server refuses the tool-call grammar
for their vocabulary), so the structural tool-call comparison is tested as the pure function it
is, on calls given here; end to end, the tool-call prompt is compared as text.
"""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from cli_run import invoke, server_argv
from click.testing import Result

from llamanix.bench.prompts import parse_prompts
from llamanix.core.errors import UserError
from llamanix.diagnose.lossless import ToolCall, compare_tool_calls, first_difference, json_shape
from llamanix.server.server_process import LlamaServer, free_port

if TYPE_CHECKING:
    from conftest import SynthModels

ROOT = Path(__file__).resolve().parent.parent


lossless = partial(invoke, "check", "lossless")


def call(name: str, arguments: Any) -> ToolCall:
    return ToolCall(name, arguments if isinstance(arguments, str) else json.dumps(arguments))


# --- the structural comparison of tool calls -------------------------------------------------


def test_same_calls_other_values_match() -> None:
    a = [call("get_weather", {"city": "Paris", "unit": "celsius", "days": 3})]
    b = [call("get_weather", {"unit": "fahrenheit", "days": 7.5, "city": "Lyon"})]
    result = compare_tool_calls(a, b)
    assert result.match and result.reason is None


def test_nested_lists_match_by_element_shape_not_length() -> None:
    a = [call("edit", {"files": ["a.py", "b.py"], "opts": {"dry": True, "n": None}})]
    b = [call("edit", {"files": ["c.py"], "opts": {"dry": False, "n": None}})]
    assert compare_tool_calls(a, b).match
    assert json_shape({"files": ["x", 1, "y"]}) == {"files": ["number", "string"]}


@pytest.mark.parametrize(
    ("a", "b", "reason"),
    [
        (
            [call("get_weather", {"city": "Paris"})],
            [call("get_time", {"city": "Paris"})],
            "call 1: function get_weather vs get_time",
        ),
        (
            [call("get_weather", {"city": "Paris"})],
            [call("get_weather", {"city": "Paris", "unit": "celsius"})],
            "call 1 get_weather: argument keys ['city'] vs ['city', 'unit']",
        ),
        (
            [call("get_weather", {"city": "Paris", "days": 3})],
            [call("get_weather", {"city": "Paris", "days": "3"})],
            "call 1 get_weather: arguments.days: number vs string",
        ),
        (
            [call("edit", {"opts": {"dry": True}})],
            [call("edit", {"opts": {"dry": [True]}})],
            "call 1 edit: arguments.opts.dry: boolean vs list of boolean",
        ),
        (
            [call("a", {}), call("b", {})],
            [call("a", {})],
            "2 call(s) vs 1",
        ),
        (
            [call("a", {"x": 1})],
            [call("a", '{"x": 1')],
            "call 1 a: arguments are JSON vs not JSON",
        ),
    ],
)
def test_structural_differences_are_named(
    a: list[ToolCall], b: list[ToolCall], reason: str
) -> None:
    result = compare_tool_calls(a, b)
    assert not result.match
    assert result.reason == reason


def test_first_difference() -> None:
    assert first_difference("abc", "abc") is None
    assert first_difference("abcd", "abXd") == 2
    assert first_difference("abc", "abcdef") == 3


# --- prompts files and bad input ------------------------------------------------------------


def test_must_match_in_prompts_file() -> None:
    marked, plain = parse_prompts(
        [{"name": "a", "prompt": "x", "must_match": True}, {"name": "b", "prompt": "y"}], "f.json"
    )
    assert marked.must_match and not plain.must_match
    with pytest.raises(UserError) as err:
        parse_prompts([{"name": "a", "prompt": "x", "must_match": "yes"}], "f.json")
    assert str(err.value).startswith("f.json: prompts[0].must_match: must be true or false")


def one_line_exit_2(result: Result, out: Path) -> str:
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not out.exists()
    return result.stderr.strip()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["not-a-url", "http://127.0.0.1:1"], "URL_A: 'not-a-url' is not an http(s) URL"),
        (["http://127.0.0.1:1", "ftp://x"], "URL_B: 'ftp://x' is not an http(s) URL"),
        (["http://127.0.0.1:1", "http://127.0.0.1:1", "--runs", "0"], "--runs: must be at least"),
        (
            ["http://127.0.0.1:1", "http://127.0.0.1:1", "--max-tokens", "0"],
            "--max-tokens: must be at least",
        ),
        (
            ["http://127.0.0.1:1", "http://127.0.0.1:1", "--prompts", "builtin:nonesuch"],
            "unknown builtin prompt",
        ),
        (
            ["http://127.0.0.1:1", "http://127.0.0.1:1", "--prompts", "/nonexistent/p.json"],
            "/nonexistent/p.json: --prompts: no such file",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2(args: list[str], expected: str, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    assert expected in one_line_exit_2(lossless(*args, "-o", str(out)), out)


def test_bad_prompts_file_names_file_field_and_fix(tmp_path: Path) -> None:
    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps([{"name": "x", "prompt": "hi", "must_match": 1}]))
    out = tmp_path / "r.json"
    line = one_line_exit_2(
        lossless(
            "http://127.0.0.1:1", "http://127.0.0.1:1", "--prompts", str(prompts), "-o", str(out)
        ),
        out,
    )
    assert line == (
        f'{prompts}: prompts[0].must_match: must be true or false, not 1 (write "must_match": true)'
    )


# --- against real servers ---------------------------------------------------------------------


def serve(binary: Path, log: Path, model: str, *extra: str) -> LlamaServer:
    # One thread, one slot: the machine is small and one request runs at a time anyway.
    argv = server_argv(binary, model, *extra, ctx=4096, parallel=1, threads=1)
    return LlamaServer(argv, log).start()


@pytest.fixture(scope="module")
def servers(
    llama_server_bin: Path, synth_models: SynthModels, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, LlamaServer]]:
    logs = tmp_path_factory.mktemp("lossless-servers")
    started: dict[str, LlamaServer] = {}
    target = str(synth_models.target)
    try:
        started["base"] = serve(llama_server_bin, logs / "base.log", target)
        started["self-draft"] = serve(
            llama_server_bin,
            logs / "self-draft.log",
            target,
            "--spec-type",
            "draft-simple",
            "--spec-draft-model",
            target,
        )
        started["other"] = serve(
            llama_server_bin, logs / "other.log", str(synth_models.unrelated_draft)
        )
        yield started
    finally:
        for server in started.values():
            server.stop()


PROMPTS = [
    {"name": "prose", "prompt": "Write a short story about a lighthouse.", "must_match": True},
    {"name": "free", "prompt": "Say anything."},
    {
        "name": "tool",
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "parameters": {
                        "type": "object",
                        "properties": {"city": {"type": "string"}},
                        "required": ["city"],
                    },
                },
            }
        ],
    },
]


@pytest.fixture
def prompts_file(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.json"
    path.write_text(json.dumps({"prompts": PROMPTS}))
    return path


@pytest.mark.server
def test_self_draft_is_identical_to_baseline(
    servers: dict[str, LlamaServer], prompts_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "r.json"
    result = lossless(
        servers["base"].url,
        servers["self-draft"].url,
        "--prompts",
        str(prompts_file),
        "--runs",
        "2",
        "--max-tokens",
        "160",
        "--json",
        "-o",
        str(out),
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert json.loads(out.read_text()) == data
    assert data["format"] == "llamanix-lossless/1" and data["failed"] == []
    by_name = {w["name"]: w for w in data["workloads"]}
    assert list(by_name) == ["prose", "free", "tool"]
    assert by_name["prose"]["must_match"] and not by_name["free"]["must_match"]
    for w in data["workloads"]:
        assert w["identical"] and w["identical_runs"] == w["runs_n"] == 2
        assert w["edit_distance"] == {"median": 0, "max": 0}
        assert w["first_difference"] is None
        assert w["stable"] == {"a": True, "b": True}
        # Really speculating: B drafted, A did not.
        assert w["draft_n"]["a"] is None and w["draft_n"]["b"] > 0
        for run in w["runs"]:
            assert run["a"]["text"] == run["b"]["text"] and len(run["a"]["text"]) > 100
            assert run["a"]["predicted_n"] == run["b"]["predicted_n"] > 100
    # The noise-writing model calls no tool, so there is no structure to compare.
    assert by_name["tool"]["tool_calls"] is None


@pytest.mark.server
def test_other_model_differs_and_fails_only_must_match(
    servers: dict[str, LlamaServer], prompts_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "r.json"
    args = [servers["base"].url, servers["other"].url, "--prompts", str(prompts_file)]
    result = lossless(*args, "--runs", "2", "--max-tokens", "64", "-o", str(out))
    assert result.exit_code == 1, result.output
    assert "must match but differ: prose" in result.stdout
    data = json.loads(out.read_text())
    assert data["failed"] == ["prose"]
    for w in data["workloads"]:
        assert not w["identical"] and w["identical_runs"] == 0
        run = w["runs"][0]
        assert w["edit_distance"]["max"] > 0
        assert run["edit_distance"] > 0 and run["a"]["text"] != run["b"]["text"]
        assert run["first_difference"] == first_difference(run["a"]["text"], run["b"]["text"])
        assert w["stable"] == {"a": True, "b": True}
    # --strict: every prompt must match.
    strict = lossless(*args, "--runs", "1", "--max-tokens", "16", "--strict", "--json")
    assert strict.exit_code == 1
    assert json.loads(strict.stdout)["failed"] == ["prose", "free", "tool"]


@pytest.mark.server
def test_unreachable_server_is_named(servers: dict[str, LlamaServer], tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    dead = f"http://127.0.0.1:{free_port()}"
    line = one_line_exit_2(lossless(servers["base"].url, dead, "-o", str(out)), out)
    assert line.startswith(f"{dead}: URL_B: cannot connect")
    line = one_line_exit_2(lossless(dead, servers["base"].url, "-o", str(out)), out)
    assert line.startswith(f"{dead}: URL_A: cannot connect")


@pytest.mark.server
def test_terminal_gets_a_progress_bar(servers: dict[str, LlamaServer]) -> None:
    """Run in a pseudo-terminal: the (transient) bar names each prompt, server and run."""
    leader, follower = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tools"), "COLUMNS": "160", "TERM": "xterm"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "llamanix", "check", "lossless", servers["base"].url,
         servers["self-draft"].url, "--prompts", "builtin:fibonacci", "--runs", "2",
         "--max-tokens", "32"],
        stdin=follower, stdout=follower, stderr=follower, env=env, close_fds=True,
    )  # fmt: skip
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the terminal closes when the command exits
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert proc.wait(timeout=120) == 0
    screen = b"".join(chunks).decode(errors="replace")
    assert "fibonacci B 2/2" in screen or "fibonacci A 2/2" in screen, screen
    assert "yes (2/2)" in screen


@pytest.mark.server
def test_prompt_the_server_refuses_is_one_line(
    servers: dict[str, LlamaServer], tmp_path: Path
) -> None:
    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps([{"name": "bad", "messages": [{"role": "user"}]}]))
    out = tmp_path / "r.json"
    url = servers["base"].url
    line = one_line_exit_2(
        lossless(url, url, "--prompts", str(prompts), "--runs", "1", "-o", str(out)), out
    )
    assert line.startswith(f"{url}: --prompts: HTTP 400: ")
