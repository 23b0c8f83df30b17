"""``llamanix check smoke``: does this llama-server binary really serve, on the GPU, at full speed?

It starts the binary the way a unit would (the config goes through ``parse_config`` and
``instance_argv``, all layers offloaded) with a synthetic model or the one given, then checks
what a healthy deployment shows: /health, two identical streamed chat completions, /metrics
with counters that agree with the completions, a decode rate, and drafting when speculation was
asked for. A CUDA build must also show the card in its log, every layer offloaded, SASS for the
card's compute capability in its CUDA library (``cuobjdump --list-elf``), and no JIT tell (a
first request far slower than the second). Any failed check makes the command exit 1; on a CPU
build the GPU checks are skipped as "not a CUDA build".
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import ClassVar

import httpx

from llamanix.bench.bench_results import BenchSettings, RequestResult
from llamanix.bench.prompts import Prompt
from llamanix.bench.streaming import request_body, stream_completion
from llamanix.config.argv import instance_argv
from llamanix.config.model import Config, parse_config
from llamanix.core.errors import ExternalCommandError, Problem, UserError
from llamanix.core.json_codec import JsonRecord, JsonShape
from llamanix.core.json_value import JsonObject
from llamanix.core.probe import Capabilities
from llamanix.core.projects import other_project, variant_of
from llamanix.core.variants import VARIANTS
from llamanix.diagnose import cuda_check
from llamanix.diagnose.cuda_check import NOT_CUDA, Check
from llamanix.diagnose.doctor import query_gpus
from llamanix.external.files import work_dir
from llamanix.external.llama_server import ServerStartError, probe_binary, run_binary
from llamanix.model.gguf_info import read_gguf
from llamanix.server.client import LlamaClient
from llamanix.server.metrics import MetricsSnapshot, metrics_delta, parse_metrics
from llamanix.server.server_log import CudaDevice, parse_server_log
from llamanix.server.server_process import LlamaServer, free_port, tail

FORMAT = "llamanix-smoke/1"
SPECS = ("none", "draft", "mtp")
INSTANCE = "smoke"
SOURCE = "llamanix check smoke"
DEFAULT_TOKENS = 64
# Enough for the prompt and the answer; a real model's trained context would allocate far more
# KV cache than a smoke run needs.
CONTEXT = 4096
# A big model can take minutes to load; a PTX JIT at load-time warm-up adds more.
START_TIMEOUT_S = 900.0
REQUEST_TIMEOUT_S = 600.0
# llama.cpp master logs ggml's and llama's info lines (the CUDA device line, "offloaded N/M
# layers") only at verbosity 4; older builds print them anyway and take the flag all the same.
VERBOSE_ARGS = ("-lv", "4")
# The driver's JIT cache would hide a PTX JIT from every run after the first one on a machine.
SERVER_ENV = {"CUDA_CACHE_DISABLE": "1"}
PROMPT = "Write a Python function that computes the Fibonacci sequence."
# draft = the model itself: the synthetic model is confident, so with p_min 0.6 it drafts and
# every drafted token is accepted (the demo and the integration tests use the same setting).
DRAFT_SETTINGS = {"n_max": 8, "p_min": 0.6}
METRICS_REQUIRED = ("prompt_tokens_total", "tokens_predicted_total")
SPEC_COUNTER = "spec_decode_num_draft_tokens_total"
LOG_TAIL_LINES = 30
_LOG_PATH = re.compile(r"\s*\(log [^)]*\):?$")
CHECK_ORDER = (
    "start",
    "health",
    "chat",
    "metrics",
    "decode",
    "drafting",
    "cuda-device",
    "gpu-offload",
    "sass",
    "jit",
)


@dataclass(frozen=True)
class SmokeSettings:
    binary: Path
    model: Path | None = None
    spec: str = "none"
    variant: str | None = None  # None: the one the binary's --help speaks (core.projects)
    draft_model: Path | None = None
    tokens: int = DEFAULT_TOKENS
    keep: Path | None = None
    # Writes a model to the given path when `model` is None. The CLI passes the test bed's
    # synthetic model here; measuring must not depend on how test models are made.
    make_model: Callable[[Path], object] | None = None


@dataclass
class SmokeReport(JsonRecord):
    """Everything one smoke run saw; ``--json`` writes ``to_json()``: its format first and
    whether it passed."""

    binary: str
    variant: str
    spec: str
    model: str
    synthetic_model: bool
    cuda: bool = False
    argv: list[str] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    figures: dict[str, float | int | None] = field(default_factory=dict)
    gpu: JsonObject = field(default_factory=dict)
    log_tail: list[str] = field(default_factory=list)
    log: str | None = None  # the server's log, when --keep kept it

    json_shape: ClassVar[JsonShape] = JsonShape(
        constants={"format": FORMAT},
        computed={"ok": lambda r: r.ok},
        order=(
            "format",
            "ok",
            "binary",
            "variant",
            "spec",
            "model",
            "synthetic_model",
            "cuda",
            "argv",
            "checks",
            "figures",
            "gpu",
            "log",
            "log_tail",
        ),
    )

    @property
    def ok(self) -> bool:
        return not any(c.status == "fail" for c in self.checks)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.status == "fail"]

    def check(self, name: str) -> Check | None:
        return next((c for c in self.checks if c.name == name), None)


# --- inputs -----------------------------------------------------------------------------------


def check_inputs(settings: SmokeSettings) -> None:
    """Refuse what cannot work before anything runs (one line, exit 2)."""
    binary = settings.binary
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        raise UserError(
            Problem(
                str(binary),
                "--binary",
                "not an executable file",
                "give the path of a llama-server binary",
            )
        )
    if settings.spec not in SPECS:
        raise UserError(
            Problem(
                SOURCE,
                "--spec",
                f"unknown value {settings.spec!r}",
                f"use one of {', '.join(SPECS)}",
            )
        )
    if settings.spec == "mtp" and settings.model is None:
        raise UserError(
            Problem(
                SOURCE,
                "--spec mtp",
                "MTP needs a model with MTP (nextn) heads; synthetic models have none",
                "give --model FILE.gguf with MTP layers",
            )
        )
    if settings.draft_model is not None and settings.spec != "draft":
        raise UserError(
            Problem(
                SOURCE,
                "--draft-model",
                "only used with --spec draft",
                "add --spec draft or drop --draft-model",
            )
        )
    if settings.model is not None:
        info = read_gguf(settings.model)  # a UserError naming the file when it is no GGUF
        if settings.spec == "mtp" and not info.has_mtp:
            raise UserError(
                Problem(
                    str(settings.model),
                    "--spec mtp",
                    "the model has no MTP (nextn) layers",
                    "give a model with MTP heads, or --spec draft or none",
                )
            )
    if settings.draft_model is not None:
        read_gguf(settings.draft_model)


def smoke_variant(settings: SmokeSettings, caps: Capabilities) -> str:
    """The variant the smoke renders for: the one named, if the binary is a build of its
    project; else the one the binary's --help speaks. Never a guess."""
    source = str(settings.binary)
    if settings.variant is None:
        found = variant_of(caps)
        if found is None:
            raise UserError(
                Problem(
                    source,
                    "--variant",
                    f"{caps.describe()} speaks no dialect llamanix knows",
                    "name its variant with --variant",
                )
            )
        return found.name
    other = other_project(VARIANTS[settings.variant], caps)
    if other is not None:
        raise UserError(
            Problem(
                source,
                "--variant",
                other.message(caps, settings.variant),
                f"smoke a build of {other.wanted}, or pass --variant "
                + (
                    other.variants[0]
                    if len(other.variants) == 1
                    else "with one of: " + ", ".join(other.variants)
                ),
            )
        )
    return settings.variant


