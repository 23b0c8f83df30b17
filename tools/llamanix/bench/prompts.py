"""Benchmark prompts: the built-in set, the real-text set (``realtext``), prompt files, and
agent-shaped prompts (``agent:N``).

A prompt is chat messages, optional tools and an optional fixed output length, as the user
wrote them; bench and lossless send them to llama-server unchanged (the messages and tools are
the OpenAI chat format, so they stay JSON objects here). A prompt may instead be raw ``text``,
sent to llama-server's own ``/completion`` endpoint as it is: a base model has no chat template,
and through the chat endpoint it would continue the fallback template's markers instead of the
text. A prompt may name its ``workload`` (``edit``, ``prose``...): speculation pays on some
workloads and costs on others, so results are also summarised per workload.

Agent-shaped prompts measure what dominates an agent's wall clock: a long shared prefix (system
prompt, tool definitions, history) that the server can reuse from its KV cache, and a last turn
that changes every request. Each request puts a session marker in front of the prefix (a new
marker makes the prefix unique, so nothing is cached) and a new last turn behind it.
"""

from __future__ import annotations

import json
import random
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

from llamanix.core import file_reader
from llamanix.core.errors import Problem, UserError
from llamanix.core.json_value import JsonObject

AGENT_MIN_TOKENS = 512  # the fixed part alone is about 420
AGENT_MAX_TOKENS = 1_000_000
# A prompts file or a bench result may hold long texts: a larger bound than a config's.
USER_JSON_LIMIT = 256 * 1024 * 1024


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt: chat messages, optional tools, optional fixed length."""

    name: str
    messages: tuple[JsonObject, ...]
    tools: tuple[JsonObject, ...] | None = None
    max_tokens: int | None = None  # fixed output length (the one-token probe); None: --max-tokens
    # `llamanix check lossless` exits 1 when two servers answer this prompt differently; bench
    # ignores it.
    must_match: bool = False
    # Agent-shaped: ``messages`` are the shared prefix; each request gets a session marker in
    # front and a new last turn behind (see agent_messages).
    agent: bool = False
    # Raw text for /completion (``messages`` is then empty), and the workload it belongs to.
    text: str | None = None
    workload: str | None = None

    @property
    def raw(self) -> bool:
        return self.text is not None

    def lengths(self, requested: Sequence[int]) -> list[int]:
        return [self.max_tokens] if self.max_tokens is not None else list(requested)


def _prompt_problem(source: str, where: str, message: str, fix: str) -> UserError:
    return UserError(Problem(source, where, message, fix))


def parse_prompts(data: Any, source: str) -> list[Prompt]:
    """Prompts from JSON: a list (or ``{"prompts": [...]}``) of
    ``{"name", "messages" | "prompt" | "text", "tools"?, "max_tokens"?, "must_match"?,
    "workload"?}``."""
    items = data.get("prompts") if isinstance(data, dict) else data
    if not isinstance(items, list) or not items:
        raise _prompt_problem(
            source,
            "prompts",
            "expected a non-empty list of prompts",
            'write [{"name": "x", "prompt": "..."}]',
        )
    out: list[Prompt] = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        out.append(_parse_prompt(i, item, source, seen))
    return out


def _parse_prompt(i: int, item: object, source: str, seen: set[str]) -> Prompt:
    """The ``i``-th prompt; its name joins ``seen`` (the names before it), which it must not
    be in."""
    where = f"prompts[{i}]"
    if not isinstance(item, dict):
        raise _prompt_problem(
            source, where, "must be an object", 'write {"name": ..., "prompt": ...}'
        )
    name = item.get("name")
    if not isinstance(name, str) or not name:
        raise _prompt_problem(
            source, f"{where}.name", "missing or not a string", "give every prompt a name"
        )
    if name in seen:
        raise _prompt_problem(
            source, f"{where}.name", f"duplicate name {name!r}", "names must be unique"
        )
    seen.add(name)
    workload = item.get("workload")
    if workload is not None and (not isinstance(workload, str) or not workload):
        raise _prompt_problem(
            source,
            f"{where}.workload",
            "must be a non-empty string",
            'write e.g. "workload": "edit"',
        )
    if "text" in item:
        return _text_prompt(item, name, workload, source, where)
    agent = item.get("agent", False)
    if isinstance(agent, int) and not isinstance(agent, bool):
        if not AGENT_MIN_TOKENS <= agent <= AGENT_MAX_TOKENS:
            raise _prompt_problem(
                source,
                f"{where}.agent",
                f"{agent} is not a prefix length in tokens",
                f"give {AGENT_MIN_TOKENS} to {AGENT_MAX_TOKENS}, or true with your messages",
            )
        return agent_prompt(agent, name)
    if not isinstance(agent, bool):
        raise _prompt_problem(
            source,
            f"{where}.agent",
            "must be true (messages are the shared prefix) or a prefix length in tokens",
            'write "agent": true or "agent": 8000',
        )
    return _chat_prompt(item, name, agent, workload, source, where)


def _chat_prompt(
    item: Mapping[str, object],
    name: str,
    agent: bool,
    workload: str | None,
    source: str,
    where: str,
) -> Prompt:
    """A prompt of chat messages (or a ``prompt`` string as one user message), with its tools."""
    messages = item.get("messages")
    if messages is None and isinstance(item.get("prompt"), str):
        messages = [{"role": "user", "content": item["prompt"]}]
    if (
        not isinstance(messages, list)
        or not messages
        or not all(isinstance(m, dict) and "role" in m for m in messages)
    ):
        raise _prompt_problem(
            source,
            f"{where}.messages",
            "needs 'prompt' (a string) or 'messages' (chat messages)",
            'write "prompt": "..." or "messages": [{"role": "user", ...}]',
        )
    tools = item.get("tools")
    if tools is not None and (
        not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)
    ):
        raise _prompt_problem(
            source,
            f"{where}.tools",
            "must be a list of tool objects",
            "use the OpenAI tools format",
        )
    return Prompt(
        name=name,
        messages=tuple(messages),
        tools=tuple(tools) if tools is not None else None,
        max_tokens=_max_tokens(item, source, where),
        must_match=_must_match(item, source, where),
        agent=agent,
        workload=workload,
    )


def _max_tokens(item: Mapping[str, object], source: str, where: str) -> int | None:
    max_tokens = item.get("max_tokens")
    if max_tokens is not None and (
        not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1
    ):
        raise _prompt_problem(
            source,
            f"{where}.max_tokens",
            "must be a positive integer",
            "remove it to use --max-tokens",
        )
    return max_tokens


def _must_match(item: Mapping[str, object], source: str, where: str) -> bool:
    must_match = item.get("must_match", False)
    if not isinstance(must_match, bool):
        raise _prompt_problem(
            source,
            f"{where}.must_match",
            f"must be true or false, not {must_match!r}",
            'write "must_match": true',
        )
    return must_match


def _text_prompt(
    item: Mapping[str, object], name: str, workload: str | None, source: str, where: str
) -> Prompt:
    """``{"name", "text", "workload"?, "max_tokens"?, "must_match"?}``: raw text."""
    text = item["text"]
    if not isinstance(text, str) or not text:
        raise _prompt_problem(
            source, f"{where}.text", "must be a non-empty string", 'write "text": "..."'
        )
    for chat_only in ("messages", "prompt", "tools", "agent"):
        if chat_only in item:
            raise _prompt_problem(
                source,
                f"{where}.{chat_only}",
                f"'{chat_only}' is for the chat endpoint, 'text' for /completion",
                f"give either 'text' or '{chat_only}', not both",
            )
    return Prompt(
        name=name,
        messages=(),
        max_tokens=_max_tokens(item, source, where),
        must_match=_must_match(item, source, where),
        text=text,
        workload=workload,
    )


# --- agent-shaped prompts --------------------------------------------------------------------

# Common short English words: about one token each in the llama, GPT-2 and Qwen vocabularies,
# so N words of filler come to roughly N tokens (the server's prompt_n is the exact count).
_FILLER_WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "for",
    "on",
    "with",
    "as",
    "by",
    "at",
    "from",
    "that",
    "this",
    "it",
    "be",
    "are",
    "was",
    "or",
    "an",
    "not",
    "but",
    "all",
    "can",
    "has",
    "have",
    "will",
    "one",
    "new",
    "file",
    "test",
    "code",
    "line",
    "read",
    "write",
    "call",
    "value",
    "list",
    "name",
    "type",
    "data",
    "run",
    "set",
    "get",
    "add",
    "make",
    "use",
    "error",
    "path",
    "user",
    "time",
    "model",
    "server",
    "config",
    "build",
    "check",
    "state",
    "return",
]
_AGENT_SYSTEM = (
    "You are a coding agent working in a software repository. Use the tools to read and "
    "change files and to run commands. Keep answers short and exact.\n\nTools:\n"
)
_AGENT_TOOLS = (
    ("read_file", "Read a file of the repository.", "path"),
    ("write_file", "Replace a file of the repository.", "path"),
    ("run_command", "Run a shell command in the repository and return its output.", "command"),
    ("search", "Search the repository for a regular expression.", "pattern"),
    ("list_dir", "List the files of a directory.", "path"),
)
_HISTORY_PAIRS = 4
_AGENT_FIXED_TOKENS = 420


def _filler(rng: random.Random, words: int) -> str:
    out: list[str] = []
    for i in range(words):
        out.append(rng.choice(_FILLER_WORDS))
        if i % 12 == 11:
            out.append(".\n" if i % 48 == 47 else ".")
    return " ".join(out).replace(" .", ".")


def agent_prompt(prefix_tokens: int, name: str | None = None) -> Prompt:
    """An agent-shaped prompt of about ``prefix_tokens`` shared tokens: a system prompt with
    tool definitions, then a history of tool calls and their output. Same N, same text."""
    rng = random.Random(f"llamanix-agent:{prefix_tokens}")
    tools = "".join(
        json.dumps(
            {
                "name": tool,
                "description": what,
                "parameters": {"type": "object", "properties": {arg: {"type": "string"}}},
            }
        )
        + "\n"
        for tool, what, arg in _AGENT_TOOLS
    )
    # Measured with the llama SentencePiece vocabulary: the fixed text (instructions, tool
    # definitions, chat template, history requests) comes to about 420 tokens and each filler
    # word to 1.1 (the full stops); other vocabularies land within a few percent.
    budget = max(int((prefix_tokens - _AGENT_FIXED_TOKENS) / 1.1), _HISTORY_PAIRS * 16)
    system_words = budget // 4
    # Each history pair: a user request (about 12 tokens with the template) and the output.
    output_words = (budget - system_words) // _HISTORY_PAIRS - 12
    messages: list[JsonObject] = [
        {"role": "system", "content": _AGENT_SYSTEM + tools + "\n" + _filler(rng, system_words)}
    ]
    for turn in range(_HISTORY_PAIRS):
        messages.append({"role": "user", "content": f"Read src/module_{turn}.py and check it."})
        messages.append({"role": "assistant", "content": _filler(rng, output_words)})
    return Prompt(
        name=name or f"agent-{prefix_tokens}",
        messages=tuple(messages),
        agent=True,
    )


# What a warm-up sends: never one of the measured prompts, since an n-gram drafter that keeps a
# pool across requests (upstream's ngram-mod) would then know the measured answer in advance.
WARMUP_TEXT = "Warm-up: the quick brown fox jumps over the lazy dog, and the dog sleeps on."


def warmup_prompt(like: Prompt) -> Prompt:
    """A warm-up request of the same kind as ``like`` (raw text or chat)."""
    if like.raw:
        return Prompt("warm-up", (), text=WARMUP_TEXT)
    return Prompt("warm-up", ({"role": "user", "content": WARMUP_TEXT},))


def new_session() -> str:
    """A marker no earlier request can have cached: random, not seeded, so that a second bench
    against the same server still starts cold."""
    return secrets.token_hex(8)


def agent_messages(prompt: Prompt, session: str, turn: int) -> list[JsonObject]:
    """The shared prefix behind a session marker, then a last turn that differs per request."""
    messages = [dict(m) for m in prompt.messages]
    marker = f"[session {session}]\n"
    first = messages[0]
    content = first.get("content")
    if first.get("role") == "system" and isinstance(content, str):
        first["content"] = marker + content
    else:
        messages.insert(0, {"role": "system", "content": marker.strip()})
    messages.append(
        {
            "role": "user",
            "content": f"Turn {turn}: run the tests again and say which of them fail and why.",
        }
    )
    return messages


def builtin_prompts() -> list[Prompt]:
    text = resources.files("llamanix").joinpath("data/prompts.json").read_text()
    return parse_prompts(json.loads(text), "llamanix/data/prompts.json")


def realtext_prompts() -> list[Prompt]:
    text = resources.files("llamanix").joinpath("data/real_text.json").read_text()
    return parse_prompts(json.loads(text), "llamanix/data/real_text.json")


def _named_set(spec: str, prompts: list[Prompt]) -> list[Prompt]:
    """``SET`` or ``SET:WORD[,WORD]``, each word a prompt's name or a workload of the set."""
    set_name, _, rest = spec.partition(":")
    if not rest:
        return prompts
    wanted = [w for w in rest.split(",") if w]
    workloads = list(dict.fromkeys(p.workload for p in prompts if p.workload))
    names = [p.name for p in prompts]
    unknown = [w for w in wanted if w not in names and w not in workloads]
    if unknown or not wanted:
        raise UserError(
            Problem(
                "--prompts",
                set_name,
                f"unknown {set_name} prompt(s) or workload(s) {unknown}",
                f"choose from {', '.join([*workloads, *names])}",
            )
        )
    return [p for p in prompts if p.name in wanted or p.workload in wanted]


