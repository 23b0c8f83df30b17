"""``llamanix bench synthetic RATES``: what acceptance would speculation need here?

Upstream llama-server has a benchmark-only switch, ``--spec-synth-len L``: verification of the
drafted tokens is replaced by synthetic accept decisions whose mean acceptance length (the
target token included) is ``L``. The output is not valid text, but every other cost of
speculation is real: the drafting, the batched verification, the rollback. A sweep over
acceptance rates therefore shows, on this machine and this instance, from which acceptance on
speculation beats the same instance without it.

For each per-drafted-token acceptance probability ``p`` the instance's own server is started
(its argv from ``llamanix.config.argv``, listening on a free loopback port) with
``--spec-synth-len L``, ``L = 1 + p + p^2 + ... + p^n``, where ``n`` is the draft length:
the instance's ``speculative.n_max``, else upstream's default for its speculative type (3 for
the draft-model types, 64 for ngram-mod, 48 for ngram-simple and ngram-map-k, 8 for
ngram-cache). That is upstream's own model of ``L``: it solves ``p + ... + p^n = L - 1`` for
``p`` and accepts draft position ``i`` with unconditional probability ``p^i`` (each drafted
token with probability ``p`` once the one before it was accepted). The server's log names the
draft length it really used; a different one is reported, since ``L`` then stands for another
``p``.

A baseline is measured first: the same argv without any speculative piece. Every server is
benchmarked with ``bench.bench.run_bench`` and stopped before the next one starts. The
flags never reach a rendered unit: this module builds the argv of servers it runs itself.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from rich.table import Table

from llamanix.bench.bench import ProgressHook, run_bench
from llamanix.bench.bench_results import BenchResult, BenchSettings
from llamanix.bench.interval import MIN_SAMPLES, RatioInterval, ratio_interval
from llamanix.bench.prompts import Prompt
from llamanix.config.argv import Arg, flatten, instance_arg_pieces
from llamanix.config.model import Config
from llamanix.core.errors import ExternalCommandError, Problem, UserError
from llamanix.core.json_codec import JSON_SKIP, JsonRecord
from llamanix.core.json_value import JsonObject
from llamanix.core.readiness import deadline_s, files_size
from llamanix.external.llama_server import ServerStartError, probe_binary
from llamanix.server.readiness import NotReady, ReadinessCheck, wait_ready
from llamanix.server.server_process import DEFAULT_HOST, LlamaServer, tail

SOURCE = "llamanix bench synthetic"
OPTION = "RATES"
SYNTH_LEN_FLAG = "--spec-synth-len"
SYNTH_FLAG_PREFIX = "--spec-synth-"
# What upstream logs (common/speculative.cpp) once synthetic acceptance acts.
ENABLED_WARNING = "synthetic speculative acceptance is enabled"
_RESOLVED = re.compile(r"synthetic acceptance: n_max = (\d+), mean length = ([0-9.]+)")
# Upstream's default draft length per canonical speculative type (common/common.h): the
# draft-model types share --spec-draft-n-max (3); the n-gram drafters have their own.
DEFAULT_N_MAX = 3
UPSTREAM_N_MAX: Mapping[str, int] = {
    "ngram-mod": 64,
    "ngram-simple": 48,
    "ngram-map-k": 48,
    "ngram-cache": 8,
}
# The pinned test-bed build (server_build.LLAMA_CPP_COMMIT) already has the flags.
KNOWN_GOOD_COMMIT = "0c1e570"

Say = Callable[[str], None]


# --- the arithmetic --------------------------------------------------------------------------


def mean_length(p: float, n_max: int) -> float:
    """``1 + p + p^2 + ... + p^n_max``: the mean tokens per verification step (the target token
    included) when each drafted token is accepted with probability ``p`` after the one before
    it was. Within upstream's range ``[1, n_max + 1]`` however it rounds."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"acceptance {p} is not in [0, 1]")
    if n_max < 1:
        raise ValueError(f"n_max {n_max} must be at least 1")
    length = 1.0 + sum(p**i for i in range(1, n_max + 1))
    return min(max(length, 1.0), float(n_max + 1))


def length_arg(length: float) -> str:
    """``--spec-synth-len``'s value: six decimals, as upstream logs it back."""
    return f"{length:.6f}"