def smoke_config(
    settings: SmokeSettings, model: Path, port: int, extra_args: tuple[str, ...]
) -> Config:
    """The one-instance config a unit for this binary and model would be rendered from."""
    # A config table as parse_config reads it from TOML.
    speculative: dict[str, object] = {"type": settings.spec}
    if settings.spec == "draft":
        draft = settings.draft_model or model
        speculative.update(
            draft_model=str(draft.absolute()), draft_gpu_layers="all", **DRAFT_SETTINGS
        )
    instance: dict[str, object] = {
        "variant": settings.variant,
        "binary": str(settings.binary.absolute()),
        "model": str(model.absolute()),
        "listen": "127.0.0.1",
        "port": port,
        "context": CONTEXT,
        "parallel": 1,
        "gpu_layers": "all",
        "metrics": True,
        "extra_args": list(extra_args),
        "speculative": speculative,
    }
    return parse_config({"instances": {INSTANCE: instance}}, SOURCE)


# --- the run ----------------------------------------------------------------------------------


Progress = Callable[[str], None]


@dataclass
class _Served:
    """What the requests to the running server returned."""

    health: Check | None = None
    first: RequestResult | None = None
    second: RequestResult | None = None
    chat_error: str | None = None
    metrics_before: MetricsSnapshot | None = None
    metrics_after: MetricsSnapshot | None = None
    metrics_error: str | None = None


