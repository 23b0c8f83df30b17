"""The cached llama-server build: exact commands, reuse, the override, the lock, unpacking."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from llamanix.cli import main
from llamanix.core.errors import ExternalCommandError, UserError
from llamanix.external import llama_server
from llamanix.testbed import server_build as sb


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (sb.SERVER_ENV, sb.QUANTIZE_ENV, sb.CACHE_ENV, "XDG_CACHE_HOME", sb.JOBS_ENV):
        monkeypatch.delenv(var, raising=False)


def test_pinned_source_is_named_once() -> None:
    assert sb.LLAMA_CPP_PYTHON_VERSION == "0.3.36"
    assert len(sb.LLAMA_CPP_PYTHON_SDIST_SHA256) == 64
    assert sb.SDIST_FILENAME == "llama_cpp_python-0.3.36.tar.gz"
    assert sb.VENDOR_PREFIX == "llama_cpp_python-0.3.36/vendor/llama.cpp/"


def test_command_lines(tmp_path: Path) -> None:
    layout = sb.BuildLayout(tmp_path / "v")
    v3 = sb.instruction_set("x86_64", "flags\t: fpu sse4_2 avx avx2 fma f16c bmi2 amx_tile\n")
    assert sb.pip_download_argv(tmp_path / "dl") == [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-binary",
        ":all:",
        "llama-cpp-python==0.3.36",
        "-d",
        str(tmp_path / "dl"),
    ]
    assert sb.cmake_configure_argv(layout, v3) == [
        "cmake",
        "-S",
        str(tmp_path / "v/src"),
        "-B",
        str(tmp_path / "v/build"),
        "-DCMAKE_BUILD_TYPE=Release",
        "-DGGML_NATIVE=OFF",
        "-DGGML_SSE42=ON",
        "-DGGML_AVX=ON",
        "-DGGML_AVX2=ON",
        "-DGGML_FMA=ON",
        "-DGGML_F16C=ON",
        "-DGGML_BMI2=ON",
        "-DGGML_AVX_VNNI=OFF",
        "-DGGML_AVX512=OFF",
        "-DGGML_AMX_TILE=OFF",
        "-DGGML_AMX_INT8=OFF",
        "-DGGML_AMX_BF16=OFF",
        "-DBUILD_SHARED_LIBS=OFF",
        "-DLLAMA_CURL=OFF",
        "-DLLAMA_OPENSSL=OFF",
        "-DLLAMA_BUILD_UI=OFF",
        "-DLLAMA_USE_PREBUILT_UI=OFF",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_BUILD_SERVER=ON",
        "-DLLAMA_BUILD_COMMIT=0c1e570",
    ]
    assert sb.cmake_build_argv(layout, 3) == [
        "cmake",
        "--build",
        str(tmp_path / "v/build"),
        "--target",
        "llama-server",
        "llama-quantize",
        "llama-bench",
        "-j3",
    ]
    assert llama_server.binary_argv(Path("/x/llama-server"), "--version") == [
        "/x/llama-server",
        "--version",
    ]


def test_cache_location(clean_env: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert sb.cache_root() == tmp_path / "home/.cache/llamanix"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert sb.cache_root() == tmp_path / "xdg/llamanix"
    monkeypatch.setenv(sb.CACHE_ENV, str(tmp_path / "explicit"))
    assert sb.default_layout().root == tmp_path / "explicit/llama-server/0.3.36"
    assert sb.default_layout().server == sb.default_layout().root / "build/bin/llama-server"


def _finished_build_at(layout: sb.BuildLayout, real_server: Path) -> None:
    """A cache that looks exactly like a finished build, using the real binaries."""
    layout.bin_dir.mkdir(parents=True)
    layout.server.symlink_to(real_server)
    layout.quantize.symlink_to(real_server.parent / "llama-quantize")
    layout.bench.symlink_to(real_server.parent / "llama-bench")
    sb.write_marker(layout, llama_server.binary_version_line(layout.server))


@pytest.mark.server
def test_marker_records_the_build(llama_server_bin: Path, tmp_path: Path) -> None:
    layout = sb.BuildLayout(tmp_path / "v")
    _finished_build_at(layout, llama_server_bin)
    marker = sb.read_marker(layout)
    assert marker is not None
    assert marker["version"] == "0.3.36"
    assert marker["sha256"] == sb.LLAMA_CPP_PYTHON_SDIST_SHA256
    assert marker["commit"] == "0c1e570"
    assert marker["version_line"].startswith("version: ")


@pytest.mark.server
def test_cached_build_is_reused_without_building(llama_server_bin: Path, tmp_path: Path) -> None:
    layout = sb.BuildLayout(tmp_path / "v")
    _finished_build_at(layout, llama_server_bin)
    assert sb.ensure_build(layout=layout) == layout
    # Any build step (pip download, cmake) would have written build.log or src/.
    assert not layout.log.exists()
    assert not layout.src.exists()


@pytest.mark.server
def test_marker_of_another_version_or_missing_binary_is_not_a_build(
    llama_server_bin: Path, tmp_path: Path
) -> None:
    layout = sb.BuildLayout(tmp_path / "v")
    _finished_build_at(layout, llama_server_bin)
    text = layout.marker.read_text()
    layout.marker.write_text(text.replace('"0.3.36"', '"0.3.35"'))
    assert sb.read_marker(layout) is None
    layout.marker.write_text(text)
    assert sb.read_marker(layout) is not None
    layout.quantize.unlink()
    assert sb.read_marker(layout) is None
    layout.quantize.symlink_to(llama_server_bin.parent / "llama-quantize")
    layout.bench.unlink()
    assert sb.read_marker(layout) is None  # a build from before llama-bench: built again
    layout.marker.write_text("{not json")
    assert sb.read_marker(layout) is None


@pytest.mark.server
def test_override_wins_and_builds_nothing(
    clean_env: None, monkeypatch: pytest.MonkeyPatch, llama_server_bin: Path, tmp_path: Path
) -> None:
    monkeypatch.setenv(sb.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv(sb.SERVER_ENV, str(llama_server_bin))
    assert sb.ensure_llama_server() == llama_server_bin
    assert sb.find_llama_server() == llama_server_bin
    assert not (tmp_path / "cache").exists()

    result = CliRunner().invoke(main, ["testbed", "build-server"])
    assert result.exit_code == 0, result.output
    path_line, version_line = result.output.strip().splitlines()
    assert path_line == str(llama_server_bin)
    assert version_line.startswith("version: ")
    printed = CliRunner().invoke(main, ["testbed", "build-server", "--print-path"])
    assert printed.output == f"{llama_server_bin}\n"
    # llama-quantize next to an overriding llama-server is taken from there.
    quantize = sb.ensure_llama_quantize()
    assert quantize == llama_server_bin.parent / "llama-quantize"
    monkeypatch.setenv(sb.QUANTIZE_ENV, str(quantize))
    assert sb.ensure_llama_quantize() == quantize
    assert not (tmp_path / "cache").exists()


def test_bad_override_is_one_line_exit_2(
    clean_env: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(sb.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv(sb.SERVER_ENV, str(tmp_path / "nope"))
    with pytest.raises(UserError):
        sb.ensure_llama_server()
    result = CliRunner().invoke(main, ["testbed", "build-server"])
    assert result.exit_code == 2
    assert result.output == (
        f"LLAMANIX_LLAMA_SERVER: {tmp_path / 'nope'} is not an executable file "
        "(point LLAMANIX_LLAMA_SERVER at a built binary or unset it)\n"
    )
    assert not (tmp_path / "cache").exists()


_HOLDER = """
import sys
from pathlib import Path
from llamanix.external import llama_server
from llamanix.testbed import server_build as sb
layout = sb.BuildLayout(Path(sys.argv[1]))
real = Path(sys.argv[2])
with sb.build_lock(layout):
    print("locked", flush=True)
    sys.stdin.readline()
    # Finish "the build" the way ensure_build does: binaries, then the marker, last.
    layout.bin_dir.mkdir(parents=True)
    layout.server.symlink_to(real)
    layout.quantize.symlink_to(real.parent / "llama-quantize")
    layout.bench.symlink_to(real.parent / "llama-bench")
    sb.write_marker(layout, llama_server.binary_version_line(layout.server))
