"""What a switch costs the next turn of a long conversation: time to first token of a
follow-up, unswitched, after a cold switch and after a warm one. Prints figures; asserts
nothing.

Run where the switch is run (``python -m llamanix.testbed.warm_ttft``), against a server of
the real model (Gemma 3 270M) with ``warm_switch = true``, one slot and ``--swa-full``, reached
at ``--url`` (the server itself, or a gateway in front of it): the conversation is a prompt of
about 4k tokens of real text and a first answer; the follow-up is that conversation and one
more question. Each round, in turn:

- unswitched: the follow-up, with the conversation cached in the slot as a client leaves it;
- warm: ``llamanix switch`` of a change that leaves the cache's shape alone (an environment
  variable), then the follow-up: the switch saved the slot and restored it into the new server;
- cold: the same switch with ``--warm-limit 0`` (no slot saved, the very same server
  otherwise), then the follow-up, which processes the whole conversation again.

Before each arm the slot is put back to the conversation (the first turn asked again: its
prefix is cached, so this costs one answer). The figures: per arm, the median TTFT with its
95% bootstrap interval, its ratio to unswitched (interval of the ratio of medians), how long
the switch command took, and the lossless check: the follow-up's continuation (temperature 0,
``--tokens`` tokens) after a warm switch against the unswitched one, and after a cold one.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx

from llamanix.bench.interval import median_interval, ratio_interval
from llamanix.bench.prompts import load_prompts
from llamanix.core.api_key import read_api_key
from llamanix.external.process import run_captured

QUESTION = "\n\nQuestion: in one sentence, what was the first text above about?\nAnswer:"
TARGET_TOKENS = 4000


@dataclass
class Arm:
    name: str
    ttft_s: list[float] = field(default_factory=list)
    switch_s: list[float] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def conversation(url: str, headers: dict[str, str], model: str | None) -> str:
    """About TARGET_TOKENS tokens of the real-text prompts, joined (the server's tokenizer
    counts them where it can; else four characters a token)."""
    texts = [p.text for p in load_prompts("realtext") if p.text]
    out = ""
    for text in texts * 8:
        out = f"{out}\n\n{text}" if out else text
        if _tokens(url, headers, out, model) >= TARGET_TOKENS:
            break
    return out


def _tokens(url: str, headers: dict[str, str], text: str, model: str | None) -> int:
    try:
        resp = httpx.post(f"{url}/tokenize", json={"content": text}, headers=headers, timeout=60)
        if resp.status_code == 200:
            return len(resp.json()["tokens"])
    except (httpx.HTTPError, ValueError, KeyError):
        pass
    return len(text) // 4


def stream(
    url: str, headers: dict[str, str], model: str | None, prompt: str, tokens: int
) -> tuple[float, str]:
    """One streamed /v1/completions at temperature 0: its time to the first token, and the
    whole text."""
    body: dict[str, object] = {
        "prompt": prompt,
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
    }
    if model:
        body["model"] = model
    started = time.monotonic()
    first: float | None = None
    text = ""
    with httpx.stream(
        "POST", f"{url}/v1/completions", json=body, headers=headers, timeout=1800
    ) as resp:
        if resp.status_code != 200:
            raise SystemExit(f"warm_ttft: HTTP {resp.status_code}: {resp.read()[:300]!r}")
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[len("data: ") :])
            choices = data.get("choices") or []
            piece = choices[0].get("text", "") if choices else ""
            if piece and first is None:
                first = time.monotonic() - started
            text += piece
    return (first if first is not None else time.monotonic() - started), text


def switch(command: Sequence[str], instance: str, round_: int, cold: bool) -> tuple[float, str]:
    """Run the switch: an environment variable of the instance changes (nothing else); the
    seconds it took, and what it said of the caches."""
    value = f'"{round_}{"c" if cold else "w"}"'
    argv = [*command, "--json", "--set", f"instances.{instance}.environment.LLAMANIX_ROUND={value}"]
    if cold:
        argv += ["--warm-limit", "0"]
    started = time.monotonic()
    done = run_captured(argv, timeout_s=1800)
    took = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"warm_ttft: the switch failed ({done.returncode}): {done.stderr[-2000:]}")
    try:
        rows = json.loads(done.stdout)
        warm = next(r["warm"][instance] for r in rows if instance in r.get("warm", {}))
    except (ValueError, StopIteration, KeyError, TypeError):
        # A fleet switch's --json has no warm record (the host keeps it in its generation):
        # what the host's switch printed about the caches says the same.
        said_lines = [
            line.split(f"{instance}: ", 1)[1]
            for line in done.stderr.splitlines()
            if f" {instance}: warm: " in line or f" {instance}: cold: " in line
        ]
        return took, "; ".join(said_lines) or f"no warm record: {done.stderr[-1500:]}"
    if warm.get("cold"):
        return took, f"cold: {warm['cold']}"
    said = [
        f"slot {s['slot']} {s['outcome']} ({s.get('restored') or s['tokens']} tokens)"
        + (f": {s['why']}" if s.get("why") else "")
        for s in warm.get("slots", [])
    ]
    return took, "; ".join(said) or "no slot held a cache"


def _figure(samples: list[float]) -> str:
    if len(samples) < 3:
        return ", ".join(f"{v:.2f}" for v in samples) + " s"
    low, mid, high = median_interval(samples)
    return f"{mid:.2f} s [{low:.2f}, {high:.2f}]"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="The server (or gateway) base URL.")
    parser.add_argument("--model", help="The model name to ask for (a gateway needs one).")
    parser.add_argument("--key-file", type=Path, help="A file holding the bearer key.")
    parser.add_argument("--instance", default="chat")
    parser.add_argument(
        "--switch", required=True, help="The switch command, as a JSON list (argv)."
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--label", default="", help="Where this runs, for the figures.")
    opts = parser.parse_args(argv)
    command = json.loads(opts.switch)
    headers = {}
    key = read_api_key(opts.key_file) if opts.key_file else None
    if key:
        headers["Authorization"] = f"Bearer {key}"
    url = opts.url.rstrip("/")

    prompt = conversation(url, headers, opts.model)
    _, answer = stream(url, headers, opts.model, prompt, opts.tokens)
    follow_up = prompt + answer + QUESTION
    size = _tokens(url, headers, follow_up, opts.model)
    print(
        f"{opts.label or 'warm_ttft'}: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, "
        f"{platform.node()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; "
        f"follow-up of {size} tokens, {opts.rounds} rounds",
        flush=True,
    )
    arms = {name: Arm(name) for name in ("unswitched", "warm", "cold")}
    for round_ in range(1, opts.rounds + 1):
        for arm in arms.values():
            stream(url, headers, opts.model, prompt, opts.tokens)  # the slot: the conversation
            if arm.name != "unswitched":
                took, said = switch(command, opts.instance, round_, arm.name == "cold")
                arm.switch_s.append(took)
                arm.notes.append(said)
            ttft, text = stream(url, headers, opts.model, follow_up, opts.tokens)
            arm.ttft_s.append(ttft)
            arm.texts.append(text)
            print(
                f"  round {round_} {arm.name:10s} TTFT {ttft:7.2f} s"
                + (f"  switch {arm.switch_s[-1]:5.1f} s  {arm.notes[-1]}" if arm.notes else ""),
                flush=True,
            )
    base = arms["unswitched"]
    print(f"{'arm':10s}  {'TTFT median [95%]':26s}  {'x unswitched [95%]':22s}  switch  lossless")
    for arm in arms.values():
        ratio = ""
        if arm is not base and len(arm.ttft_s) >= 3:
            r = ratio_interval(base.ttft_s, arm.ttft_s)
            ratio = f"{r.ratio:.2f}x [{r.low:.2f}, {r.high:.2f}]"
        same = sum(a == b for a, b in zip(arm.texts, base.texts, strict=True))
        switch_s = f"{sorted(arm.switch_s)[len(arm.switch_s) // 2]:5.1f} s" if arm.switch_s else ""
        lossless = "" if arm is base else f"{same}/{len(arm.texts)} identical"
        print(f"{arm.name:10s}  {_figure(arm.ttft_s):26s}  {ratio:22s}  {switch_s:6s}  {lossless}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