def run_smoke(settings: SmokeSettings, progress: Progress | None = None) -> SmokeReport:
    """Start the binary, run every check, always stop the server; never raises for a failed
    check (they are in the report), only UserError for unusable input."""
    say = progress or (lambda _msg: None)
    check_inputs(settings)
    binary = settings.binary
    say("probing the binary")
    version_text = run_binary(str(binary), "--version")
    caps = probe_binary(binary)
    if not {"-m", "--model"} & set(caps.flags):
        raise UserError(
            Problem(
                str(binary),
                "--binary",
                "its --help lists no --model option: not a llama-server",
                "give the path of a llama-server binary",
            )
        )
    settings = replace(settings, variant=smoke_variant(settings, caps))
    extra = VERBOSE_ARGS if VERBOSE_ARGS[0] in caps.flags else ()
    report, served, log_text = _serve_and_check(settings, caps, extra, say)
    _judge_served(report, served, settings)
    ttft = (
        None
        if served is None
        else (
            served.first.ttft_s if served.first else None,
            served.second.ttft_s if served.second else None,
        )
    )
    verdict = gpu_checks(binary, caps.cuda, version_text, log_text, ttft)
    report.cuda, report.gpu = verdict.cuda, verdict.gpu
    report.checks += verdict.checks
    order = {name: i for i, name in enumerate(CHECK_ORDER)}
    report.checks.sort(key=lambda c: order.get(c.name, len(order)))
    if not report.ok:
        report.log_tail = tail(log_text, LOG_TAIL_LINES).splitlines()
    return report


def _serve_and_check(
    settings: SmokeSettings, caps: Capabilities, extra: tuple[str, ...], say: Progress
) -> tuple[SmokeReport, _Served | None, str]:
    """In a work directory (``--keep``'s, or a temporary one): the model (given or
    synthesized), the server started on it, two chat completions, the server stopped. The
    report with its start check, what the server served (None when it did not start) and
    its log."""
    binary = settings.binary
    with work_dir(settings.keep, "llamanix-smoke.") as work:
        if settings.model is None:
            if settings.make_model is None:
                raise UserError(
                    Problem(SOURCE, "--model", "no model given", "give --model FILE.gguf")
                )
            model = work / "smoke-model.gguf"
            say("synthesizing a model")
            settings.make_model(model)
        else:
            model = settings.model
        config = smoke_config(settings, model, free_port(), extra)
        argv = instance_argv(config, INSTANCE, capabilities=caps)
        report = SmokeReport(
            binary=str(binary),
            variant=str(settings.variant),
            spec=settings.spec,
            model=str(model.absolute()),
            synthetic_model=settings.model is None,
            argv=argv,
        )
        server = LlamaServer(
            argv,
            work / "llama-server.log",
            env={**os.environ, **SERVER_ENV},
            start_timeout_s=START_TIMEOUT_S,
        )
        say("starting llama-server")
        started = time.monotonic()
        served: _Served | None = None
        try:
            server.start()
            report.figures["startup_s"] = time.monotonic() - started
            report.checks.append(
                Check("start", "pass", f"healthy after {report.figures['startup_s']:.1f} s")
            )
            say("two chat completions")
            served = _serve(server.url, settings.tokens)
        except ServerStartError as err:
            report.checks.append(Check("start", "fail", _start_failure(err, server.log_text())))
        finally:
            server.stop()
        log_text = server.log_text()
        if settings.keep is not None:
            report.log = str(server.log_path.absolute())
    return report, served, log_text


def _start_failure(err: ServerStartError, log_text: str) -> str:
    # The log's path is left out: without --keep it is gone when the report is read.
    first = _LOG_PATH.sub("", str(err).splitlines()[0])
    lines = [ln.strip() for ln in log_text.splitlines() if ln.strip()]
    # The first error line names the cause; later ones only report its consequences.
    errors = [ln for ln in lines if " E " in ln or "error" in ln.lower()]
    why = errors[0] if errors else (lines[-1] if lines else "the log is empty")
    return f"{first}: {why}"


def _serve(url: str, tokens: int) -> _Served:
    out = _Served()
    prompt = Prompt("smoke", ({"role": "user", "content": PROMPT},))
    # cache_prompt off: the second request redoes the same prefill, so the two compare.
    body = request_body(prompt, tokens, BenchSettings(url=url))
    with LlamaClient(url, timeout_s=REQUEST_TIMEOUT_S) as client:
        out.health = _health(client)
        out.metrics_before = _scrape(client, out)
        try:
            out.first = stream_completion(client, body)
            out.second = stream_completion(client, body)
        except (UserError, ExternalCommandError, httpx.HTTPError) as err:
            out.chat_error = f"{type(err).__name__}: {err}"
        if out.metrics_before is not None:
            out.metrics_after = _scrape(client, out)
    return out