def parse_rates(text: str) -> tuple[float, ...]:
    """``0.3,0.6,0.9`` -> the rates; UserError (one line naming the option) otherwise."""
    rates: list[float] = []
    for raw in text.split(","):
        word = raw.strip()
        try:
            rate = float(word)
        except ValueError:
            raise UserError(
                Problem(
                    SOURCE,
                    OPTION,
                    f"{word!r} is not a number",
                    "give acceptance rates in [0, 1], comma-separated, e.g. 0.3,0.6,0.9",
                )
            ) from None
        if not (math.isfinite(rate) and 0.0 <= rate <= 1.0):
            raise UserError(
                Problem(
                    SOURCE,
                    OPTION,
                    f"{word} is not in [0, 1]",
                    "give per-drafted-token acceptance probabilities between 0 and 1",
                )
            )
        rates.append(rate)
    return tuple(rates)


# --- the servers ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SweepPlan:
    """The servers a sweep starts: the instance with and without speculation."""

    instance: str
    program: str
    spec_type: str
    n_max: int
    n_max_source: str  # "speculative.n_max" or "upstream default for TYPE"
    speculative_argv: tuple[str, ...]
    baseline_argv: tuple[str, ...]
    model_files: tuple[str, ...]

    def synthetic_argv(self, p: float) -> list[str]:
        """The speculative argv plus ``--spec-synth-len L`` for acceptance ``p``."""
        return [*self.speculative_argv, SYNTH_LEN_FLAG, length_arg(mean_length(p, self.n_max))]


def _listen_here(pieces: Sequence[Arg]) -> list[Arg]:
    """The pieces with the address replaced by ``DEFAULT_HOST``, without the port (each start
    adds a free one: ``server_process.with_listen_address``) and without the API key: the
    sweep's servers listen on loopback only, for as long as the sweep runs."""
    out: list[Arg] = []
    for arg in pieces:
        if arg.field == "listen":
            arg = Arg(arg.field, (arg.tokens[0], DEFAULT_HOST))
        elif arg.field in ("port", "api_key_file"):
            continue
        out.append(arg)
    return out


def _refuse(config: Config, field: str, message: str, fix: str) -> UserError:
    return UserError(Problem(config.source, field, message, fix))


def plan_sweep(config: Config, name: str) -> SweepPlan:
    """Check the instance and its binary, and build both argvs; UserError when the sweep
    cannot run (no speculation, a build without synthetic acceptance, model files missing)."""
    pieces = instance_arg_pieces(config, name)  # no such instance, a bad variant: its errors
    inst = config.instances[name]
    spec = inst.speculative
    where = f"instances.{name}"
    if not spec.enabled:
        raise _refuse(
            config,
            f"{where}.speculative.type",
            f"instance has no speculation for {SOURCE} to act on",
            "set speculative.type, e.g. draft with a speculative.draft_model, or name an "
            "instance that has speculation",
        )
    for token in inst.extra_args:
        if token.startswith(SYNTH_FLAG_PREFIX):
            raise _refuse(
                config,
                f"{where}.extra_args",
                f"{token} is benchmark-only and set by {SOURCE} itself",
                f"remove {token} from extra_args",
            )
    program = pieces[0].tokens[0]
    caps = probe_binary(program)
    if SYNTH_LEN_FLAG not in caps.flags:
        raise UserError(
            Problem(
                program,
                SYNTH_LEN_FLAG,
                f"this build has no synthetic acceptance ({caps.describe()} lacks "
                f"{SYNTH_LEN_FLAG})",
                f"it needs upstream llama.cpp with {SYNTH_LEN_FLAG} in --help "
                f"(commit {KNOWN_GOOD_COMMIT} has it); set the instance's binary to one",
            )
        )
    pieces = instance_arg_pieces(config, name, capabilities=caps)
    models = [inst.model, *([spec.draft_model] if spec.draft_model else [])]
    for key, path in zip(("model", "speculative.draft_model"), models, strict=False):
        if not Path(path).is_file():
            raise _refuse(
                config,
                f"{where}.{key}",
                f"{path} is not a file on this machine",
                f"{SOURCE} starts the server here: run it on the host that holds the model",
            )
    pieces = _listen_here(pieces)
    if spec.n_max is not None:
        n_max, source = spec.n_max, "speculative.n_max"
    else:
        n_max = UPSTREAM_N_MAX.get(spec.type, DEFAULT_N_MAX)
        source = f"upstream default for {spec.type}"
    return SweepPlan(
        instance=name,
        program=program,
        spec_type=spec.type,
        n_max=n_max,
        n_max_source=source,
        speculative_argv=tuple(flatten(pieces)),
        baseline_argv=tuple(flatten([a for a in pieces if not a.field.startswith("speculative.")])),
        model_files=tuple(models),
    )


# --- the figures ------------------------------------------------------------------------------


