"""What a benchmark is asked and what it produces: typed records, the one JSON writer
(``BenchResult.to_json``), the one reader (``load_result``) and the per-request CSV rows.

The file format only grows: results written before agent prompts lack the wall clock split and
the phases, and still load (those fields read back as None).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from llamanix.core.errors import Problem, UserError
from llamanix.core.json_fields import JsonFields
from llamanix.measure.ceiling import Ceiling
from llamanix.measure.prompts import read_user_json

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
class RequestResult:
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

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(value: object, where: str) -> RequestResult:
        data = JsonFields.of(value, where)
        return RequestResult(
            wall_s=data.number("wall_s"),
            ttft_s=data.opt_number("ttft_s"),
            prompt_n=data.opt_integer("prompt_n"),
            cache_n=data.opt_integer("cache_n"),
            predicted_n=data.opt_integer("predicted_n"),
            server_prefill_tok_s=data.opt_number("server_prefill_tok_s"),
            server_decode_tok_s=data.opt_number("server_decode_tok_s"),
            server_prompt_ms=data.opt_number("server_prompt_ms"),
            server_predicted_ms=data.opt_number("server_predicted_ms"),
            client_prefill_tok_s=data.opt_number("client_prefill_tok_s"),
            client_decode_tok_s=data.opt_number("client_decode_tok_s"),
            draft_n=data.opt_integer("draft_n"),
            draft_n_accepted=data.opt_integer("draft_n_accepted"),
            acceptance=data.opt_number("acceptance"),
            finish_reason=data.opt_string("finish_reason"),
            chunks=data.integer("chunks"),
            prefill_s=data.opt_number("prefill_s"),
            reasoning_s=data.opt_number("reasoning_s"),
            decode_s=data.opt_number("decode_s"),
            reasoning_n=data.opt_integer("reasoning_n"),
            text=data.opt_string("text"),
        )


def _phase(value: str | None, where: str) -> Phase | None:
    for phase in PHASES:
        if value == phase:
            return phase
    if value is None:
        return None
    raise ValueError(f"{where}: unknown phase {value!r}")


@dataclass(frozen=True)
class RunResult:
    prompt: str
    max_tokens: int
    run: int
    wall_s: float
    aggregate_decode_tok_s: float | None
    requests: tuple[RequestResult, ...]
    metrics_delta: Mapping[str, float] | None = None
    phase: Phase | None = None  # agent prompts: cold (new session) or warm (prefix cached)

    def to_json(self) -> dict[str, Any]:
        return {
            "prompt": self.prompt,
            "max_tokens": self.max_tokens,
            "run": self.run,
            "wall_s": self.wall_s,
            "aggregate_decode_tok_s": self.aggregate_decode_tok_s,
            "requests": [q.to_json() for q in self.requests],
            "metrics_delta": dict(self.metrics_delta) if self.metrics_delta is not None else None,
            "phase": self.phase,
        }

    @staticmethod
    def from_json(value: object, where: str) -> RunResult:
        data = JsonFields.of(value, where)
        delta = data.opt_obj("metrics_delta")
        return RunResult(
            prompt=data.string("prompt"),
            max_tokens=data.integer("max_tokens"),
            run=data.integer("run"),
            wall_s=data.number("wall_s"),
            aggregate_decode_tok_s=data.opt_number("aggregate_decode_tok_s"),
            requests=tuple(
                RequestResult.from_json(q, f"{where}.requests[{i}]")
                for i, q in enumerate(data.items("requests"))
            ),
            metrics_delta={k: delta.number(k) for k in delta.names()} if delta else None,
            phase=_phase(data.opt_string("phase"), f"{where}.phase"),
        )


@dataclass(frozen=True)
class Stats:
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

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(value: object, where: str) -> Stats | None:
        if value is None:
            return None
        data = JsonFields.of(value, where)
        return Stats(
            min=data.number("min"),
            median=data.number("median"),
            max=data.number("max"),
            stdev=data.opt_number("stdev"),
            n=data.integer("n"),
        )


# Summary statistics by the name of the RequestResult field they summarise.
FieldStats = Mapping[str, Stats | None]


def _field_stats_json(stats: FieldStats) -> dict[str, Any]:
    return {k: st.to_json() if st is not None else None for k, st in stats.items()}


def _field_stats_from_json(value: object, where: str) -> dict[str, Stats | None]:
    data = JsonFields.of(value, where)
    return {k: Stats.from_json(data.raw(k), f"{where}.{k}") for k in data.names()}


def _phases_from_json(data: JsonFields) -> dict[Phase, FieldStats]:
    out: dict[Phase, FieldStats] = {}
    for key in data.names():
        phase = _phase(key, data.where)
        if phase is not None:
            out[phase] = _field_stats_from_json(data.raw(key), f"{data.where}.{key}")
    return out


@dataclass(frozen=True)
class Summary:
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

    def to_json(self) -> dict[str, Any]:
        return {
            "prompt": self.prompt,
            "max_tokens": self.max_tokens,
            "stats": _field_stats_json(self.stats),
            "aggregate_decode_tok_s": (
                self.aggregate_decode_tok_s.to_json()
                if self.aggregate_decode_tok_s is not None
                else None
            ),
            "ceiling_share": self.ceiling_share,
            "phases": (
                {phase: _field_stats_json(st) for phase, st in self.phases.items()}
                if self.phases is not None
                else None
            ),
        }

    @staticmethod
    def from_json(value: object, where: str) -> Summary:
        data = JsonFields.of(value, where)
        phases = data.opt_obj("phases")
        return Summary(
            prompt=data.string("prompt"),
            max_tokens=data.integer("max_tokens"),
            stats=_field_stats_from_json(data.raw("stats"), f"{where}.stats"),
            aggregate_decode_tok_s=Stats.from_json(
                data.raw("aggregate_decode_tok_s"), f"{where}.aggregate_decode_tok_s"
            ),
            ceiling_share=data.opt_number("ceiling_share"),
            phases=_phases_from_json(phases) if phases is not None else None,
        )


@dataclass(frozen=True)
class ServerProps:
    """What llama-server's /props said about itself; a field it did not send stays None and is
    left out of the file."""

    build_info: str | None = None
    model_path: str | None = None
    model_alias: str | None = None
    total_slots: int | None = None
    model_ftype: str | None = None
    n_ctx: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @staticmethod
    def from_json(value: object, where: str) -> ServerProps:
        data = JsonFields.of(value, where)
        return ServerProps(
            build_info=data.opt_string("build_info"),
            model_path=data.opt_string("model_path"),
            model_alias=data.opt_string("model_alias"),
            total_slots=data.opt_integer("total_slots"),
            model_ftype=data.opt_string("model_ftype"),
            n_ctx=data.opt_integer("n_ctx"),
        )


@dataclass(frozen=True)
class MachineInfo:
    """The machine the client ran on (the server's is in its build_info and the results)."""

    hostname: str
    system: str
    machine: str
    processor: str | None
    cpus: int | None
    python: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(value: object, where: str) -> MachineInfo:
        data = JsonFields.of(value, where)
        return MachineInfo(
            hostname=data.string("hostname"),
            system=data.string("system"),
            machine=data.string("machine"),
            processor=data.opt_string("processor"),
            cpus=data.opt_integer("cpus"),
            python=data.string("python"),
        )


@dataclass(frozen=True)
class RecordedSettings:
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

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["prompts"] = list(self.prompts)
        out["max_tokens"] = list(self.max_tokens)
        return out

    @staticmethod
    def from_json(value: object, where: str) -> RecordedSettings:
        data = JsonFields.of(value, where)
        return RecordedSettings(
            prompts=tuple(data.strings("prompts")),
            max_tokens=tuple(data.integers("max_tokens")),
            runs=data.integer("runs"),
            warmup=data.integer("warmup"),
            concurrency=data.integer("concurrency"),
            temperature=data.number("temperature"),
            seed=data.integer("seed"),
            ignore_eos=data.flag("ignore_eos"),
            cache_prompt=data.flag("cache_prompt"),
        )


@dataclass(frozen=True)
class BenchMeta:
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

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "model": self.model,
            "server": self.server.to_json(),
            "machine": self.machine.to_json(),
            "date": self.date,
            "llamanix": self.llamanix,
            "metrics": self.metrics,
            "settings": self.settings.to_json(),
            "cold_load_s": self.cold_load_s,
        }

    @staticmethod
    def from_json(value: object, where: str) -> BenchMeta:
        data = JsonFields.of(value, where)
        return BenchMeta(
            url=data.string("url"),
            model=data.opt_string("model"),
            server=ServerProps.from_json(data.raw("server"), f"{where}.server"),
            machine=MachineInfo.from_json(data.raw("machine"), f"{where}.machine"),
            date=data.string("date"),
            llamanix=data.string("llamanix"),
            metrics=data.flag("metrics"),
            settings=RecordedSettings.from_json(data.raw("settings"), f"{where}.settings"),
            cold_load_s=data.opt_number("cold_load_s"),
        )


@dataclass(frozen=True)
class BenchResult:
    """Everything one ``llamanix bench`` produced: what --json writes and compare reads."""

    label: str
    meta: BenchMeta
    runs: tuple[RunResult, ...]
    summaries: tuple[Summary, ...]
    ceiling: Ceiling | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "format": RESULT_FORMAT,
            "label": self.label,
            "meta": self.meta.to_json(),
            "ceiling": self.ceiling.to_json() if self.ceiling is not None else None,
            "summaries": [s.to_json() for s in self.summaries],
            "runs": [r.to_json() for r in self.runs],
        }


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
        top = JsonFields.of(data, "result")
        ceiling = top.raw("ceiling")
        return BenchResult(
            label=top.string("label"),
            meta=BenchMeta.from_json(top.raw("meta"), "meta"),
            runs=tuple(
                RunResult.from_json(r, f"runs[{i}]") for i, r in enumerate(top.items("runs"))
            ),
            summaries=tuple(
                Summary.from_json(s, f"summaries[{i}]")
                for i, s in enumerate(top.items("summaries"))
            ),
            ceiling=Ceiling.from_json(ceiling, "ceiling") if ceiling is not None else None,
        )
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
                    **q.to_json(),
                }
            )
    return rows