def _health(client: LlamaClient) -> Check:
    try:
        resp = client.health()
    except httpx.HTTPError as err:
        return Check("health", "fail", f"GET /health: {err}")
    if resp.status_code != 200:
        return Check("health", "fail", f"GET /health: HTTP {resp.status_code}")
    try:
        status = resp.json().get("status")
    except (ValueError, AttributeError):
        status = None
    if status != "ok":
        return Check("health", "fail", f"GET /health answered {resp.text.strip()[:200]!r}")
    return Check("health", "pass", 'GET /health: 200 {"status": "ok"}')


def _scrape(client: LlamaClient, out: _Served) -> MetricsSnapshot | None:
    try:
        resp = client.metrics_response()
    except httpx.HTTPError as err:
        out.metrics_error = f"GET /metrics: {err}"
        return None
    if resp.status_code != 200:
        out.metrics_error = f"GET /metrics: HTTP {resp.status_code} (started without --metrics?)"
        return None
    if "llamacpp:" not in resp.text:
        out.metrics_error = "GET /metrics has no llamacpp: metrics"
        return None
    try:
        return parse_metrics(resp.text)
    except ValueError as err:
        out.metrics_error = f"GET /metrics is not Prometheus text: {err}"
        return None


def _not_run(name: str) -> Check:
    return Check(name, "skip", "not run: the server did not start")


def _judge_served(report: SmokeReport, served: _Served | None, settings: SmokeSettings) -> None:
    if served is None:
        report.checks += [_not_run(n) for n in ("health", "chat", "metrics", "decode", "drafting")]
        return
    if served.health is not None:
        report.checks.append(served.health)
    first, second = served.first, served.second
    report.checks.append(_chat_check(served, settings.tokens))
    report.checks.append(_metrics_check(served))
    if first is not None and second is not None:
        report.figures.update(
            first_ttft_s=first.ttft_s,
            second_ttft_s=second.ttft_s,
            first_wall_s=first.wall_s,
            second_wall_s=second.wall_s,
            # The second request: the first may carry one-time costs.
            decode_tok_s=second.server_decode_tok_s,
            client_decode_tok_s=second.client_decode_tok_s,
            prefill_tok_s=second.server_prefill_tok_s,
            predicted_n=second.predicted_n,
            draft_n=(first.draft_n or 0) + (second.draft_n or 0),
            draft_n_accepted=(first.draft_n_accepted or 0) + (second.draft_n_accepted or 0),
        )
    report.checks.append(_decode_check(second))
    report.checks.append(_drafting_check(served, settings.spec))


def _chat_check(served: _Served, tokens: int) -> Check:
    if served.chat_error is not None:
        return Check("chat", "fail", f"chat completion failed: {served.chat_error}")
    results = [r for r in (served.first, served.second) if r is not None]
    for i, result in enumerate(results, 1):
        if result.chunks == 0 or result.predicted_n != tokens:
            return Check(
                "chat",
                "fail",
                f"request {i}: {result.predicted_n} tokens in {result.chunks} chunks, "
                f"expected {tokens} (finish_reason {result.finish_reason})",
            )
    return Check("chat", "pass", f"2 streamed chat completions of {tokens} tokens each")


def _metrics_check(served: _Served) -> Check:
    before, after = served.metrics_before, served.metrics_after
    if before is None or after is None:
        return Check("metrics", "fail", served.metrics_error or "GET /metrics failed")
    missing = [name for name in METRICS_REQUIRED if name not in after.values]
    if missing:
        return Check("metrics", "fail", f"/metrics lacks llamacpp:{', llamacpp:'.join(missing)}")
    delta = metrics_delta(before, after)
    predicted = sum(r.predicted_n or 0 for r in (served.first, served.second) if r is not None)
    moved = delta.get("tokens_predicted_total", 0.0)
    if predicted and moved != predicted:
        return Check(
            "metrics",
            "fail",
            f"llamacpp:tokens_predicted_total moved by {moved:g}, "
            f"the completions reported {predicted} tokens",
        )
    return Check(
        "metrics",
        "pass",
        f"{len(after.values)} llamacpp: samples; tokens_predicted_total +{moved:g}",
    )


