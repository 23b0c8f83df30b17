"""llamanix smoke: the real CPU llama-server passes, real breakages fail, and the CUDA checks
judge recorded logs and cuobjdump output.

The server tests run the real command (``python -m llamanix smoke``) against the real binary.
No GPU and no CUDA toolkit exist here, so cuobjdump and nvidia-smi are stand-in scripts on PATH
that record their argv and replay output written from the documented formats
(tests/data/README.md says which files are written by hand).
"""

from __future__ import annotations

import json
import os
import stat
import sys
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from cli_run import invoke, run_llamanix
from click.testing import Result
from standins import recorded_argv, stand_in

from llamanix.diagnose.cuda_check import (
    JIT_MIN_EXTRA_S,
    SassArch,
    check_device,
    check_jit,
    check_offload,
    check_sass,
    is_cuda_build,
    judge_sass,
    offload_counts,
    parse_list_elf,
)
from llamanix.diagnose.smoke import CHECK_ORDER, gpu_checks
from llamanix.external.nvidia import list_elf_argv
from llamanix.server.server_log import parse_server_log
from llamanix.testbed.synth import SynthSpec, synth_model

if TYPE_CHECKING:
    from conftest import SynthModels

DATA = Path(__file__).parent / "data"
GPU_CHECKS = ("cuda-device", "gpu-offload", "sass", "jit")
SERVED_CHECKS = ("start", "health", "chat", "metrics", "decode")
TOKENS = "16"


# The real command, as CI and the Nix GPU test run it.
smoke_process = partial(run_llamanix, "check", "smoke", timeout=600)


def by_name(report: dict[str, Any]) -> dict[str, dict[str, str]]:
    return {c["name"]: c for c in report["checks"]}


