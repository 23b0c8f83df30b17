"""``llamanix doctor``: find what silently costs speed or memory, and say how to fix it.

Each check reads one source of truth: the GGUF files an instance names (vocabularies, sizes,
recurrent layers), the variant registry (who can checkpoint for speculation), the server's log
(refusals, acceptance), a live server (does it draft?), bench results (does speculation pay?)
and nvidia-smi (which compute capability the card has). Every finding carries a severity and
the fix; any error makes the command exit 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

import httpx

from llamanix.bench.bench_results import BenchResult
from llamanix.bench.crossover import PromptCrossover, prompt_crossovers
from llamanix.bench.workloads import WorkloadFigures
from llamanix.config.argv import instance_argv
from llamanix.config.model import Config, Host, Instance
from llamanix.core.errors import Problem, UserError
from llamanix.core.gpus import Gpu, arch_mismatch
from llamanix.core.json_codec import JSON_SKIP, JsonRecord, JsonShape, json_via
from llamanix.core.json_value import JsonObject
from llamanix.core.process_end import FAULT_SIGNALS, died_of
from llamanix.core.schema import SPEC_DRAFTERS
from llamanix.core.variants import VARIANTS
from llamanix.external.nvidia import nvidia_smi_gpus
from llamanix.model.ceiling import find_gpu, gpu_memory_bytes, vram_breakdown
from llamanix.model.gguf_header import has_chat_template
from llamanix.model.gguf_info import GgufInfo, read_gguf, read_vocab, vocab_mismatch
from llamanix.render.paths import key_files, open_key_files
from llamanix.server import client
from llamanix.server.server_log import ServerLog

Severity = Literal["error", "warning", "info"]
# What each check looks at; a report lists every check that ran under its name.
CheckName = Literal[
    "server-exit",
    "vocab",
    "chat-template",
    "vram",
    "hybrid",
    "flash-attn",
    "kv-pair",
    "cuda-arch",
    "spec-log",
    "acceptance",
    "spec-probe",
    "spec-bench",
    "spec-crossover",
    "spec-workloads",
    "key-file",
    "leftovers",
]
# A check passed, found something, or could not look (and says why).
Outcome = Literal["ok", "finding", "skipped"]
# What a finding is about: stable names for scripts reading --json.
FindingCode = Literal[
    "server-killed",
    "vocab-mismatch",
    "no-chat-template",
    "vram",
    "hybrid-no-checkpoint",
    "quantized-v-without-fa",
    "kv-type-pair",
    "cuda-arch",
    "spec-init-failed",
    "spec-refused",
    "spec-not-drafting",
    "spec-low-acceptance",
    "spec-slower",
    "spec-crossover",
    "spec-workload-costs",
    "spec-workload-pays",
    "spec-workload-unclear",
    "key-readable",
    # What a switch that did not finish left on this machine (hosts.leftovers).
    "leftover-fence",
    "leftover-redirect",
    "leftover-bridge",
    "leftover-bridge-files",
    "leftover-slot-files",
    "leftover-staging",
    "leftover-temporary-file",
    "leftover-pending",
    "unit-differs",
    "unit-not-running",
    "leftovers-unknown",
]
# Below this share of drafted tokens kept, drafting costs more than it saves (users of a 27B
# model reported 12% on ik, and 50% with a draft spending 78% of the time: both slower).
MIN_ACCEPTANCE = 0.5
# A budget above this share of the card's memory leaves no room for fragmentation.
VRAM_WARN_SHARE = 0.95
PROBE_PROMPT = "Write a Python function that computes the Fibonacci sequence."
PROBE_TOKENS = 64
PROBE_TIMEOUT_S = 300.0
_QUANTIZED_FREE = ("f32", "f16", "bf16")


@dataclass(frozen=True)
class Finding(JsonRecord):
    severity: Severity
    code: FindingCode
    instance: str | None
    message: str
    fix: str


@dataclass(frozen=True)
class CheckResult:
    outcome: Outcome
    why: str | None = None  # skipped: what was missing

    def text(self) -> str:
        """``ok``, ``finding`` or ``skipped: why``, as --json writes it."""
        return f"skipped: {self.why}" if self.outcome == "skipped" else self.outcome


def _checks_json(checks: dict[CheckName, CheckResult]) -> JsonObject:
    return {name: c.text() for name, c in checks.items()}


@dataclass
class Report(JsonRecord):
    """Built up check by check: what was found, and what was looked at. Written with the
    counts and verdict that follow from the findings, and each check as its text."""

    instances: tuple[str, ...] = field(default=(), metadata=JSON_SKIP)
    findings: list[Finding] = field(default_factory=list)
    checks: dict[CheckName, CheckResult] = field(
        default_factory=dict, metadata=json_via(_checks_json)
    )

    json_shape: ClassVar[JsonShape] = JsonShape(
        computed={
            "ok": lambda r: not r.has_errors,
            "errors": lambda r: sum(f.severity == "error" for f in r.findings),
            "warnings": lambda r: sum(f.severity == "warning" for f in r.findings),
        },
        order=("ok", "errors", "warnings", "findings", "checks"),
    )

    @property
    def has_errors(self) -> bool:
        return any(f.severity == "error" for f in self.findings)

    def count(self, outcome: Outcome) -> int:
        return sum(c.outcome == outcome for c in self.checks.values())

    def add(
        self,
        severity: Severity,
        code: FindingCode,
        instance: str | None,
        message: str,
        fix: str,
    ) -> None:
        # Several sources can show the same fault (config and log, log and probe): say it once.
        if any(f.code == code and f.instance == instance for f in self.findings):
            return
        self.findings.append(Finding(severity, code, instance, message, fix))

    def _record(self, check: CheckName, result: CheckResult) -> None:
        # A finding stands: another instance or source passing the same check does not undo it.
        previous = self.checks.get(check)
        if previous is not None and previous.outcome == "finding":
            return
        self.checks[check] = result

    def ran(self, check: CheckName, outcome: Literal["ok", "finding"] = "ok") -> None:
        self._record(check, CheckResult(outcome))

    def skipped(self, check: CheckName, why: str) -> None:
        self._record(check, CheckResult("skipped", why))


# --- external commands: one function each ---------------------------------------------------


@dataclass(frozen=True)
class SmiGpu:
    name: str
    compute_capability: str
    memory_mib: int | None


def parse_nvidia_smi(text: str) -> list[SmiGpu]:
    """``NVIDIA GeForce RTX 5090, 12.0, 32607 MiB`` per line."""
    out: list[SmiGpu] = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 2 or not parts[0]:
            continue
        memory = None
        if len(parts) > 2:
            digits = parts[2].split()[0] if parts[2].split() else ""
            memory = int(digits) if digits.isdigit() else None
        out.append(SmiGpu(name=parts[0], compute_capability=parts[1], memory_mib=memory))
    return out


def query_gpus() -> list[SmiGpu] | None:
    """The local GPUs per nvidia-smi; None where there is no nvidia-smi."""
    output = nvidia_smi_gpus()
    return parse_nvidia_smi(output) if output is not None else None


# --- probing a live server ------------------------------------------------------------------


@dataclass(frozen=True)
class Probe:
    predicted_n: int | None
    draft_n: int | None
    draft_n_accepted: int | None

    @property
    def acceptance(self) -> float | None:
        if not self.draft_n or self.draft_n_accepted is None:
            return None
        return self.draft_n_accepted / self.draft_n


def probe_server(
    url: str, api_key: str | None = None, model: str | None = None, raw: bool = False
) -> Probe:
    """One short completion: did the server draft, and how much of it was kept? ``raw``: the
    prompt as text to /completion, for a model without a chat template."""
    body: JsonObject = {
        "temperature": 0,
        "seed": 42,
        "ignore_eos": True,
        "cache_prompt": False,
    }
    if raw:
        body.update(prompt=PROBE_PROMPT, n_predict=PROBE_TOKENS)
    else:
        body["messages"] = [{"role": "user", "content": PROBE_PROMPT}]
        body["max_tokens"] = PROBE_TOKENS
    if model:
        body["model"] = model
    try:
        with client.LlamaClient(url, api_key=api_key, timeout_s=PROBE_TIMEOUT_S) as server:
            resp = server.complete_body(body) if raw else server.chat(body)
    except httpx.TransportError as err:
        raise UserError(
            Problem(url, "--url", f"cannot connect ({err})", "start the server or fix --url")
        ) from None
    if resp.status_code != 200:
        raise UserError(
            Problem(
                url,
                "--url",
                f"HTTP {resp.status_code} from the server",
                "check --url (and the instance's api_key_file)",
            )
        )
    timings = resp.json().get("timings") or {}

    def number(key: str) -> int | None:
        value = timings.get(key)
        return int(value) if isinstance(value, int | float) else None

    return Probe(number("predicted_n"), number("draft_n"), number("draft_n_accepted"))


# --- the checks ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Inputs:
    """What the checks may look at for one instance; None where the user gave nothing."""

    log: ServerLog | None = None
    probe: Probe | None = None
    benches: Sequence[BenchResult] = ()
    # The output length the instance's requests average (--avg-output-tokens); without it the
    # crossover check compares with what the bench results generated.
    avg_output_tokens: float | None = None
    # Each workload of --prompts measured on the live server (and on --baseline-url).
    workloads: Sequence[WorkloadFigures] = ()


def _read_model(path: str | None) -> GgufInfo | None:
    if path is None or not Path(path).is_file():
        return None
    return read_gguf(Path(path))


def check_vocab(report: Report, inst: Instance) -> None:
    spec = inst.speculative
    if spec.draft_model is None:
        return
    if not (Path(inst.model).is_file() and Path(spec.draft_model).is_file()):
        report.skipped("vocab", "model files not readable here")
        return
    why = vocab_mismatch(read_vocab(Path(inst.model)), read_vocab(Path(spec.draft_model)))
    if why is None:
        report.ran("vocab")
        return
    report.ran("vocab", "finding")
    report.add(
        "error",
        "vocab-mismatch",
        inst.name,
        f"the draft's vocabulary does not match the target's: {why}; llama.cpp refuses "
        "the draft (or, in older builds, loads it and never drafts)",
        "use a draft from the target's model family (same tokenizer), "
        "e.g. a smaller model of the same release",
    )


def check_chat_template(report: Report, inst: Instance) -> None:
    template = has_chat_template(Path(inst.model))
    if template is None:
        report.skipped("chat-template", "model file not readable here")
        return
    if template:
        report.ran("chat-template")
        return
    report.ran("chat-template", "finding")
    report.add(
        "warning",
        "no-chat-template",
        inst.name,
        f"{Path(inst.model).name} has no chat template of its own (a base model?): "
        "llama-server falls back to chatml, and through /v1/chat/completions the model "
        "continues chatml's markers instead of answering",
        'send raw text to /completion (bench, lossless and doctor: --prompts with "text" '
        "prompts, e.g. realtext), or serve an instruction-tuned model",
    )


def check_key_file(report: Report, config: Config, inst: Instance) -> None:
    """The key file clients of the instance use (its router's, for a member): one every user
    of this machine can read is a warning."""
    router = config.hosts[inst.host].router
    routed = router is not None and inst.name in router.members
    owner = f"hosts.{inst.host}.router" if routed else f"instances.{inst.name}"
    field = f"{owner}.api_key_file"
    fields = [f for f in key_files(config) if f[0] == field]
    if not fields:
        report.skipped("key-file", "no api_key_file")
        return
    if config.hosts[inst.host].target is not None:
        report.skipped("key-file", "the key file is on another host")
        return
    found = open_key_files(config, fields)
    if not found:
        report.ran("key-file")
        return
    report.ran("key-file", "finding")
    report.add("warning", "key-readable", inst.name, found[0].message, found[0].fix)


def check_vram(report: Report, inst: Instance, gpu: Gpu | None) -> None:
    if gpu is None:
        report.skipped("vram", "no GPU known (set hosts.NAME.gpu or pass --gpu)")
        return
    if inst.gpu_layers == 0:
        report.skipped("vram", "gpu_layers = 0")
        return
    model = _read_model(inst.model)
    if model is None:
        report.skipped("vram", "model file not readable here")
        return
    if isinstance(inst.gpu_layers, int) and inst.gpu_layers < model.block_count:
        # A partial offload is a split the user chose; the budget below assumes every layer.
        report.skipped("vram", f"partial offload (gpu_layers = {inst.gpu_layers})")
        return
    draft = _read_model(inst.speculative.draft_model) if inst.speculative.enabled else None
    context = inst.context or model.context_length or 4096
    budget = vram_breakdown(
        model,
        draft,
        context,
        inst.parallel or 1,
        inst.cache_type_k,
        inst.cache_type_v,
        inst.ubatch,
    )
    memory = gpu_memory_bytes(gpu)
    gib = 1 << 30
    detail = (
        f"weights {budget.weights / gib:.1f} GiB + draft {budget.draft_weights / gib:.1f}"
        f" + KV cache {(budget.kv_cache + budget.draft_kv_cache) / gib:.1f}"
        f" (context {context})"
        + (
            f" + recurrent state {budget.recurrent_state / gib:.2f}"
            if budget.recurrent_state
            else ""
        )
        + f" + margin {budget.compute_margin / gib:.1f}"
        f" = {budget.total / gib:.1f} GiB on a {gpu.memory_gib:g} GiB {gpu.label}"
    )
    if budget.total > memory:
        report.ran("vram", "finding")
        report.add(
            "error",
            "vram",
            inst.name,
            f"does not fit: {detail}",
            'lower context, quantize the KV cache (cache_type_k/v = "q8_0"), '
            "use a smaller quantization, or offload fewer layers",
        )
    elif budget.total > memory * VRAM_WARN_SHARE:
        report.ran("vram", "finding")
        report.add(
            "warning",
            "vram",
            inst.name,
            f"barely fits: {detail}",
            "leave headroom: lower context or quantize the KV cache",
        )
    else:
        report.ran("vram")


def check_hybrid(report: Report, inst: Instance) -> None:
    if not inst.speculative.enabled:
        return
    model = _read_model(inst.model)
    if model is None:
        report.skipped("hybrid", "model file not readable here")
        return
    variant = VARIANTS[inst.variant]
    if not model.is_recurrent or variant.dialect.hybrid_spec_checkpoints:
        report.ran("hybrid")
        return
    able = [v.name for v in VARIANTS.values() if v.dialect.hybrid_spec_checkpoints]
    report.ran("hybrid", "finding")
    report.add(
        "error",
        "hybrid-no-checkpoint",
        inst.name,
        f"{model.architecture} has {model.recurrent_layers} recurrent layers; the "
        f"{variant.name} variant cannot checkpoint them, so it refuses speculation "
        "('speculative decoding not supported by this context') and the draft sits idle",
        f"switch variant to one that checkpoints ({', '.join(able)}) "
        'or set speculative.type = "none"',
    )


def _flag_value(argv: Sequence[str], *names: str) -> str | None:
    """The last value given for any of ``names`` (llama-server lets a later flag win)."""
    value = None
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                value = argv[i + 1]
            elif arg.startswith(name + "="):
                value = arg.split("=", 1)[1]
    return value


def flash_attn_off(argv: Sequence[str]) -> bool:
    """Does this command line turn flash attention off (``-fa off``, ik's ``-no-fa``)?"""
    if "-no-fa" in argv or "--no-flash-attn" in argv:
        return True
    return _flag_value(argv, "-fa", "--flash-attn") in ("off", "0", "false", "disabled")


def check_flash_attn(
    report: Report, inst: Instance, argv: Sequence[str], log: ServerLog | None
) -> None:
    """A quantized V cache needs flash attention; judged on the exact rendered command line."""
    v = _flag_value(argv, "-ctv", "--cache-type-v") or inst.cache_type_v or "f16"
    k = _flag_value(argv, "-ctk", "--cache-type-k") or inst.cache_type_k or "f16"
    refused_in_log = log is not None and log.v_quant_needs_fa
    if (v not in _QUANTIZED_FREE and flash_attn_off(argv)) or refused_in_log:
        report.ran("flash-attn", "finding")
        report.add(
            "error",
            "quantized-v-without-fa",
            inst.name,
            f"the V cache is quantized ({v}) but flash attention is off: "
            "llama-server refuses to start ('quantized V cache requires flash_attn')",
            'set flash_attn = "on" (or "auto") and drop -fa off from extra_args, '
            'or use cache_type_v = "f16"',
        )
    else:
        report.ran("flash-attn")
    if k != v and (k not in _QUANTIZED_FREE or v not in _QUANTIZED_FREE):
        report.ran("kv-pair", "finding")
        report.add(
            "warning",
            "kv-type-pair",
            inst.name,
            f"K cache {k} with V cache {v}: CUDA builds only carry flash-attention "
            "kernels for matching pairs, so this pair runs attention on the CPU",
            "use the same type for both, or build with GGML_CUDA_FA_ALL_QUANTS=ON "
            "(GGML_CUDA_FA_QUANTS=all on current master)",
        )


def check_cuda_arch(
    report: Report,
    inst: Instance,
    host: Host,
    gpu: Gpu | None,
    smi: list[SmiGpu] | None,
    log: ServerLog | None,
) -> None:
    capabilities: list[tuple[str, str]] = []
    if smi:
        capabilities = [(g.name, g.compute_capability) for g in smi]
    elif log is not None and any(d.compute_capability for d in log.cuda_devices):
        # The model-load line names a card without its capability ("").
        capabilities = [
            (d.name, d.compute_capability) for d in log.cuda_devices if d.compute_capability
        ]
    elif gpu is not None:
        capabilities = [(gpu.label, gpu.compute_capability)]
    if not capabilities:
        report.skipped("cuda-arch", "no GPU known")
        return
    if not host.cuda_archs:
        report.skipped("cuda-arch", "hosts.cuda_archs not set")
        return
    for name, cc in capabilities:
        mismatch = arch_mismatch(name, cc, host.name, host.cuda_archs)
        if mismatch is None:
            continue
        report.ran("cuda-arch", "finding")
        report.add("warning", "cuda-arch", inst.name, mismatch.message, mismatch.fix)
        return
    report.ran("cuda-arch")


def check_server_exit(report: Report, inst: Instance, log: ServerLog | None) -> None:
    """Did the server die of its own fault (SIGILL, SIGSEGV, ...)? The journal says so."""
    if log is None:
        report.skipped("server-exit", "no log (--log or --journal)")
        return
    if log.killed_by is None or log.killed_by not in FAULT_SIGNALS:
        report.ran("server-exit")
        return
    report.ran("server-exit", "finding")
    died = died_of(log.killed_by)
    message, _, fix = died.partition("; ")
    report.add(
        "error",
        "server-killed",
        inst.name,
        message,
        fix or "read the log's last lines before the signal; report it with the build's commit",
    )


def check_speculation(report: Report, inst: Instance, inputs: Inputs) -> None:
    requested = inst.speculative.enabled
    if inputs.log is not None:
        _speculation_from_log(report, inst, inputs.log, requested)
    if inputs.probe is not None:
        _speculation_from_probe(report, inst, inputs.probe, requested)
    if inputs.benches:
        check_bench_pays(report, inst, inputs.benches)
        check_crossover(report, inst, inputs.benches, inputs.avg_output_tokens)
    if inputs.workloads:
        check_workloads(report, inst, inputs.workloads)


def _speculation_from_log(report: Report, inst: Instance, log: ServerLog, requested: bool) -> None:
    """What the server's log says of speculation: the vocabularies, a failed start, the draft
    refused or not drafting, the acceptance over its requests."""
    if log.vocab_incompatible:
        report.ran("vocab", "finding")
        report.add(
            "error",
            "vocab-mismatch",
            inst.name,
            "the log says the target and draft vocabularies are not compatible"
            + (f" ({log.spec_init_error})" if log.spec_init_error else ""),
            "use a draft with the target's tokenizer",
        )
    elif log.spec_init_error:
        report.ran("spec-log", "finding")
        report.add(
            "error",
            "spec-init-failed",
            inst.name,
            f"speculative decoding failed to start: {log.spec_init_error}",
            "read the log around that line; fix the draft settings",
        )
    if log.spec_refused and (requested or log.draft_loaded):
        report.ran("spec-log", "finding")
        report.add(
            "error",
            "spec-refused",
            inst.name,
            "speculation was requested but the server refused it at start-up "
            "('speculative decoding not supported by this context'): the draft is "
            "loaded into memory and never used",
            "use a variant that checkpoints recurrent models (upstream, mtp, ik) "
            'or set speculative.type = "none" to free the draft\'s memory',
        )
    elif log.draft_loaded and not log.drafted and log.eval_timings:
        report.ran("spec-log", "finding")
        report.add(
            "error",
            "spec-not-drafting",
            inst.name,
            f"the draft model ({log.draft_model}) is loaded but "
            f"{len(log.eval_timings)} requests drafted nothing",
            "upstream needs --spec-type draft-simple besides the draft model: set "
            'speculative.type = "draft" (llamanix renders it), or drop the draft',
        )
    else:
        report.ran("spec-log")
    rate = log.overall_acceptance()
    if rate is not None and rate < MIN_ACCEPTANCE:
        report.ran("acceptance", "finding")
        report.add(
            "warning",
            "spec-low-acceptance",
            inst.name,
            f"the log shows draft acceptance {rate:.0%} (below "
            f"{MIN_ACCEPTANCE:.0%}): drafting costs more than it saves",
            "use a draft closer to the target (same family, bigger), raise "
            "speculative.p_min, or turn speculation off",
        )


def _speculation_from_probe(report: Report, inst: Instance, probe: Probe, requested: bool) -> None:
    """What a probe completion's timings say of speculation: drafting, and its acceptance."""
    # A self-speculating type (n-gram, suffix: no drafter) drafts only where the text repeats
    # something it has seen: a short probe that drafted nothing says nothing against it.
    self_speculating = not any(t in SPEC_DRAFTERS for t in inst.speculative.types)
    if requested and not probe.draft_n and not self_speculating:
        report.ran("spec-probe", "finding")
        report.add(
            "error",
            "spec-not-drafting",
            inst.name,
            f"speculation is configured ({inst.speculative.type}) but a "
            f"{PROBE_TOKENS}-token completion drafted nothing (no draft_n in timings)",
            "check the log for a refusal; on upstream the draft needs "
            "--spec-type (speculative.type); lower speculative.p_min",
        )
    else:
        report.ran("spec-probe")
    rate = probe.acceptance
    if rate is not None and rate < MIN_ACCEPTANCE:
        report.ran("acceptance", "finding")
        report.add(
            "warning",
            "spec-low-acceptance",
            inst.name,
            f"a probe completion kept {probe.draft_n_accepted} of {probe.draft_n} "
            f"drafted tokens ({rate:.0%}, below {MIN_ACCEPTANCE:.0%})",
            "use a draft closer to the target (same family), raise "
            "speculative.p_min, or turn speculation off",
        )
    elif rate is not None:
        report.ran("acceptance")


_WORKLOAD_FINDINGS: dict[str, tuple[Severity, FindingCode, str]] = {
    "costs": (
        "warning",
        "spec-workload-costs",
        "turn speculation off for these requests (a second instance without it), or make "
        "drafting rarer (a higher p_min, a longer n-gram match)",
    ),
    "unclear": (
        "info",
        "spec-workload-unclear",
        "measure more prompts of this workload before deciding",
    ),
    "pays": ("info", "spec-workload-pays", "nothing to change for this workload"),
}


def check_workloads(report: Report, inst: Instance, workloads: Sequence[WorkloadFigures]) -> None:
    """Per workload: the acceptance the server's counters show, and against a baseline the
    speed-up with its interval; a workload where speculation costs is a warning."""
    label = inst.speculative.label if inst.speculative.enabled else "no speculation"
    costs = False
    for figures in workloads:
        verdict = figures.verdict
        if verdict is None:
            report.findings.append(
                Finding(
                    "info",
                    "spec-workload-unclear",
                    inst.name,
                    figures.sentence(label),
                    "pass --baseline-url (the same model without speculation) to see "
                    "whether it pays",
                )
            )
            continue
        severity, code, fix = _WORKLOAD_FINDINGS[verdict]
        costs = costs or verdict == "costs"
        # One finding per workload: Report.add would keep only the first of a code.
        report.findings.append(Finding(severity, code, inst.name, figures.sentence(label), fix))
    report.ran("spec-workloads", "finding" if costs else "ok")


def _drafted(result: BenchResult) -> bool:
    return any(q.draft_n for run in result.runs for q in run.requests)


def check_bench_pays(report: Report, inst: Instance, benches: Sequence[BenchResult]) -> None:
    """Speculative results against baseline ones, prompt x length, by median decode tok/s."""
    spec = [b for b in benches if _drafted(b)]
    base = [b for b in benches if not _drafted(b)]
    if not spec or not base:
        report.skipped("spec-bench", "needs a speculative and a baseline bench result")
        return
    slower: list[str] = []
    for s in spec:
        for b in base:
            for row in s.summaries:
                other = next(
                    (
                        x
                        for x in b.summaries
                        if (x.prompt, x.max_tokens) == (row.prompt, row.max_tokens)
                    ),
                    None,
                )
                mine = row.stats.get("server_decode_tok_s")
                theirs = other.stats.get("server_decode_tok_s") if other else None
                if mine is None or theirs is None:
                    continue
                if mine.median < theirs.median and not mine.overlaps(theirs):
                    slower.append(
                        f"{row.prompt}/{row.max_tokens}: {mine.median:.1f} vs "
                        f"{theirs.median:.1f} tok/s ({s.label} vs {b.label})"
                    )
    if not slower:
        report.ran("spec-bench")
        return
    report.ran("spec-bench", "finding")
    report.add(
        "warning",
        "spec-slower",
        inst.name,
        "speculative decoding is slower than the baseline: "
        + "; ".join(slower[:4])
        + (f" (+{len(slower) - 4} more)" if len(slower) > 4 else ""),
        "turn speculation off, or try a smaller/closer draft, n_max and p_min",
    )


def _loses_at(c: PromptCrossover, tokens: float) -> bool:
    x = c.crossover
    if x.outcome == "never":
        return True
    if x.outcome == "above":
        return x.tokens is not None and tokens < x.tokens
    if x.outcome == "below":
        return x.tokens is not None and tokens > x.tokens
    return False


def _crossover_phrase(c: PromptCrossover) -> str:
    x = c.crossover
    where = f"{c.prompt}, {c.candidate} vs {c.baseline}"
    if x.outcome == "above":
        return f"speculation pays only above {x.tokens:.0f} output tokens ({where})"
    if x.outcome == "below":
        return f"speculation wins only below {x.tokens:.0f} output tokens ({where})"
    if x.outcome == "never":
        return f"speculation never pays on wall clock ({where})"
    return f"speculation wins at every output length ({where})"


def check_crossover(
    report: Report,
    inst: Instance,
    benches: Sequence[BenchResult],
    avg_output_tokens: float | None,
) -> None:
    """The output length from which speculation wins on wall clock, against the length the
    requests average: speculation that decodes faster but costs more up front loses on short
    answers (MTP on a 27B model was reported to beat plain decoding only above about 900 output
    tokens)."""
    spec = [b for b in benches if _drafted(b)]
    base = [b for b in benches if not _drafted(b)]
    found = [c for s in spec for b in base for c in prompt_crossovers(b, s)]
    if not found:
        report.skipped(
            "spec-crossover",
            "needs a speculative and a baseline result swept over two or more --max-tokens",
        )
        return
    if avg_output_tokens is not None:
        average = avg_output_tokens
        said = f"your requests average {average:.0f}"
    else:
        generated = [q.predicted_n for b in spec for r in b.runs for q in r.requests]
        counts = [n for n in generated if n is not None]
        average = sum(counts) / len(counts) if counts else 0.0
        said = (
            f"the benched requests average {average:.0f} (pass --avg-output-tokens "
            "for what yours average)"
        )
    losing = [c for c in found if _loses_at(c, average)]
    if losing:
        report.ran("spec-crossover", "finding")
        report.add(
            "warning",
            "spec-crossover",
            inst.name,
            "; ".join(_crossover_phrase(c) for c in losing[:3])
            + (f" (+{len(losing) - 3} more)" if len(losing) > 3 else "")
            + f"; {said}",
            "turn speculation off for this workload, or lower its fixed cost (smaller "
            "draft, fewer drafted tokens); it pays for long answers only",
        )
        return
    report.ran("spec-crossover")
    report.add(
        "info",
        "spec-crossover",
        inst.name,
        f"{_crossover_phrase(found[0])}; {said}: it pays",
        "nothing to change; re-check when the typical answer length changes",
    )


def instance_gpu(
    config: Config, host: Host, override: str | None, smi: list[SmiGpu] | None
) -> Gpu | None:
    if override:
        return find_gpu(override, "llamanix doctor")
    if host.gpu:
        return find_gpu(host.gpu, config.source, f"hosts.{host.name}.gpu")
    if smi:
        try:
            return find_gpu(smi[0].name, "nvidia-smi", "name")
        except UserError:
            return None
    return None


def diagnose(
    config: Config,
    names: Sequence[str],
    per_instance: dict[str, Inputs],
    gpu_override: str | None = None,
    smi: list[SmiGpu] | None = None,
) -> Report:
    report = Report(instances=tuple(names))
    for name in names:
        inst = config.instances[name]
        host = config.host_of(inst)
        inputs = per_instance.get(name, Inputs())
        local = host.target is None
        gpu = instance_gpu(config, host, gpu_override, smi if local else None)
        check_server_exit(report, inst, inputs.log)
        check_key_file(report, config, inst)
        check_vocab(report, inst)
        check_chat_template(report, inst)
        check_vram(report, inst, gpu)
        check_hybrid(report, inst)
        check_flash_attn(report, inst, instance_argv(config, name), inputs.log)
        check_cuda_arch(report, inst, host, gpu, smi if local else None, inputs.log)
        check_speculation(report, inst, inputs)
    return report