"""


@pytest.mark.server
def test_second_caller_waits_for_the_first_and_reuses_its_build(
    llama_server_bin: Path, tmp_path: Path
) -> None:
    layout = sb.BuildLayout(tmp_path / "v")
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(layout.root), str(llama_server_bin)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline() == "locked\n"
        results: list[sb.BuildLayout | BaseException] = []

        def second() -> None:
            try:
                results.append(sb.ensure_build(layout=layout))
            except BaseException as err:
                results.append(err)

        waiter = threading.Thread(target=second)
        waiter.start()
        waiter.join(timeout=1.0)
        # Still blocked on the lock: without it, this call would have started a build.
        assert waiter.is_alive()
        assert not layout.log.exists()
        holder.stdin.write("go\n")
        holder.stdin.flush()
        waiter.join(timeout=60)
        assert not waiter.is_alive()
        assert results == [layout]
        # It took the first caller's build instead of building a second time.
        assert not layout.log.exists()
        assert not layout.src.exists()
        assert holder.wait(timeout=30) == 0
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def test_lock_is_exclusive_between_threads(tmp_path: Path) -> None:
    layout = sb.BuildLayout(tmp_path / "v")
    inside: list[int] = []
    overlaps: list[int] = []
    entered = threading.Barrier(2)

    def worker(n: int) -> None:
        entered.wait()
        for _ in range(50):
            with sb.build_lock(layout):
                inside.append(n)
                if len(inside) > 1:
                    overlaps.append(n)
                inside.remove(n)

    threads = [threading.Thread(target=worker, args=(n,)) for n in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert overlaps == []


def _tarball(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture(params=["native", "python-3.11.2"])
def extraction(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both extraction paths: tarfile's own "data" filter, and the rules applied by hand where
    Python predates the filters (Debian 12's 3.11.2 has neither data_filter nor filter=)."""
    if request.param == "python-3.11.2":
        monkeypatch.setattr(sb, "_DATA_FILTER", None)
    elif sb._DATA_FILTER is None:
        pytest.skip("this Python has no tarfile.data_filter")
    return str(request.param)