def _decode_check(second: RequestResult | None) -> Check:
    if second is None:
        return Check("decode", "fail", "no completed request to read decode speed from")
    rate = second.server_decode_tok_s or second.client_decode_tok_s
    if not rate:
        return Check("decode", "fail", f"no decode rate ({second.predicted_n} tokens generated)")
    client = second.client_decode_tok_s
    also = f", {client:.1f} on the client's clock" if client else ""
    return Check("decode", "pass", f"{rate:.1f} tok/s{also} ({second.predicted_n} tokens)")


def _drafting_check(served: _Served, spec: str) -> Check:
    if spec == "none":
        return Check("drafting", "skip", "no speculation asked (--spec none)")
    results = [r for r in (served.first, served.second) if r is not None]
    if not results:
        return Check("drafting", "fail", "no completed request to read draft_n from")
    drafted = sum(r.draft_n or 0 for r in results)
    accepted = sum(r.draft_n_accepted or 0 for r in results)
    if drafted == 0:
        return Check(
            "drafting",
            "fail",
            f"--spec {spec} asked for speculation, but no request drafted (timings.draft_n = 0)",
        )
    counter = ""
    if served.metrics_before is not None and served.metrics_after is not None:
        delta = metrics_delta(served.metrics_before, served.metrics_after)
        if SPEC_COUNTER in delta:
            if delta[SPEC_COUNTER] <= 0:
                return Check(
                    "drafting",
                    "fail",
                    f"draft_n = {drafted} but llamacpp:{SPEC_COUNTER} did not move",
                )
            counter = f"; llamacpp:{SPEC_COUNTER} +{delta[SPEC_COUNTER]:g}"
    return Check("drafting", "pass", f"draft_n {drafted}, accepted {accepted}{counter}")


@dataclass
class GpuVerdict:
    cuda: bool
    checks: list[Check]
    gpu: JsonObject


def _with_capabilities(devices: list[CudaDevice]) -> list[CudaDevice]:
    """Devices named without a compute capability get nvidia-smi's, by index (its order is
    CUDA's by default, PCI bus order)."""
    if all(d.compute_capability for d in devices):
        return devices
    smi = query_gpus() or []
    return [
        d
        if d.compute_capability or d.index >= len(smi)
        else replace(d, compute_capability=smi[d.index].compute_capability)
        for d in devices
    ]


def gpu_checks(
    binary: Path,
    probed_cuda: bool,
    version_text: str,
    log_text: str,
    ttft_s: tuple[float | None, float | None] | None,
) -> GpuVerdict:
    """The CUDA checks, from the binary's --version output and the server's log;
    ``ttft_s`` is (first, second) request, or None when the server never served."""
    text = version_text + "\n" + log_text
    cuda = probed_cuda or cuda_check.is_cuda_build(text)
    jit = (
        Check("jit", "skip", NOT_CUDA if not cuda else "not run: the server did not start")
        if ttft_s is None
        else cuda_check.check_jit(ttft_s[0], ttft_s[1], cuda)
    )
    if not cuda:
        skipped = [Check(name, "skip", NOT_CUDA) for name in ("cuda-device", "gpu-offload", "sass")]
        return GpuVerdict(False, [*skipped, jit], {})
    # The device lines can be in both --version's output and the log: each device once.
    devices = list({d.index: d for d in parse_server_log(text).cuda_devices}.values())
    counts = cuda_check.offload_counts(log_text)
    devices = _with_capabilities(devices)
    capabilities = [d.compute_capability for d in devices if d.compute_capability]
    if not capabilities:
        capabilities = [g.compute_capability for g in query_gpus() or []]
    library = cuda_check.find_cuda_library(binary, log_text)
    try:
        sass = cuda_check.check_sass(library, capabilities)
    except ExternalCommandError as err:
        sass = Check("sass", "fail", str(err))
    checks = [cuda_check.check_device(text, devices), cuda_check.check_offload(counts), sass, jit]
    gpu: JsonObject = {
        "devices": [
            {"index": d.index, "name": d.name, "compute_capability": d.compute_capability}
            for d in devices
        ],
        "compute_capabilities": [*capabilities],
        "layers_offloaded": [[*c] for c in counts],
        "cuda_library": str(library),
    }
    return GpuVerdict(True, checks, gpu)


__all__ = [
    "FORMAT",
    "SPECS",
    "GpuVerdict",
    "SmokeReport",
    "SmokeSettings",
    "check_inputs",
    "gpu_checks",
    "run_smoke",
    "smoke_config",
]