def one_line(result: Result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert result.stdout == ""
    return lines[0]


# --- the real CPU server ----------------------------------------------------------------------


@pytest.mark.server
def test_cpu_build_passes_without_speculation(llama_server_bin: Path, tmp_path: Path) -> None:
    out = tmp_path / "smoke.json"
    proc = smoke_process("--binary", str(llama_server_bin), "--tokens", TOKENS, "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    checks = by_name(report)
    assert tuple(checks) == CHECK_ORDER
    assert report["ok"] is True and report["cuda"] is False and report["synthetic_model"]
    for name in SERVED_CHECKS:
        assert checks[name]["status"] == "pass", checks[name]
    assert checks["drafting"]["status"] == "skip"
    for name in GPU_CHECKS:
        assert checks[name]["status"] == "skip", checks[name]
        assert checks[name]["detail"].startswith("not a CUDA build"), checks[name]
    # The argv came from the renderer: all layers, metrics on, no speculation flags.
    argv = report["argv"]
    assert argv[0] == str(llama_server_bin)
    assert argv[argv.index("-ngl") + 1] == "all" and "--metrics" in argv
    assert "--spec-type" not in argv
    figures = report["figures"]
    assert figures["predicted_n"] == int(TOKENS) and figures["decode_tok_s"] > 0
    assert figures["draft_n"] == 0
    # Without --json the table goes to stdout as well.
    assert "gpu-offload" in proc.stdout and "not a CUDA build" in proc.stdout
    assert "smoke passed" in proc.stderr


@pytest.mark.server
def test_cpu_build_passes_with_a_self_draft(llama_server_bin: Path) -> None:
    proc = smoke_process(
        "--binary", str(llama_server_bin), "--spec", "draft", "--tokens", TOKENS, "--json"
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)  # --json prints the JSON alone
    checks = by_name(report)
    assert checks["drafting"]["status"] == "pass", checks["drafting"]
    assert report["figures"]["draft_n"] > 0
    assert "spec_decode_num_draft_tokens_total" in checks["drafting"]["detail"]
    argv = report["argv"]
    assert argv[argv.index("--spec-type") + 1] == "draft-simple"
    assert argv[argv.index("--spec-draft-model") + 1] == argv[argv.index("-m") + 1]
    for name in GPU_CHECKS:
        assert checks[name]["status"] == "skip"


@pytest.mark.server
def test_a_model_the_server_cannot_load_fails_with_its_reason(
    llama_server_bin: Path, vocab_dir: Path, tmp_path: Path
) -> None:
    """A vocab-only GGUF is a valid GGUF without weights: llama-server itself refuses it."""
    out = tmp_path / "smoke.json"
    proc = smoke_process(
        "--binary",
        str(llama_server_bin),
        "--model",
        str(vocab_dir / "ggml-vocab-llama-spm.gguf"),
        "-o",
        str(out),
    )
    assert proc.returncode == 1
    report = json.loads(out.read_text())
    checks = by_name(report)
    assert checks["start"]["status"] == "fail"
    assert "exited with code" in checks["start"]["detail"]
    assert "token_embd.weight" in checks["start"]["detail"]
    assert checks["chat"]["status"] == "skip" and report["log_tail"]
    assert "smoke: start: llama-server exited" in proc.stderr
    assert "smoke FAILED" in proc.stderr


@pytest.mark.server
def test_speculation_that_never_drafts_fails(
    llama_server_bin: Path, synth_models: SynthModels
) -> None:
    """The silent failure users reported: speculation configured, nothing drafted."""
    proc = smoke_process(
        "--binary",
        str(llama_server_bin),
        "--model",
        str(synth_models.unsure_target),
        "--spec",
        "draft",
        "--tokens",
        TOKENS,
        "--json",
    )
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    checks = by_name(report)
    assert checks["drafting"]["status"] == "fail"
    assert "draft_n = 0" in checks["drafting"]["detail"]
    assert report["figures"]["draft_n"] == 0
    for name in SERVED_CHECKS:
        assert checks[name]["status"] == "pass", checks[name]
    assert "smoke: drafting:" in proc.stderr


# --- refusals: one line, exit 2, nothing written ----------------------------------------------


smoke_cli = partial(invoke, "check", "smoke")


def test_mtp_without_a_model_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "smoke.json"
    result = smoke_cli("--binary", sys.executable, "--spec", "mtp", "-o", str(out))
    assert result.exit_code == 2
    line = one_line(result)
    assert "--spec mtp" in line and "MTP" in line and "--model" in line
    assert not out.exists()


def test_mtp_with_a_model_without_mtp_layers_is_refused(tmp_path: Path) -> None:
    model = synth_model(SynthSpec(seed=4), tmp_path / "plain.gguf")
    result = smoke_cli("--binary", sys.executable, "--spec", "mtp", "--model", str(model))
    assert result.exit_code == 2
    line = one_line(result)
    assert line.startswith(f"{model}: --spec mtp: ") and "no MTP (nextn) layers" in line


def test_a_model_that_is_no_gguf_is_refused(tmp_path: Path) -> None:
    model = tmp_path / "model.gguf"
    model.write_text("<html>not found</html>")
    result = smoke_cli("--binary", sys.executable, "--model", str(model))
    assert result.exit_code == 2
    assert one_line(result).startswith(f"{model}: model: not a GGUF file")


def test_a_binary_that_is_not_llama_server_is_refused(tmp_path: Path) -> None:
    other = tmp_path / "other-tool"
    other.write_text(
        '#!/bin/sh\necho "usage: other-tool [options] FILE"\necho "  -v, --verbose   more output"\n'
    )
    other.chmod(other.stat().st_mode | stat.S_IXUSR)
    result = smoke_cli("--binary", str(other))
    assert result.exit_code == 2
    assert one_line(result) == (
        f"{other}: --binary: its --help lists no --model option: not a "
        "llama-server (give the path of a llama-server binary)"
    )
    missing = smoke_cli("--binary", str(tmp_path / "nope"))
    assert missing.exit_code == 2 and "not an executable file" in one_line(missing)


def help_stand_in(tmp_path: Path, stem: str | None) -> Path:
    """A llama-server that cannot run here, as its --version and --help answered (``stem``:
    a recording under tests/data/help), or one whose --help no known dialect matches."""
    answer = tmp_path / "answer.txt"
    if stem is None:
        answer.write_text("usage: llama-server [options]\n  -m,    --model FNAME   model path\n")
    else:
        help_dir = Path(__file__).parent / "data" / "help"
        answer.write_text(
            (help_dir / f"{stem}.version.txt").read_text()
            + (help_dir / f"{stem}.help.txt").read_text()
        )
    stand_in(tmp_path / "bin", "llama-server", answer)
    return tmp_path / "bin" / "llama-server"


def test_a_binary_of_another_project_than_the_variant_is_refused(tmp_path: Path) -> None:
    ik = help_stand_in(tmp_path, "ik-8337e4cd")
    out = tmp_path / "smoke.json"
    result = smoke_cli("--binary", str(ik), "--variant", "upstream", "-o", str(out))
    assert result.exit_code == 2
    line = one_line(result)
    assert line.startswith(f"{ik}: --variant: {ik} (version ")
    assert line.endswith(
        ") answers as a build of ik_llama.cpp (its --help speaks the ik dialect), but variant "
        "upstream is ggml-org llama.cpp (smoke a build of ggml-org llama.cpp, or pass "
        "--variant ik)"
    )
    assert not out.exists()


def test_without_variant_a_binary_no_dialect_matches_is_refused(tmp_path: Path) -> None:
    other = help_stand_in(tmp_path, None)
    result = smoke_cli("--binary", str(other))
    assert result.exit_code == 2
    line = one_line(result)
    assert line.startswith(f"{other}: --variant: {other} (version ")
    assert line.endswith(") speaks no dialect llamanix knows (name its variant with --variant)")


# --- stand-ins for what needs a GPU -----------------------------------------------------------


def cuda_install(root: Path) -> tuple[Path, Path]:
    """The layout of a shared CUDA build (Nix's): bin/llama-server, lib/libggml-cuda.so."""
    (root / "bin").mkdir(parents=True)
    (root / "lib").mkdir()
    binary = root / "bin" / "llama-server"
    binary.write_bytes(b"")
    library = root / "lib" / "libggml-cuda.so"
    library.write_bytes(b"")
    return binary, library


@pytest.fixture
def tools_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty folder first on PATH for stand-ins; the real PATH has no CUDA tools here."""
    folder = tmp_path / "bin"
    folder.mkdir()
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    return folder


def read(name: str) -> str:
    return (DATA / name).read_text()


# --- cuobjdump --list-elf ---------------------------------------------------------------------


def test_list_elf_names_the_cubin_architectures() -> None:
    assert parse_list_elf(read("cuobjdump-list-elf-sm120a.txt")) == [SassArch(12, 0, "a")]
    archs = parse_list_elf(read("cuobjdump-list-elf-sm86-sm89.txt"))
    assert [a.name for a in archs] == ["sm_86", "sm_89"]
    assert [a.compute_capability for a in archs] == ["8.6", "8.9"]
    assert parse_list_elf(read("cuobjdump-list-elf-no-device-code.txt")) == []


def test_sass_for_12_0_is_present_as_sm_120a() -> None:
    archs = parse_list_elf(read("cuobjdump-list-elf-sm120a.txt"))
    check = judge_sass(archs, "12.0", Path("libggml-cuda.so"))
    assert check.status == "pass", check
    assert "sm_120a" in check.detail


def test_sass_missing_for_8_6_fails_with_the_rebuild_hint() -> None:
    archs = parse_list_elf(read("cuobjdump-list-elf-sm120a.txt"))
    check = judge_sass(archs, "8.6", Path("libggml-cuda.so"))
    assert check.status == "fail"
    assert check.detail.startswith(
        "no SASS for sm_86: kernels will be JIT-compiled from PTX on first use "
        "(rebuild with cudaArchs including 8.6)"
    )
    assert "sm_120a" in check.detail


@pytest.mark.parametrize(
    ("recording", "cc", "status"),
    [
        ("cuobjdump-list-elf-sm86-sm89.txt", "8.6", "pass"),
        ("cuobjdump-list-elf-sm86-sm89.txt", "8.9", "pass"),
        # A plain cubin runs on later minors of its major version (sm_86 on an 8.7 Orin) ...
        ("cuobjdump-list-elf-sm86-sm89.txt", "8.7", "pass"),
        # ... never on an earlier minor or another major version.
        ("cuobjdump-list-elf-sm86-sm89.txt", "8.0", "fail"),
        ("cuobjdump-list-elf-sm86-sm89.txt", "12.0", "fail"),
        # An arch-specific (a) cubin runs on exactly its own compute capability.
        ("cuobjdump-list-elf-sm120a.txt", "12.1", "fail"),
    ],
)
def test_sass_compatibility_rules(recording: str, cc: str, status: str) -> None:
    assert judge_sass(parse_list_elf(read(recording)), cc, Path("lib.so")).status == status


def test_cuobjdump_runs_with_the_exact_argv(tools_dir: Path) -> None:
    record = stand_in(tools_dir, "cuobjdump", DATA / "cuobjdump-list-elf-sm120a.txt")
    library = Path("/nix/store/x-llama-cpp/lib/libggml-cuda.so")
    check = check_sass(library, ["12.0"])
    assert (
        recorded_argv(record)
        == list_elf_argv(library)
        == ["cuobjdump", "--list-elf", "/nix/store/x-llama-cpp/lib/libggml-cuda.so"]
    )
    assert check.status == "pass", check


def test_a_file_without_device_code_fails(tools_dir: Path) -> None:
    stand_in(tools_dir, "cuobjdump", DATA / "cuobjdump-list-elf-no-device-code.txt")
    check = check_sass(Path("llama-server"), ["12.0"])
    assert check.status == "fail" and "carries no SASS at all" in check.detail


def test_without_cuobjdump_the_sass_check_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    check = check_sass(Path("libggml-cuda.so"), ["12.0"])
    assert (check.status, check.detail.split(" (")[0]) == ("skip", "cuobjdump not found")


# --- the log ----------------------------------------------------------------------------------


def test_device_line_and_full_offload_pass() -> None:
    text = read("cuda-upstream-spec.log")
    assert is_cuda_build(text)
    device = check_device(text, parse_server_log(text).cuda_devices)
    assert device.status == "pass"
    assert device.detail == "device 0: NVIDIA GeForce RTX 5090, compute capability 12.0"
    # The target's line and the draft's.
    assert offload_counts(text) == [(5, 5), (5, 5)]
    assert check_offload(offload_counts(text)).status == "pass"


def test_partial_offload_fails() -> None:
    check = check_offload(offload_counts(read("cuda-partial-offload.log")))
    assert check.status == "fail"
    assert check.detail.startswith("only 40/65 layers offloaded to the GPU")


def test_a_cuda_build_without_a_gpu_fails() -> None:
    text = read("cuda-init-failed.log")
    assert is_cuda_build(text)
    device = check_device(text, parse_server_log(text).cuda_devices)
    assert device.status == "fail" and "no CUDA-capable device is detected" in device.detail
    assert check_offload(offload_counts(text)).status == "fail"


def test_a_cpu_log_is_not_a_cuda_build() -> None:
    assert not is_cuda_build(read("upstream-plain.log"))
    assert not is_cuda_build(read("upstream-spec-same-draft.log"))


@pytest.mark.parametrize(
    ("first", "second", "status"),
    [
        (33.0, 0.2, "fail"),  # a reported first prefill (PTX JIT)
        (0.3, 0.05, "pass"),  # 6x, but a quarter of a second: first-use costs, not a JIT
        (12.0, 9.0, "pass"),  # a slow model, not a slow first request
    ],
)
def test_jit_tell(first: float, second: float, status: str) -> None:
    check = check_jit(first, second, cuda=True)
    assert check.status == status, check
    if status == "fail":
        assert f"{JIT_MIN_EXTRA_S:g} s slower" in check.detail
    skipped = check_jit(first, second, cuda=False)
    assert skipped.status == "skip" and skipped.detail.startswith("not a CUDA build (first")


# --- the smoke's GPU verdict on recorded runs -------------------------------------------------


def test_gpu_checks_on_a_healthy_cuda_run(tmp_path: Path, tools_dir: Path) -> None:
    binary, library = cuda_install(tmp_path / "llama-cpp")
    record = stand_in(tools_dir, "cuobjdump", DATA / "cuobjdump-list-elf-sm120a.txt")
    verdict = gpu_checks(binary, False, "", read("cuda-upstream-spec.log"), (0.41, 0.12))
    assert verdict.cuda
    assert [(c.name, c.status) for c in verdict.checks] == [
        ("cuda-device", "pass"),
        ("gpu-offload", "pass"),
        ("sass", "pass"),
        ("jit", "pass"),
    ]
    # The kernels of a shared build live in ../lib/libggml-cuda.so, not in the binary.
    assert recorded_argv(record) == ["cuobjdump", "--list-elf", str(library)]
    assert verdict.gpu["cuda_library"] == str(library)
    assert verdict.gpu["compute_capabilities"] == ["12.0"]


def test_gpu_checks_on_a_3090_with_a_blackwell_only_build(tmp_path: Path, tools_dir: Path) -> None:
    binary, _ = cuda_install(tmp_path / "llama-cpp")
    stand_in(tools_dir, "cuobjdump", DATA / "cuobjdump-list-elf-sm120a.txt")
    verdict = gpu_checks(binary, False, "", read("cuda-partial-offload.log"), (31.0, 0.3))
    status = {c.name: c.status for c in verdict.checks}
    assert status == {"cuda-device": "pass", "gpu-offload": "fail", "sass": "fail", "jit": "fail"}
    sass = next(c for c in verdict.checks if c.name == "sass")
    assert sass.detail.startswith("no SASS for sm_86")


def test_a_static_build_is_its_own_cuda_library(tmp_path: Path, tools_dir: Path) -> None:
    binary = tmp_path / "llama-server"
    binary.write_bytes(b"")
    record = stand_in(tools_dir, "cuobjdump", DATA / "cuobjdump-list-elf-sm86-sm89.txt")
    verdict = gpu_checks(binary, True, "", read("cuda-partial-offload.log"), None)
    assert recorded_argv(record) == ["cuobjdump", "--list-elf", str(binary.resolve())]
    assert {c.name: c.status for c in verdict.checks}["sass"] == "pass"
    jit = verdict.checks[-1]
    assert (jit.name, jit.status) == ("jit", "skip")


def test_compute_capability_from_nvidia_smi_when_the_log_has_no_device_line(
    tmp_path: Path, tools_dir: Path
) -> None:
    binary, _ = cuda_install(tmp_path / "llama-cpp")
    # A backend-loading build names the library it loaded; that one is checked.
    loaded = tmp_path / "backends" / "libggml-cuda.so"
    loaded.parent.mkdir()
    loaded.write_bytes(b"")
    log = f"0.00.000.100 I load_backend: loaded CUDA backend from {loaded}\n"
    smi_out = tmp_path / "smi.txt"
    smi_out.write_text("NVIDIA GeForce RTX 3090, 8.6, 24576 MiB\n")
    smi = stand_in(tools_dir, "nvidia-smi", smi_out)
    cuobjdump = stand_in(tools_dir, "cuobjdump", DATA / "cuobjdump-list-elf-sm86-sm89.txt")
    verdict = gpu_checks(binary, False, "", log, (0.2, 0.1))
    assert recorded_argv(smi) == [
        "nvidia-smi",
        "--query-gpu=name,compute_cap,memory.total",
        "--format=csv,noheader",
    ]
    assert recorded_argv(cuobjdump) == ["cuobjdump", "--list-elf", str(loaded)]
    status = {c.name: c.status for c in verdict.checks}
    assert status == {"cuda-device": "fail", "gpu-offload": "fail", "sass": "pass", "jit": "pass"}


def test_the_h200_run_names_its_card_from_the_model_load_line(
    tmp_path: Path, tools_dir: Path
) -> None:
    """On the H200 (docs/gpu.md) the pinned upstream logged no "Device N: ..." line at -lv 4 and
    the smoke failed cuda-device although all 5/5 layers were on the GPU (gpu-h200/smoke.json,
    as recorded there). The card is named at model load; its compute capability comes from
    nvidia-smi, and the SASS check reads it."""
    recorded = json.loads((DATA / "gpu-h200" / "smoke.json").read_text())
    before = {c["name"]: c["status"] for c in recorded["checks"]}
    assert before["cuda-device"] == "fail" and before["gpu-offload"] == "pass"
    binary, library = cuda_install(tmp_path / "llama-cpp")
    smi_out = tmp_path / "smi.txt"
    smi_out.write_text("NVIDIA H200, 9.0, 143771 MiB\n")
    smi = stand_in(tools_dir, "nvidia-smi", smi_out)
    cuobjdump = stand_in(tools_dir, "cuobjdump", DATA / "cuobjdump-list-elf-sm90.txt")
    version = (
        "version: 0.5.0-dev (build 0, commit unknown)\nbuilt with GNU 13.3.0 for Linux x86_64\n"
    )
    log = read("cuda-h200-model-load.log")
    verdict = gpu_checks(binary, True, version, log, (0.049, 0.005))
    assert [(c.name, c.status) for c in verdict.checks] == [
        ("cuda-device", "pass"),
        ("gpu-offload", "pass"),
        ("sass", "pass"),
        ("jit", "pass"),
    ]
    assert verdict.checks[0].detail == "device 0: NVIDIA H200, compute capability 9.0"
    assert verdict.gpu["compute_capabilities"] == ["9.0"]
    assert recorded_argv(smi) == [
        "nvidia-smi",
        "--query-gpu=name,compute_cap,memory.total",
        "--format=csv,noheader",
    ]
    assert recorded_argv(cuobjdump) == ["cuobjdump", "--list-elf", str(library)]


def test_a_device_line_keeps_its_capability_beside_the_model_load_line() -> None:
    """Where both are logged (older builds, or -lv set before the devices are listed), the
    "Device N:" line's capability stands and the card is listed once."""
    log = read("cuda-upstream-spec.log") + (
        "0.00.021.530 I llama_model_load_from_file_impl: using device CUDA0 "
        "(NVIDIA GeForce RTX 5090) (0000:01:00.0) - 31000 MiB free\n"
    )
    devices = parse_server_log(log).cuda_devices
    assert [(d.index, d.compute_capability) for d in devices] == [(0, "12.0")]


def test_gpu_checks_on_a_cpu_run_are_skipped(tmp_path: Path) -> None:
    verdict = gpu_checks(
        tmp_path / "llama-server",
        False,
        "version: 0.5.0-dev",
        read("upstream-plain.log"),
        (0.02, 0.01),
    )
    assert not verdict.cuda and verdict.gpu == {}
    assert [(c.name, c.status) for c in verdict.checks] == [(n, "skip") for n in GPU_CHECKS]
    assert all(c.detail.startswith("not a CUDA build") for c in verdict.checks)