def test_only_the_vendored_tree_is_unpacked(tmp_path: Path, extraction: str) -> None:
    prefix = sb.VENDOR_PREFIX
    sdist = _tarball(
        tmp_path / "s.tar.gz",
        {
            "llama_cpp_python-0.3.36/pyproject.toml": b"[project]",
            f"{prefix}CMakeLists.txt": b"project(llama)",
            f"{prefix}models/ggml-vocab-x.gguf": b"GGUF",
        },
    )
    sb.extract_vendor_tree(sdist, tmp_path / "src")
    src = tmp_path / "src"
    files = sorted(p.relative_to(src).as_posix() for p in src.rglob("*"))
    assert files == ["CMakeLists.txt", "models", "models/ggml-vocab-x.gguf"]
    assert (src / "models/ggml-vocab-x.gguf").read_bytes() == b"GGUF"


def test_member_escaping_the_tree_is_refused(tmp_path: Path, extraction: str) -> None:
    sdist = _tarball(
        tmp_path / "s.tar.gz",
        {
            f"{sb.VENDOR_PREFIX}CMakeLists.txt": b"x",
            f"{sb.VENDOR_PREFIX}../../../escape.txt": b"x",
        },
    )
    with pytest.raises((tarfile.TarError, ExternalCommandError)):
        sb.extract_vendor_tree(sdist, tmp_path / "out" / "src")
    assert not (tmp_path / "escape.txt").exists()


