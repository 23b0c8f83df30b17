"""Is a CUDA llama-server really using the GPU, with machine code built for it?

Three silent ways a CUDA build disappoints, each read from something the build or the server
says about itself:

- The card is not used: no ``ggml_cuda_init`` device line, or ``offloaded N/M layers`` with
  N < M (the rest runs on the CPU).
- The CUDA library carries no SASS (machine code) for the card's compute capability, only PTX:
  the driver JIT-compiles every kernel on first use: an RTX 5090 user reported a first prefill
  of 33 s for 24 tokens with a build that stopped at sm_90.
  ``cuobjdump --list-elf`` names every cubin in the library (``ELF file    1:
  libggml-cuda.1.sm_86.cubin``).
- The JIT tell: the first request far slower than the same request repeated.

The verdicts are plain functions of text (a log, cuobjdump's output) so they are tested on
recorded output; the one external command has its own thin wrapper.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from llamanix.core.json_codec import JsonRecord
from llamanix.external.nvidia import CUOBJDUMP, cuobjdump_list_elf
from llamanix.server.server_log import CudaDevice

Status = Literal["pass", "fail", "skip"]
NOT_CUDA = "not a CUDA build"
_ELF_LINE = re.compile(r"^\s*ELF file\s+\d+:\s*(\S+)\s*$")
# "libggml-cuda.3.sm_120a.cubin": the arch is the last sm_ field of the cubin's name.
_SM = re.compile(r"\bsm_(\d{2,3})([af]?)\.cubin$")
_CUDA_FOUND = re.compile(r"ggml_cuda_init: found (\d+) CUDA devices")
_CUDA_FAILED = re.compile(r"ggml_cuda_init: failed to initialize CUDA: (.*)$", re.MULTILINE)
# GGML_BACKEND_DL builds load the backend at run time and say from where.
_CUDA_LOADED = re.compile(r"loaded CUDA backend from (\S+)")
_OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
_CUDA_MARKERS = ("ggml_cuda_init", "loaded CUDA backend", "CUDA0")
CUDA_LIBRARY_GLOB = "libggml-cuda.so*"
# The JIT tell. A PTX JIT of llama.cpp's kernels costs tens of seconds (33 s in the field
# report) while a first request's honest extra work (cuBLAS handles, CUDA graph capture,
# buffer growth) stays well under a second. Both conditions must hold: the ratio alone would
# flag 30 ms against 5 ms on a tiny model, the difference alone a slow big model.
JIT_RATIO = 5.0
JIT_MIN_EXTRA_S = 2.0


@dataclass(frozen=True)
class Check(JsonRecord):
    """One smoke check: its name, pass/fail/skip, and what was seen."""

    name: str
    status: Status
    detail: str


# --- compute capabilities and cubin architectures -------------------------------------------


def parse_compute_capability(text: str) -> tuple[int, int] | None:
    """``"12.0"`` -> (12, 0); also accepts cudaArchs spellings like ``"12.0a"``."""
    match = re.fullmatch(r"\s*(\d+)\.(\d+)[af]?\s*", text)
    return (int(match.group(1)), int(match.group(2))) if match else None


@dataclass(frozen=True)
class SassArch:
    """The target of one cubin: ``sm_86``, ``sm_120a`` (arch-specific), ``sm_100f`` (family)."""

    major: int
    minor: int
    suffix: str = ""

    @property
    def name(self) -> str:
        return f"sm_{self.major}{self.minor}{self.suffix}"

    @property
    def compute_capability(self) -> str:
        return f"{self.major}.{self.minor}"

    def runs_on(self, cc: tuple[int, int]) -> bool:
        """Whether the driver can run this cubin as is on a card of compute capability ``cc``.

        NVIDIA's rule: a cubin for X.y runs on X.z for z >= y; an arch-specific one (``a``)
        only on exactly X.y; a family one (``f``) on the later members of its family, which
        share the major version.
        """
        if self.suffix == "a":
            return (self.major, self.minor) == cc
        return self.major == cc[0] and cc[1] >= self.minor


def parse_list_elf(text: str) -> list[SassArch]:
    """The cubin architectures in ``cuobjdump --list-elf`` output, in order, each once."""
    out: list[SassArch] = []
    for line in text.splitlines():
        line_match = _ELF_LINE.match(line)
        if not line_match:
            continue
        sm = _SM.search(line_match.group(1))
        if not sm:
            continue
        digits = sm.group(1)
        arch = SassArch(int(digits[:-1]), int(digits[-1]), sm.group(2))
        if arch not in out:
            out.append(arch)
    return out


def judge_sass(archs: list[SassArch], compute_capability: str, library: Path) -> Check:
    """Pass when some cubin runs natively on the card; else the PTX JIT warning as a failure."""
    cc = parse_compute_capability(compute_capability)
    if cc is None:
        return Check("sass", "skip", f"unreadable compute capability {compute_capability!r}")
    sm = f"sm_{cc[0]}{cc[1]}"
    have = ", ".join(a.name for a in archs) or "none"
    exact = [a for a in archs if (a.major, a.minor) == cc]
    if exact:
        return Check(
            "sass",
            "pass",
            f"{library.name} has {exact[0].name} for compute "
            f"capability {compute_capability} (cubins: {have})",
        )
    compatible = [a for a in archs if a.runs_on(cc)]
    if compatible:
        best = max(compatible, key=lambda a: a.minor)
        return Check(
            "sass",
            "pass",
            f"{library.name} has {best.name}, which runs on compute capability "
            f"{compute_capability} (same major version); cubins: {have}",
        )
    return Check(
        "sass",
        "fail",
        f"no SASS for {sm}: kernels will be JIT-compiled from PTX on first use "
        f"(rebuild with cudaArchs including {compute_capability}); {library.name} "
        f"has cubins for: {have}",
    )


def find_cuda_library(binary: Path, log_text: str = "") -> Path:
    """The file holding the CUDA kernels: the library the log says it loaded, a
    ``libggml-cuda.so*`` next to the binary or in ``../lib`` (shared builds, Nix's layout), or
    else the binary itself (static builds link the kernels in)."""
    loaded = _CUDA_LOADED.search(log_text)
    if loaded and Path(loaded.group(1)).is_file():
        return Path(loaded.group(1))
    for exe in dict.fromkeys((binary, binary.resolve())):
        for folder in (exe.parent, exe.parent.parent / "lib", exe.parent.parent / "lib64"):
            found = sorted(p for p in folder.glob(CUDA_LIBRARY_GLOB) if p.is_file())
            if found:
                return found[0].resolve()
    return binary.resolve()


def check_sass(library: Path, compute_capabilities: list[str]) -> Check:
    if not compute_capabilities:
        return Check(
            "sass",
            "skip",
            "compute capability unknown: no device line in the log and no nvidia-smi",
        )
    output = cuobjdump_list_elf(library)
    if output is None:
        return Check("sass", "skip", f"{CUOBJDUMP} not found (it ships with the CUDA toolkit)")
    archs = parse_list_elf(output)
    if not archs:
        return Check(
            "sass",
            "fail",
            f"{library} carries no SASS at all (cuobjdump --list-elf "
            "lists no cubin): every kernel is JIT-compiled from PTX",
        )
    checks = [judge_sass(archs, cc, library) for cc in dict.fromkeys(compute_capabilities)]
    failed = [c for c in checks if c.status == "fail"]
    return failed[0] if failed else checks[0]


# --- what the log says ------------------------------------------------------------------------


def is_cuda_build(text: str) -> bool:
    """Whether a log (or ``--version`` output) comes from a build with the CUDA backend."""
    return any(marker in text for marker in _CUDA_MARKERS)


def check_device(text: str, devices: list[CudaDevice]) -> Check:
    """The CUDA backend initialised and named at least one card."""
    failed = _CUDA_FAILED.search(text)
    if failed:
        return Check(
            "cuda-device",
            "fail",
            f"CUDA build, but CUDA did not initialise: {failed.group(1).strip()}",
        )
    found = _CUDA_FOUND.search(text)
    if found and int(found.group(1)) == 0:
        return Check("cuda-device", "fail", "CUDA build, but ggml_cuda_init found 0 devices")
    if not devices:
        return Check(
            "cuda-device",
            "fail",
            "CUDA build, but no 'Device N: NAME, compute capability X.Y' or 'using device "
            "CUDAN (NAME)' line in the log: the GPU was not initialised (or the log level "
            "hides it)",
        )
    named = "; ".join(
        f"device {d.index}: {d.name}, compute capability {d.compute_capability or 'unknown'}"
        for d in devices
    )
    return Check("cuda-device", "pass", named)


def offload_counts(log_text: str) -> list[tuple[int, int]]:
    """Every ``offloaded N/M layers to GPU`` line: the target's, then a draft model's."""
    return [(int(m.group(1)), int(m.group(2))) for m in _OFFLOADED.finditer(log_text)]


def check_offload(counts: list[tuple[int, int]]) -> Check:
    if not counts:
        return Check(
            "gpu-offload",
            "fail",
            "no 'offloaded N/M layers to GPU' line in the log: the model was not "
            "offloaded (or the log level hides it)",
        )
    shown = ", ".join(f"{n}/{m}" for n, m in counts)
    partial = [(n, m) for n, m in counts if n < m]
    if partial:
        n, m = partial[0]
        return Check(
            "gpu-offload",
            "fail",
            f"only {n}/{m} layers offloaded to the GPU: the rest run on the CPU "
            f"(all: {shown}); check gpu_layers and free VRAM",
        )
    return Check("gpu-offload", "pass", f"layers offloaded: {shown}")


def check_jit(first_s: float | None, second_s: float | None, cuda: bool) -> Check:
    """First request against the identical second: a PTX JIT shows as a far slower first."""
    if first_s is None or second_s is None:
        return Check("jit", "skip", "no two completed requests to compare")
    figures = (
        f"first request {first_s * 1000:.0f} ms to first token, second {second_s * 1000:.0f} ms"
    )
    if not cuda:
        return Check("jit", "skip", f"{NOT_CUDA} ({figures})")
    if first_s > JIT_RATIO * second_s and first_s - second_s > JIT_MIN_EXTRA_S:
        return Check(
            "jit",
            "fail",
            f"{figures}: more than {JIT_RATIO:g}x and {JIT_MIN_EXTRA_S:g} s slower, "
            "the sign of kernels JIT-compiled from PTX (see the sass check)",
        )
    return Check("jit", "pass", figures)


__all__ = [
    "NOT_CUDA",
    "Check",
    "SassArch",
    "check_device",
    "check_jit",
    "check_offload",
    "check_sass",
    "find_cuda_library",
    "is_cuda_build",
    "judge_sass",
    "offload_counts",
    "parse_compute_capability",
    "parse_list_elf",
]
