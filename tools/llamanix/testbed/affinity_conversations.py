"""Conversations through the gateway, turn by turn, and what each turn cost: time to first
token and the tokens its replica had to prefill. Prints figures; asserts nothing
(scripts/gateway-affinity-bench runs it on the fleet bed and makes docs/gateway.md's table).

Run on the machine the clients are on (``python -m llamanix.testbed.affinity_conversations``):
``--conversations`` clients at once, each a conversation of ``--turns`` turns that starts with
about 1,800 tokens of the real-text set and adds about 330 a turn (a question of real text and
a 32-token answer), so the last turns carry over 4k tokens. Each turn streams its answer: its
time to first token is the time to the first streamed text; its prefill is ``usage``'s prompt
tokens less the ones the server took from its cache (``prompt_tokens_details.cached_tokens``,
which llama-server reports and LiteLLM passes on). With ``--switch``, the command runs once
every conversation has had half its turns, while they go on (a rolling switch half-way).
``--direct URL,URL``: each conversation talks to one of the servers itself, always the same (one
server slot per conversation: the baseline affinity is measured against).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from llamanix.bench.prompts import load_prompts
from llamanix.external.process import run_captured

FIRST_CHARS = 7200  # about 1,800 tokens of English text
TURN_CHARS = 1200  # about 300
ANSWER_TOKENS = 32


@dataclass
class Turn:
    conv: int
    turn: int
    ok: bool
    ttft_s: float = 0.0
    total_s: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    during_switch: bool = False
    why: str = ""

    @property
    def prefill(self) -> int:
        return self.prompt_tokens - self.cached_tokens


def texts(run: str, conversations: int, turns: int) -> list[list[str]]:
    """Each conversation's first message and questions: real text, a different passage each
    (``run`` in front, so no run reuses another's cache)."""
    pool = "\n\n".join(p.text for p in load_prompts("realtext") if isinstance(p.text, str))
    pool = pool * (1 + (conversations * (FIRST_CHARS + turns * TURN_CHARS)) // len(pool))
    out = []
    at = 0
    for n in range(conversations):
        first = f"Run {run}, conversation {n}.\n\n" + pool[at : at + FIRST_CHARS]
        at += FIRST_CHARS
        questions = []
        for _ in range(turns - 1):
            questions.append(pool[at : at + TURN_CHARS] + "\n\nWhat does this add?")
            at += TURN_CHARS
        out.append([first, *questions])
    return out


def ask(
    client: httpx.Client, url: str, model: str, messages: list[dict[str, str]]
) -> tuple[float, str, dict[str, object]]:
    """Stream one answer: (seconds to the first text, the text, usage)."""
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": ANSWER_TOKENS,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    began = time.monotonic()
    first: float | None = None
    text, usage = "", {}
    with client.stream("POST", f"{url}/v1/chat/completions", json=body) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"HTTP {resp.status_code}: {resp.read()[:200]!r}")
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if isinstance(chunk.get("usage"), dict):
                usage = chunk["usage"]
            for choice in chunk.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    if first is None:
                        first = time.monotonic() - began
                    text += piece
    return (first if first is not None else time.monotonic() - began), text, usage


@dataclass
class _Conversations:
    """What the conversations share: where each goes, with which headers and model, what each
    says, the barrier half-way (``turns // 2``), whether the switch runs now, and the turns
    answered so far (under ``lock``)."""

    urls: list[str]
    headers: dict[str, str]
    model: str
    plan: list[list[str]]
    turns: int
    half: threading.Barrier
    switching: threading.Event
    results: list[Turn] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def converse(run: _Conversations, n: int) -> None:
    """Conversation ``n``, turn by turn, each turn's figures in ``run.results``; waits at the
    barrier half-way."""
    url = run.urls[n % len(run.urls)]
    messages: list[dict[str, str]] = []
    # A new connection each turn: a server closes an idle kept-alive one after a few
    # seconds, and a request sent on it then fails ("disconnected without a response").
    with httpx.Client(timeout=900, headers={**run.headers, "Connection": "close"}) as client:
        for turn, content in enumerate(run.plan[n]):
            if turn == run.turns // 2:
                run.half.wait()
            messages.append({"role": "user", "content": content})
            during = run.switching.is_set()
            began = time.monotonic()
            try:
                ttft, answer, usage = ask(client, url, run.model, messages)
            except (httpx.HTTPError, RuntimeError, ValueError) as err:
                with run.lock:
                    run.results.append(Turn(n, turn, False, during_switch=during, why=str(err)))
                messages.append({"role": "assistant", "content": ""})
                continue
            details = usage.get("prompt_tokens_details")
            cached = details.get("cached_tokens") if isinstance(details, dict) else None
            prompt = usage.get("prompt_tokens")
            with run.lock:
                run.results.append(
                    Turn(
                        n,
                        turn,
                        True,
                        ttft,
                        time.monotonic() - began,
                        prompt if isinstance(prompt, int) else 0,
                        cached if isinstance(cached, int) else 0,
                        during,
                    )
                )
            messages.append({"role": "assistant", "content": answer})


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="The gateway.")
    parser.add_argument("--direct", help="URL,URL: each conversation to one server itself.")
    parser.add_argument("--key-file", type=Path)
    parser.add_argument("--model", default="chat")
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--switch", help="A command (JSON argv) to run half-way.")
    parser.add_argument("--label", default="run")
    parser.add_argument("--out", type=Path, required=True)
    return parser.parse_args()


def main() -> None:
    opts = _args()
    headers = {}
    if opts.key_file is not None:
        headers["Authorization"] = f"Bearer {opts.key_file.read_text().strip()}"
    run = _Conversations(
        urls=opts.direct.split(",") if opts.direct else [opts.url],
        headers=headers,
        model=opts.model,
        plan=texts(opts.label, opts.conversations, opts.turns),
        turns=opts.turns,
        half=threading.Barrier(opts.conversations + 1),
        switching=threading.Event(),
    )
    results = run.results
    threads = [threading.Thread(target=converse, args=(run, n)) for n in range(opts.conversations)]
    for t in threads:
        t.start()
    switch: dict[str, object] = {}
    run.half.wait()
    if opts.switch:
        run.switching.set()
        began = time.monotonic()
        done = run_captured(json.loads(opts.switch))
        run.switching.clear()
        switch = {
            "seconds": round(time.monotonic() - began, 1),
            "exit": done.returncode,
            "stderr": done.stderr[-6000:],
            "rows": done.stdout[-20000:],
        }
    for t in threads:
        t.join()
    out = {"label": opts.label, "turns": [asdict(r) for r in results], "switch": switch}
    opts.out.write_text(json.dumps(out, indent=1))
    ok = [r for r in results if r.ok]
    print(
        f"{opts.label}: {len(ok)} of {len(results)} turns answered, prefill "
        f"{sum(r.prefill for r in ok)} tokens",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