def test_link_leaving_the_tree_is_refused(tmp_path: Path, extraction: str) -> None:
    sdist = tmp_path / "s.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        info = tarfile.TarInfo(f"{sb.VENDOR_PREFIX}CMakeLists.txt")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
        link = tarfile.TarInfo(f"{sb.VENDOR_PREFIX}passwd")
        link.type = tarfile.SYMTYPE
        link.linkname = "/etc/passwd"
        tar.addfile(link)
    with pytest.raises((tarfile.TarError, ExternalCommandError)):
        sb.extract_vendor_tree(sdist, tmp_path / "out" / "src")
    assert not (tmp_path / "out" / "src" / "passwd").is_symlink()


def test_wrong_hash_is_refused(tmp_path: Path) -> None:
    fake = tmp_path / sb.SDIST_FILENAME
    fake.write_bytes(b"not the sdist")
    with pytest.raises(ExternalCommandError, match="expected 832db069"):
        sb.verify_sdist(fake)


@pytest.mark.server
def test_vocab_files_come_with_the_source(vocab_dir: Path) -> None:
    assert (vocab_dir / "ggml-vocab-llama-spm.gguf").is_file()
    assert "gpt-2" in sb.vocab_names()
    assert sb.vocab_file("llama-spm") == vocab_dir / "ggml-vocab-llama-spm.gguf"


# --- progress: the compiler's output goes to build.log, the user sees a bar or a few lines ---

DATA = Path(__file__).parent / "data"


def test_progress_lines_of_a_real_cmake_build_log() -> None:
    """The start and the end of a real `cmake --build` of the pinned source, as logged."""
    lines = (DATA / "cmake-build.log").read_text().splitlines()
    parsed = [sb.parse_progress(line) for line in lines]
    found = [p for p in parsed if p is not None]
    assert len(found) == sum("%]" in line for line in lines) == 51
    assert found[0] == sb.ProgressLine(
        1, "Building C object ggml/src/CMakeFiles/ggml-base.dir/ggml.c.o"
    )
    assert found[1].percent == 0  # -j2: the shares arrive out of order
    assert found[-1] == sb.ProgressLine(100, "Built target llama-quantize")
    # The command line and the compiler's warnings are not progress.
    assert parsed[0] is None
    warnings = [line for line in lines if "warning:" in line]
    assert warnings and all(sb.parse_progress(w) is None for w in warnings)


def test_plain_reporter_prints_a_few_lines(tmp_path: Path) -> None:
    out = io.StringIO()
    reporter = sb.PlainReporter(out)
    reporter.begin("building", tmp_path / "build.log")
    for line in ("[  3%] Building C object a.o", "warning: x", "[ 27%] b", "[ 26%] c", "[ 80%] d"):
        reporter.line(line)
    reporter.line("[100%] Built target llama-server")
    reporter.end(True)
    assert out.getvalue().splitlines() == [
        f"llamanix: building (output: {tmp_path / 'build.log'})",
        "llamanix: building: 25%",
        "llamanix: building: 75%",
        "llamanix: building: 100%",
        "llamanix: building: done",
    ]


def test_a_terminal_gets_the_rich_bar_and_a_pipe_plain_lines(tmp_path: Path) -> None:
    assert isinstance(sb.make_reporter(False), sb.QuietReporter)
    assert isinstance(sb.make_reporter(True, io.StringIO()), sb.PlainReporter)
    leader, follower = os.openpty()
    try:
        with os.fdopen(follower, "w", closefd=False) as tty:
            assert isinstance(sb.make_reporter(True, tty), sb.RichReporter)
    finally:
        os.close(leader)
        os.close(follower)


