"""llama-bench, llama.cpp's own benchmark, as a reference for ``llamanix bench``.

It times the model alone, without a server, HTTP or sampling: ``pp N`` is the prefill of N
prompt tokens in one batch, ``tg N`` the decoding of N tokens, after ``d`` tokens already in
the context when ``--depth`` is given (the server decodes after the prompt, so that is the fair
comparison). ``-o json`` prints one object per test.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from llamanix.core.errors import ExternalCommandError
from llamanix.external.process import run_captured

TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class LlamaBenchTest:
    """One test of a llama-bench run: ``pp`` (n_gen 0) or ``tg`` (n_prompt 0)."""

    n_prompt: int
    n_gen: int
    n_depth: int
    avg_tok_s: float
    stddev_tok_s: float
    samples_tok_s: tuple[float, ...]

    @property
    def kind(self) -> str:
        return "pp" if self.n_gen == 0 else "tg"


def llama_bench_argv(
    binary: Path,
    model: Path,
    *,
    threads: int,
    prompt_tokens: int,
    gen_tokens: int,
    depth: int = 0,
    repetitions: int = 5,
) -> list[str]:
    return [
        str(binary), "-m", str(model), "-t", str(threads), "-p", str(prompt_tokens),
        "-n", str(gen_tokens), "-d", str(depth), "-r", str(repetitions), "-o", "json",
    ]  # fmt: skip


def parse_llama_bench(text: str) -> list[LlamaBenchTest]:
    """The tests of ``-o json`` output; ValueError when it is not that."""
    data = json.loads(text)
    if not isinstance(data, list):
        raise ValueError("llama-bench -o json printed no list")
    tests = []
    for item in data:
        samples = item.get("samples_ts") or []
        tests.append(
            LlamaBenchTest(
                n_prompt=int(item["n_prompt"]),
                n_gen=int(item["n_gen"]),
                n_depth=int(item.get("n_depth") or 0),
                avg_tok_s=float(item["avg_ts"]),
                stddev_tok_s=float(item["stddev_ts"]),
                samples_tok_s=tuple(float(v) for v in samples),
            )
        )
    return tests


def run_llama_bench(argv: Sequence[str]) -> list[LlamaBenchTest]:
    done = run_captured(argv, timeout_s=TIMEOUT_S)
    if done.returncode != 0:
        tail = " ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        raise ExternalCommandError(f"llama-bench exited {done.returncode}: {tail}")
    try:
        return parse_llama_bench(done.stdout)
    except (ValueError, KeyError, TypeError) as err:
        raise ExternalCommandError(f"llama-bench: unreadable JSON output ({err})") from None