def names_a_file(spec: str) -> bool:
    """Whether ``load_prompts`` reads ``spec`` as a JSON file (not a named set)."""
    named = spec in ("builtin", "realtext") or spec.startswith(("agent:", "builtin:", "realtext:"))
    return not named


def load_prompts(spec: str) -> list[Prompt]:
    """``builtin``, ``builtin:NAME[,NAME]``, ``realtext``, ``realtext:WORKLOAD|NAME[,...]``,
    ``agent:N`` or a JSON file."""
    if spec.startswith("agent:"):
        text = spec.split(":", 1)[1]
        n = int(text) if text.isdigit() else 0
        if not AGENT_MIN_TOKENS <= n <= AGENT_MAX_TOKENS:
            raise UserError(
                Problem(
                    "--prompts",
                    spec,
                    f"{text!r} is not a shared-prefix length in tokens",
                    f"write agent:N with N from {AGENT_MIN_TOKENS} to {AGENT_MAX_TOKENS}, "
                    "e.g. agent:8000",
                )
            )
        return [agent_prompt(n)]
    if spec == "builtin" or spec.startswith("builtin:"):
        return _named_set(spec, builtin_prompts())
    if spec == "realtext" or spec.startswith("realtext:"):
        return _named_set(spec, realtext_prompts())
    data = read_user_json(
        spec, "--prompts", "give a JSON prompts file or 'builtin'", "fix the JSON syntax"
    )
    return parse_prompts(data, spec)


def read_user_json(source: str, field: str, missing_fix: str, syntax_fix: str) -> Any:
    """A user-named JSON file, or one UserError line naming it as the user wrote it."""
    shown = file_reader.shown_path(source)
    text = file_reader.text_if_present(
        Path(source), limit=USER_JSON_LIMIT, source=shown, field=field
    )
    if text is None:
        raise UserError(Problem(shown, field, "no such file", missing_fix))
    try:
        return file_reader.parse_json(text, shown, field)
    except file_reader.FileRefused as err:
        raise UserError(replace(err.problems[0], fix=syntax_fix)) from None