def test_rich_bar_follows_the_largest_percentage_of_a_real_log(tmp_path: Path) -> None:
    screen = io.StringIO()
    reporter = sb.RichReporter(Console(file=screen, force_terminal=True, width=150))
    reporter.begin("build (cmake -j2)", tmp_path / "build.log")
    seen: list[int] = []
    for line in (DATA / "cmake-build.log").read_text().splitlines():
        reporter.line(line)
        seen.append(reporter.percent)
    assert seen == sorted(seen)  # never goes back, though cmake's lines do
    assert max(seen) == 100
    reporter.end(True)
    text = screen.getvalue()
    assert "build (cmake -j2)" in text and "100%" in text
    assert "warning:" not in text  # compiler output never reaches the screen


FAKE_SERVER = r"""
#include <cstdio>
int main() { std::fprintf(stderr, "version: 1 (abc1234)\nbuilt with a test\n"); return 0; }
"""


def _fake_source(src: Path, extra_sources: int = 6, broken: bool = False) -> None:
    """A real CMake project with the targets the build asks for (llama-server, -quantize,
    -bench)."""
    src.mkdir(parents=True)
    units = [f"unit{i}.cpp" for i in range(extra_sources)]
    for i, name in enumerate(units):
        (src / name).write_text(f"int unit{i}() {{ return {i}; }}\n")
    if broken:
        (src / units[-1]).write_text("int broken( { return }\n")
    (src / "server.cpp").write_text(FAKE_SERVER)
    (src / "quantize.cpp").write_text("int main() { return 0; }\n")
    (src / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.16)\n"
        "project(fake CXX)\n"
        f"add_library(units STATIC {' '.join(units)})\n"
        "set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)\n"
        "add_executable(llama-server server.cpp)\n"
        "target_link_libraries(llama-server units)\n"
        "add_executable(llama-quantize quantize.cpp)\n"
        "add_executable(llama-bench quantize.cpp)\n"
    )