@dataclass(frozen=True)
class DecodeFigures(JsonRecord):
    """Decode tok/s over every measured request that decoded (the server's clock, the client's
    where the server sent no timings); the runs (samples) are not written."""

    n: int
    mean: float
    median: float
    min: float
    max: float
    samples: tuple[float, ...] = field(metadata=JSON_SKIP)

    @staticmethod
    def of(result: BenchResult) -> DecodeFigures | None:
        samples: list[float] = []
        for run in result.runs:
            for q in run.requests:
                rate = q.server_decode_tok_s
                if rate is None:
                    rate = q.client_decode_tok_s
                if rate is not None and math.isfinite(rate) and rate > 0:
                    samples.append(rate)
        if not samples:
            return None
        return DecodeFigures(
            n=len(samples),
            mean=statistics.fmean(samples),
            median=statistics.median(samples),
            min=min(samples),
            max=max(samples),
            samples=tuple(samples),
        )


@dataclass(frozen=True)
class ServerSynthetic:
    """What the server's log said about synthetic acceptance."""

    enabled: bool
    n_max: int | None
    mean_length: float | None

    @staticmethod
    def of(log_text: str) -> ServerSynthetic:
        found = _RESOLVED.search(log_text)
        return ServerSynthetic(
            enabled=ENABLED_WARNING in log_text,
            n_max=int(found.group(1)) if found else None,
            mean_length=float(found.group(2)) if found else None,
        )


@dataclass(frozen=True)
class SweepPoint:
    """One server measured: the baseline (``acceptance`` None) or one synthetic rate."""

    acceptance: float | None
    mean_length: float | None
    argv: tuple[str, ...]
    decode: DecodeFigures | None
    # The server's own count of accepted / drafted tokens (median over requests): lower than
    # ``acceptance``, since drafting goes on after a rejected position.
    drafted_acceptance: float | None
    server: ServerSynthetic
    result: BenchResult
    speedup: float | None = None  # median decode tok/s over the baseline's
    speedup_interval: RatioInterval | None = None

    @property
    def label(self) -> str:
        return "baseline" if self.acceptance is None else f"p={self.acceptance:g}"

    # Hand-written: the runs are written only when asked, the server's figures flat.
    def to_json(self, with_runs: bool = False) -> JsonObject:
        data: JsonObject = {
            "acceptance": self.acceptance,
            "mean_length": self.mean_length,
            "decode_tok_s": self.decode.to_json() if self.decode else None,
            "speedup": self.speedup,
            "speedup_interval": (
                self.speedup_interval.to_json() if self.speedup_interval else None
            ),
            "drafted_acceptance": self.drafted_acceptance,
            "server_n_max": self.server.n_max,
            "server_mean_length": self.server.mean_length,
            "argv": [*self.argv],
        }
        if with_runs:
            data["bench"] = self.result.to_json()
        return data


@dataclass(frozen=True)
class SweepResult:
    instance: str
    spec_type: str
    n_max: int
    n_max_source: str
    baseline: SweepPoint
    points: tuple[SweepPoint, ...]
    notes: tuple[str, ...]

    # Hand-written: the format comes first, and each point's runs only when asked.
    def to_json(self, with_runs: bool = False) -> JsonObject:
        return {
            "format": "llamanix-synthetic-acceptance/1",
            "benchmark_only": True,
            "instance": self.instance,
            "spec_type": self.spec_type,
            "n_max": self.n_max,
            "n_max_source": self.n_max_source,
            "baseline": self.baseline.to_json(with_runs),
            "points": [p.to_json(with_runs) for p in self.points],
            "notes": list(self.notes),
        }


def _speedup(
    point: DecodeFigures | None, baseline: DecodeFigures | None
) -> tuple[float | None, RatioInterval | None]:
    if point is None or baseline is None:
        return None, None
    if min(point.n, baseline.n) < MIN_SAMPLES:
        return point.median / baseline.median, None
    interval = ratio_interval(baseline.samples, point.samples)
    return interval.ratio, interval


def _drafted_acceptance(result: BenchResult) -> float | None:
    values = [q.acceptance for run in result.runs for q in run.requests if q.acceptance is not None]
    return statistics.median(values) if values else None


# --- the sweep --------------------------------------------------------------------------------


@dataclass(frozen=True)
class SweepRequest:
    plan: SweepPlan
    rates: tuple[float, ...]
    settings: BenchSettings  # its url is replaced by each started server's
    prompts: tuple[Prompt, ...]
    log_dir: Path


