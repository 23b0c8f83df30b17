"""What a llama-server log says: timings, draft acceptance, and speculation's fate at start-up.

The patterns match every variant: upstream master prefixes per-request lines with
``slot print_timing: id N | task M |``, nixpkgs b8770 and ik print them bare, journald may put
its own prefix in front, so nothing is anchored at the start of a line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import ClassVar

from llamanix.core.json_codec import JsonRecord, JsonShape

_NUM = r"([0-9]+(?:\.[0-9]+)?)"
_SLOT = re.compile(r"id\s+(\d+)\s*\|\s*task\s+(-?\d+)\s*\|")
_PROMPT_EVAL = re.compile(
    rf"prompt eval time =\s*{_NUM} ms /\s*(\d+) tokens "
    rf"\(\s*{_NUM} ms per token,\s*{_NUM} tokens per second\)"
)
# "eval time" but not "prompt eval time"
_EVAL = re.compile(
    rf"(?<!prompt )eval time =\s*{_NUM} ms /\s*(\d+) (?:tokens|runs)\s*"
    rf"\(\s*{_NUM} ms per token,\s*{_NUM} tokens per second\)"
)
# master: "draft acceptance = 1.00000 (   56 accepted /    56 generated), mean len =  9.00"
# b8770 / ik: "draft acceptance rate = 0.57576 (   19 accepted /    33 generated)"
_ACCEPTANCE = re.compile(
    rf"draft acceptance(?: rate)? =\s*{_NUM}\s*"
    rf"\(\s*(\d+)(?: accepted)?\s*/\s*(\d+)(?: generated)?\s*\)"
    rf"(?:,\s*mean len =\s*{_NUM})?"
)
_SPEC_STATS = re.compile(r"#gen tokens =\s*(\d+),\s*#acc tokens =\s*(\d+)")
SPEC_REFUSED = "speculative decoding not supported by this context"
SPEC_INITIALIZED = "speculative decoding context initialized"
SPEC_CHECKPOINTS = "speculative decoding will use checkpoints"
_DRAFT_LOADING = re.compile(r"loading draft model\s*'([^']*)'")
_VOCAB_INCOMPATIBLE = re.compile(
    r"vocabs are not compatible|draft model vocab (?:type )?must (?:closely )?match"
)
_SPEC_INIT_FAILED = re.compile(r"failed to initialize speculative decoding context: (.*)$")
# master: "quantized V cache requires flash_attn to be enabled"; ik: "V cache quantization
# requires flash_attn"
_V_QUANT_NEEDS_FA = re.compile(
    r"quantized V cache requires flash_attn|V cache quantization requires flash_attn"
)
_CUDA_DEVICE = re.compile(r"Device (\d+): (.+?), compute capability (\d+)\.(\d+)")
# "llama_model_load_from_file_impl: using device CUDA0 (NVIDIA H200) (0000:00:06.0) - 143138
# MiB free", at model load. The pinned upstream (0.5.0-dev) enumerates the devices while it
# parses its arguments, before -lv takes effect, so on a real GPU (an H200, docs/gpu.md) its
# log held no "Device N: ..." line at all: this one is then the only place the card is named,
# without its compute capability.
_USING_CUDA_DEVICE = re.compile(r"using device CUDA(\d+) \((.+?)\) \([^)]*\) - \d+ MiB free")
# "llama_kv_cache:      CUDA0 KV buffer size =  8192.00 MiB", "load_tensors: CPU_Mapped model
# buffer size = 8.44 MiB" (printed at -lv 4 and above in master)
_KV_BUFFER = re.compile(r"\bKV buffer size =\s*([0-9.]+) MiB")
_MODEL_BUFFER = re.compile(r"\bmodel buffer size =\s*([0-9.]+) MiB")
_OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
# master: "build 0 (0c1e570) with GNU 12.2.0 for Linux x86_64"; older: "build: 8770 (abc1234) with"
_BUILD = re.compile(r"\bbuild:?\s+(\S+)\s+\(([0-9a-fA-F]+|unknown)\)\s+with")
# systemd's own line in the unit's journal when the main process ends by a signal:
# "llamanix-chat.service: Main process exited, code=dumped, status=4/ILL"
_KILLED = re.compile(r"Main process exited, code=(?:killed|dumped), status=(\d+)/")


@dataclass(frozen=True)
class Timing:
    """One ``prompt eval time`` or ``eval time`` line."""

    ms: float
    tokens: int
    ms_per_token: float
    tok_s: float
    slot: int | None = None
    task: int | None = None


@dataclass(frozen=True)
class Acceptance:
    """One ``draft acceptance`` line: the share of drafted tokens the target kept."""

    rate: float
    accepted: int
    generated: int
    mean_len: float | None = None
    slot: int | None = None
    task: int | None = None


@dataclass(frozen=True)
class CudaDevice:
    """A CUDA device the server named; ``compute_capability`` is "" where its line gives none
    (the model-load line), to be read from nvidia-smi."""

    index: int
    name: str
    compute_capability: str


@dataclass
class ServerLog(JsonRecord):
    """Everything recognised in one log; written with the acceptance figures that follow from
    the fields."""

    prompt_timings: list[Timing] = field(default_factory=list)
    eval_timings: list[Timing] = field(default_factory=list)
    acceptances: list[Acceptance] = field(default_factory=list)
    spec_refused: bool = False
    spec_initialized: bool = False
    spec_checkpoints: bool = False
    spec_init_error: str | None = None
    draft_model: str | None = None
    vocab_incompatible: bool = False
    v_quant_needs_fa: bool = False
    cuda_devices: list[CudaDevice] = field(default_factory=list)
    layers_offloaded: tuple[int, int] | None = None
    kv_buffer_mib: float = 0.0
    model_buffer_mib: float = 0.0
    build: str | None = None
    spec_generated_tokens: int | None = None
    spec_accepted_tokens: int | None = None
    # The signal that last ended the server, where the log shows one (the journal does).
    killed_by: int | None = None
    lines: int = 0

    json_shape: ClassVar[JsonShape] = JsonShape(
        computed={
            "draft_loaded": lambda log: log.draft_loaded,
            "drafted": lambda log: log.drafted,
            "overall_acceptance": lambda log: log.overall_acceptance(),
        }
    )

    @property
    def draft_loaded(self) -> bool:
        return self.draft_model is not None

    @property
    def drafted(self) -> bool:
        """Did any request draft at all?"""
        return any(a.generated > 0 for a in self.acceptances) or bool(self.spec_generated_tokens)

    def overall_acceptance(self) -> float | None:
        accepted = sum(a.accepted for a in self.acceptances)
        generated = sum(a.generated for a in self.acceptances)
        if generated == 0 and self.spec_generated_tokens:
            generated = self.spec_generated_tokens
            accepted = self.spec_accepted_tokens or 0
        return accepted / generated if generated else None


def _slot(line: str) -> tuple[int | None, int | None]:
    match = _SLOT.search(line)
    return (int(match.group(1)), int(match.group(2))) if match else (None, None)


def _timing(match: re.Match[str], line: str) -> Timing:
    slot, task = _slot(line)
    return Timing(
        ms=float(match.group(1)),
        tokens=int(match.group(2)),
        ms_per_token=float(match.group(3)),
        tok_s=float(match.group(4)),
        slot=slot,
        task=task,
    )


def parse_line(log: ServerLog, line: str) -> None:
    """Fold one log line into ``log``."""
    log.lines += 1
    if match := _PROMPT_EVAL.search(line):
        log.prompt_timings.append(_timing(match, line))
    elif match := _EVAL.search(line):
        log.eval_timings.append(_timing(match, line))
    elif match := _ACCEPTANCE.search(line):
        slot, task = _slot(line)
        log.acceptances.append(
            Acceptance(
                rate=float(match.group(1)),
                accepted=int(match.group(2)),
                generated=int(match.group(3)),
                mean_len=float(match.group(4)) if match.group(4) else None,
                slot=slot,
                task=task,
            )
        )
    elif match := _SPEC_STATS.search(line):
        log.spec_generated_tokens = int(match.group(1))
        log.spec_accepted_tokens = int(match.group(2))
    elif SPEC_REFUSED in line:
        log.spec_refused = True
    elif SPEC_INITIALIZED in line:
        log.spec_initialized = True
    elif SPEC_CHECKPOINTS in line:
        log.spec_checkpoints = True
    elif match := _DRAFT_LOADING.search(line):
        log.draft_model = match.group(1)
    elif match := _SPEC_INIT_FAILED.search(line):
        log.spec_init_error = match.group(1).strip()
        if _VOCAB_INCOMPATIBLE.search(line):
            log.vocab_incompatible = True
    elif _VOCAB_INCOMPATIBLE.search(line):
        log.vocab_incompatible = True
    elif _V_QUANT_NEEDS_FA.search(line):
        log.v_quant_needs_fa = True
    elif match := _CUDA_DEVICE.search(line):
        log.cuda_devices.append(
            CudaDevice(
                index=int(match.group(1)),
                name=match.group(2).strip(),
                compute_capability=f"{match.group(3)}.{match.group(4)}",
            )
        )
    elif match := _USING_CUDA_DEVICE.search(line):
        index = int(match.group(1))
        if all(d.index != index for d in log.cuda_devices):
            log.cuda_devices.append(CudaDevice(index, match.group(2).strip(), ""))
    elif match := _KV_BUFFER.search(line):
        log.kv_buffer_mib += float(match.group(1))
    elif match := _MODEL_BUFFER.search(line):
        log.model_buffer_mib += float(match.group(1))
    elif match := _OFFLOADED.search(line):
        log.layers_offloaded = (int(match.group(1)), int(match.group(2)))
    elif match := _KILLED.search(line):
        log.killed_by = int(match.group(1))
    elif (match := _BUILD.search(line)) and log.build is None:
        log.build = f"{match.group(1)} ({match.group(2)})"


def parse_server_log(text: str) -> ServerLog:
    """Parse a whole log (a saved file or ``journalctl -o cat`` output)."""
    log = ServerLog()
    for line in text.splitlines():
        parse_line(log, line)
    return log