def test_real_cmake_build_logs_to_the_file_not_the_terminal(
    clean_env: None,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(sb.JOBS_ENV, "2")
    layout = sb.BuildLayout(tmp_path / "v")
    _fake_source(layout.src)
    assert sb.ensure_build(progress=True, layout=layout) == layout
    marker = sb.read_marker(layout)
    assert marker is not None and marker["version_line"] == "version: 1 (abc1234)"
    log = layout.log.read_text()
    assert "$ cmake -S " in log and "$ cmake --build " in log
    assert "Building CXX object CMakeFiles/units.dir/unit0.cpp.o" in log
    assert "[100%] Built target llama-server" in log
    captured = capfd.readouterr()
    assert captured.out == ""
    # Not a terminal: a few plain lines, none of cmake's or the compiler's own.
    lines = captured.err.splitlines()
    isa = sb.this_machine_instruction_set().name
    assert all(line.startswith("llamanix: ") for line in lines), captured.err
    assert "Building CXX object" not in captured.err
    assert lines[:3] == [
        f"llamanix: configure (cmake, {isa}) (output: {layout.log})",
        f"llamanix: configure (cmake, {isa}): done",
        f"llamanix: build (cmake -j2) (output: {layout.log})",
    ]
    assert lines[-2:] == ["llamanix: build (cmake -j2): 100%", "llamanix: build (cmake -j2): done"]
    assert len(lines) <= 10


def test_failed_build_shows_the_log_tail_and_its_path(
    clean_env: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(sb.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv(sb.JOBS_ENV, "1")
    layout = sb.default_layout()
    _fake_source(layout.src, broken=True)
    result = subprocess.run(
        [sys.executable, "-m", "llamanix", "testbed", "build-server"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode != 0
    assert result.stdout == ""
    # The compiler's message reaches the user once, inside the error, with the log's path.
    assert f"the last 20 lines of {layout.log}:" in result.stderr
    assert "unit5.cpp" in result.stderr and "error:" in result.stderr
    assert "Traceback" not in result.stderr
    assert "error:" in layout.log.read_text()
    assert sb.read_marker(layout) is None


_AMX_XEON_CPUINFO = (
    "processor\t: 0\nvendor_id\t: GenuineIntel\n"
    "flags\t\t: fpu sse4_2 avx avx2 fma f16c bmi2 avx512f avx512_vnni amx_tile amx_int8 "
    "amx_bf16\n"
)


def test_instruction_set_is_named_never_native() -> None:
    amx = sb.instruction_set("x86_64", _AMX_XEON_CPUINFO)
    assert amx.name == "x86-64-v3"
    # A CPU that advertises AMX and AVX-512 still gets neither: a VM may not run them.
    for option in ("-DGGML_AVX512=OFF", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF"):
        assert option in amx.options
    assert "-DGGML_NATIVE=OFF" in amx.options
    old = sb.instruction_set("x86_64", "flags\t: fpu sse4_2 avx\n")
    assert old.name == "x86-64-sse4.2" and "-DGGML_AVX2=OFF" in old.options
    arm = sb.instruction_set("aarch64", "Features\t: fp asimd\n")
    assert arm == sb.InstructionSet("compiler-default", ("-DGGML_NATIVE=OFF",))
    for isa in (amx, old, arm):
        options = sb.cmake_options(isa)
        assert not any("NATIVE=ON" in o or "march=native" in o for o in options)


@pytest.mark.server
def test_a_build_under_other_options_is_not_reused(llama_server_bin: Path, tmp_path: Path) -> None:
    layout = sb.BuildLayout(tmp_path / "v")
    _finished_build_at(layout, llama_server_bin)
    assert sb.read_marker(layout) is not None
    # A marker written before the instruction set was named (a -DGGML_NATIVE=ON build).
    text = json.loads(layout.marker.read_text())
    del text["cmake_options"]
    layout.marker.write_text(json.dumps(text))
    assert sb.read_marker(layout) is None
    text["cmake_options"] = ["-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON"]
    layout.marker.write_text(json.dumps(text))
    assert sb.read_marker(layout) is None


def test_a_build_dir_configured_natively_is_rebuilt_not_reused(
    clean_env: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(sb.JOBS_ENV, "2")
    layout = sb.BuildLayout(tmp_path / "v")
    _fake_source(layout.src)
    # What an earlier version left: a configured build dir, a stale object, no options record.
    layout.build.mkdir(parents=True)
    (layout.build / "CMakeCache.txt").write_text("GGML_NATIVE:BOOL=ON\n")
    (layout.build / "stale.o").write_text("native code")
    assert sb.ensure_build(layout=layout) == layout
    assert not (layout.build / "stale.o").exists()
    assert layout.options_record.read_text().splitlines() == list(
        sb.cmake_options(sb.this_machine_instruction_set())
    )
    # The same options again: the build dir is kept (an interrupted build resumes).
    (layout.build / "kept.o").write_text("")
    layout.marker.unlink()
    sb.ensure_build(layout=layout)
    assert (layout.build / "kept.o").exists()


# Instructions a build for x86-64-v3 never contains: AMX tiles and AVX-512's zmm and mask
# registers. -march=native on an AMX Xeon brings both into ggml's CPU backend.
_FOREIGN_INSTRUCTION = re.compile(r"\b(tilezero|tileloadd|tdpb\w+|ldtilecfg)\b|%zmm|%k[1-7]\b")


@pytest.mark.server
def test_the_built_server_holds_no_amx_or_avx512_code(llama_server_bin: Path) -> None:
    marker = sb.read_marker(sb.BuildLayout(llama_server_bin.parent.parent.parent))
    if marker is None:
        pytest.skip("LLAMANIX_LLAMA_SERVER points at a binary this bed did not build")
    assert marker["instruction_set"] in ("x86-64-v3", "x86-64-sse4.2")
    found: list[str] = []
    with subprocess.Popen(
        ["objdump", "-d", "--no-show-raw-insn", str(llama_server_bin.resolve())],
        stdout=subprocess.PIPE,
        text=True,
    ) as dump:
        assert dump.stdout is not None
        for line in dump.stdout:
            if _FOREIGN_INSTRUCTION.search(line):
                found.append(line.strip())
                if len(found) >= 5:
                    dump.kill()
                    break
    assert found == [], found
