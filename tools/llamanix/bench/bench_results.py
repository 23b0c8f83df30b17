"""What a benchmark is asked and what it produces: typed records, the one JSON writer
(``BenchResult.to_json``), the one reader (``load_result``) and the per-request CSV rows.

The file format only grows: results written before agent prompts lack the wall clock split and
the phases, and still load (those fields read back as None).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from llamanix.bench.prompts import read_user_json
from llamanix.core import json_codec
from llamanix.core.errors import Problem, UserError
from llamanix.core.json_codec import OMIT_NONE, JsonRecord, JsonShape
from llamanix.model.ceiling import Ceiling

DEFAULT_MAX_TOKENS = (100, 500, 1000, 2000)
DEFAULT_RUNS = 5
DEFAULT_WARMUP = 2
DEFAULT_SEED = 42
RESULT_FORMAT = "llamanix-bench/1"
# Agent prompts: a run that opens a new session (nothing cached) or reuses its prefix.
Phase = Literal["cold", "warm"]
PHASES: tuple[Phase, ...] = ("cold", "warm")


@dataclass(frozen=True)
class BenchSettings:
    url: str
    model: str | None = None
    max_tokens: tuple[int, ...] = DEFAULT_MAX_TOKENS
    runs: int = DEFAULT_RUNS
    warmup: int = DEFAULT_WARMUP
    concurrency: int = 1
    temperature: float = 0.0
    seed: int = DEFAULT_SEED
    ignore_eos: bool = True
    cache_prompt: bool = False
    label: str | None = None


@dataclass(frozen=True)
class RequestResult(JsonRecord):
    """One streamed completion, both the server's and the client's view of it."""

    wall_s: float
    ttft_s: float | None
    prompt_n: int | None
    cache_n: int | None
    predicted_n: int | None
    server_prefill_tok_s: float | None
    server_decode_tok_s: float | None
    server_prompt_ms: float | None
    server_predicted_ms: float | None
    client_prefill_tok_s: float | None
    client_decode_tok_s: float | None
    draft_n: int | None
    draft_n_accepted: int | None
    acceptance: float | None
    finish_reason: str | None
    chunks: int
    # The wall clock split (added with agent prompts; None in older results): prefill is the
    # time to the first streamed token, reasoning runs to the last thinking token, decode is
    # the rest, so the three add up to wall_s.
    prefill_s: float | None = None
    reasoning_s: float | None = None
    decode_s: float | None = None
    reasoning_n: int | None = None  # streamed chunks of reasoning_content or <think> text
    # What was generated (the answer's content; None in results written before it was kept):
    # two servers' runs of one prompt can then be compared for losslessness.
    text: str | None = None


@dataclass(frozen=True)
class RunResult(JsonRecord):
    prompt: str
    max_tokens: int
    run: int
    wall_s: float
    aggregate_decode_tok_s: float | None
    requests: tuple[RequestResult, ...]
    metrics_delta: Mapping[str, float] | None = None
    phase: Phase | None = None  # agent prompts: cold (new session) or warm (prefix cached)


@dataclass(frozen=True)
class Stats(JsonRecord):
    min: float
    median: float
    max: float
    stdev: float | None
    n: int

    @staticmethod
    def of(values: Sequence[float]) -> Stats | None:
        vals = [v for v in values if v is not None and math.isfinite(v)]
        if not vals:
            return None
        return Stats(
            min=min(vals),
            median=statistics.median(vals),
            max=max(vals),
            stdev=statistics.stdev(vals) if len(vals) > 1 else None,
            n=len(vals),
        )

    def overlaps(self, other: Stats) -> bool:
        return self.min <= other.max and other.min <= self.max


# Summary statistics by the name of the RequestResult field they summarise.
FieldStats = Mapping[str, Stats | None]


@dataclass(frozen=True)
class Summary(JsonRecord):
    prompt: str
    max_tokens: int
    stats: FieldStats
    aggregate_decode_tok_s: Stats | None
    ceiling_share: float | None = None
    # Agent prompts: the phase fields summarised for cold and warm requests apart.
    phases: Mapping[Phase, FieldStats] | None = None

    def median(self, name: str) -> float | None:
        st = self.stats.get(name)
        return st.median if st is not None else None


@dataclass(frozen=True)
class ServerProps(JsonRecord):
    """What llama-server's /props said about itself; a field it did not send stays None and is
    left out of the file."""

    build_info: str | None = field(default=None, metadata=OMIT_NONE)
    model_path: str | None = field(default=None, metadata=OMIT_NONE)
    model_alias: str | None = field(default=None, metadata=OMIT_NONE)
    total_slots: int | None = field(default=None, metadata=OMIT_NONE)
    model_ftype: str | None = field(default=None, metadata=OMIT_NONE)
    n_ctx: int | None = field(default=None, metadata=OMIT_NONE)


@dataclass(frozen=True)
class MachineInfo(JsonRecord):
    """The machine the client ran on (the server's is in its build_info and the results)."""

    hostname: str
    system: str
    machine: str
    processor: str | None
    cpus: int | None
    python: str


@dataclass(frozen=True)
class RecordedSettings(JsonRecord):
    """The settings a result was measured with (its prompts by name)."""

    prompts: tuple[str, ...]
    max_tokens: tuple[int, ...]
    runs: int
    warmup: int
    concurrency: int
    temperature: float
    seed: int
    ignore_eos: bool
    cache_prompt: bool

    @staticmethod
    def of(settings: BenchSettings, prompts: Sequence[str]) -> RecordedSettings:
        return RecordedSettings(
            prompts=tuple(prompts),
            max_tokens=settings.max_tokens,
            runs=settings.runs,
            warmup=settings.warmup,
            concurrency=settings.concurrency,
            temperature=settings.temperature,
            seed=settings.seed,
            ignore_eos=settings.ignore_eos,
            cache_prompt=settings.cache_prompt,
        )


@dataclass(frozen=True)
class BenchMeta(JsonRecord):
    """Where, when and how a result was measured."""

    url: str
    model: str | None
    server: ServerProps
    machine: MachineInfo
    date: str  # ISO 8601, UTC, to the second
    llamanix: str  # the version that measured
    metrics: bool  # /metrics answered, so every run has a metrics_delta
    settings: RecordedSettings
    # Behind a router, when the model was not loaded: seconds the first (one-token) request
    # took, load included. Kept apart from every TTFT, which the warm-up then leaves warm.
    cold_load_s: float | None = None


@dataclass(frozen=True)
class BenchResult(JsonRecord):
    """Everything one ``llamanix bench`` produced: what --json writes and compare reads. The
    file's keys are in field order, after ``format``."""

    label: str
    meta: BenchMeta
    ceiling: Ceiling | None
    summaries: tuple[Summary, ...]
    runs: tuple[RunResult, ...]

    json_shape: ClassVar[JsonShape] = JsonShape(constants={"format": RESULT_FORMAT})


def load_result(path: Path) -> BenchResult:
    """Read a file ``bench --json`` wrote."""
    source = str(path)
    fix = "give a file written by bench --json"
    data = read_user_json(source, "", fix, fix)
    if not isinstance(data, dict) or data.get("format") != RESULT_FORMAT:
        raise UserError(
            Problem(
                source,
                "format",
                f"not a {RESULT_FORMAT} result",
                "give a file written by llamanix bench --json",
            )
        )
    try:
        return json_codec.from_json(BenchResult, data, "")
    except ValueError as err:
        raise UserError(
            Problem(
                source,
                "summaries",
                f"malformed result ({err})",
                "give a file written by llamanix bench --json",
            )
        ) from None


def csv_rows(result: BenchResult) -> list[dict[str, str | int | float | None]]:
    """One row per request, for --csv."""
    rows: list[dict[str, str | int | float | None]] = []
    for run in result.runs:
        for i, q in enumerate(run.requests):
            rows.append(
                {
                    "label": result.label,
                    "prompt": run.prompt,
                    "max_tokens": run.max_tokens,
                    "run": run.run,
                    "request": i,
                    **asdict(q),
                }
            )
    return rows