def _measure(
    request: SweepRequest,
    argv: Sequence[str],
    log: Path,
    label: str,
    progress: ProgressHook | None,
    say: Say,
) -> tuple[BenchResult, str, tuple[str, ...]]:
    """Start ``argv``, wait until it serves, bench it, stop it: the result, the server's log
    and the command it ran (with the port it got)."""
    limit = float(deadline_s(files_size(request.plan.model_files) or 0))
    server = LlamaServer(list(argv), log, start_timeout_s=limit)
    say(f"{label}: starting llama-server")
    try:
        server.start()
        try:
            wait_ready(ReadinessCheck(url=server.url, pid=server.pid, deadline_s=limit))
        except NotReady as err:
            raise ServerStartError(
                f"{label}: llama-server did not serve ({err}; log {log}):\n"
                f"{tail(server.log_text())}"
            ) from None
        say(f"{label}: measuring {server.url}")
        settings = replace(request.settings, url=server.url, label=label)
        result = run_bench(settings, request.prompts, progress=progress)
    finally:
        server.stop()
    return result, server.log_text(), tuple(server.command)


def run_sweep(
    request: SweepRequest, *, progress: ProgressHook | None = None, say: Say | None = None
) -> SweepResult:
    """The baseline, then one server per rate; every server is stopped before the next."""
    tell = say or (lambda _line: None)
    plan = request.plan
    base_result, base_log, base_argv = _measure(
        request, plan.baseline_argv, request.log_dir / "baseline.log", "baseline", progress, tell
    )
    base_decode = DecodeFigures.of(base_result)
    baseline = SweepPoint(
        acceptance=None,
        mean_length=None,
        argv=base_argv,
        decode=base_decode,
        drafted_acceptance=_drafted_acceptance(base_result),
        server=ServerSynthetic.of(base_log),
        result=base_result,
    )
    points: list[SweepPoint] = []
    notes: list[str] = []
    for i, p in enumerate(request.rates):
        label = f"p={p:g}"
        log = request.log_dir / f"synthetic-{i}.log"
        result, log_text, argv = _measure(
            request, plan.synthetic_argv(p), log, label, progress, tell
        )
        server = ServerSynthetic.of(log_text)
        if not server.enabled:
            raise ExternalCommandError(
                f"{label}: llama-server did not enable synthetic acceptance (no "
                f"'{ENABLED_WARNING}' in its log {log}); is speculation really on?"
            )
        if server.n_max is not None and server.n_max != plan.n_max:
            notes.append(
                f"{label}: llama-server drafts at most {server.n_max} tokens, not {plan.n_max} "
                f"({plan.n_max_source}): its mean length {server.mean_length} stands for "
                "another p; set speculative.n_max to match"
            )
        decode = DecodeFigures.of(result)
        speedup, interval = _speedup(decode, base_decode)
        points.append(
            SweepPoint(
                acceptance=p,
                mean_length=mean_length(p, plan.n_max),
                argv=argv,
                decode=decode,
                drafted_acceptance=_drafted_acceptance(result),
                server=server,
                result=result,
                speedup=speedup,
                speedup_interval=interval,
            )
        )
    return SweepResult(
        instance=plan.instance,
        spec_type=plan.spec_type,
        n_max=plan.n_max,
        n_max_source=plan.n_max_source,
        baseline=baseline,
        points=tuple(points),
        notes=tuple(notes),
    )


# --- the table --------------------------------------------------------------------------------


def _decode_cell(d: DecodeFigures | None) -> str:
    if d is None:
        return "-"
    if d.n == 1:
        return f"{d.median:,.1f}"
    return f"{d.median:,.1f} ({d.min:,.1f}-{d.max:,.1f})"


def _speedup_cell(point: SweepPoint) -> str:
    if point.speedup is None:
        return "-"
    text = f"{point.speedup:.2f}x"
    if point.speedup_interval is not None:
        iv = point.speedup_interval
        text += f" [{iv.low:.2f}-{iv.high:.2f}]"
    return text


def sweep_table(result: SweepResult) -> Table:
    """One row per acceptance, the baseline first."""
    table = Table(
        title=(
            f"{SOURCE}: {result.instance} "
            f"({result.spec_type}, n_max {result.n_max}; benchmark only, output not valid)"
        ),
        title_justify="left",
    )
    for heading in (
        "acceptance p",
        "mean length L",
        "decode tok/s median (min-max)",
        "speedup [95% interval]",
    ):
        table.add_column(heading, justify="right")
    base = result.baseline
    table.add_row("baseline", "1 (no speculation)", _decode_cell(base.decode), "1.00x")
    for p in result.points:
        table.add_row(
            f"{p.acceptance:g}",
            f"{p.mean_length:.3f}" if p.mean_length is not None else "-",
            _decode_cell(p.decode),
            _speedup_cell(p),
        )
    return table
