"""A real CPU llama-server for tests, the demo and smoke runs, built once and cached.

The source is upstream llama.cpp as vendored in the llama-cpp-python sdist on PyPI: PyPI is
reachable where GitHub may not be, and the sdist's sha256 pins the exact tree. The build is
CPU-only, Release, the server, quantize and bench tools only, no curl/openssl, no web UI.

Cache layout (outside the repository)::

    $LLAMANIX_CACHE or ${XDG_CACHE_HOME:-~/.cache}/llamanix
      llama-server/<version>/
        src/        the sdist's vendor/llama.cpp (includes models/ggml-vocab-*.gguf)
        build/      the cmake build directory; binaries in build/bin/
        build.log   every build command's output (pip, cmake, the compiler), appended
        ok.json     written last, only after a build succeeded
        .lock       flock'ed while the source is unpacked or the build runs

``LLAMANIX_LLAMA_SERVER=/path/to/llama-server`` skips all of this (llama-quantize and llama-bench
are then taken from beside it, or from ``LLAMANIX_LLAMA_QUANTIZE`` and ``LLAMANIX_LLAMA_BENCH``).

The first build takes minutes. The terminal shows a progress bar per step (cmake's ``[ 14%]``
lines give the percentage) and nothing of the compiler's output, which goes to build.log; a
failure prints the log's last lines and its path. Without a terminal (CI, pipes) a few plain
lines say the same.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import platform
import re
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol, TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    TaskID,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)

from llamanix.core import file_reader
from llamanix.core.errors import ExternalCommandError, Problem, UserError
from llamanix.core.json_value import JsonObject
from llamanix.core.probe import commit_of
from llamanix.external import cmake, pip
from llamanix.external.files import atomic_write, extract_trusted, locked
from llamanix.external.llama_server import binary_version_line
from llamanix.external.process import run_streamed

# The one place the pinned source is named.
LLAMA_CPP_PYTHON_VERSION = "0.3.36"
LLAMA_CPP_PYTHON_SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
# The upstream llama.cpp commit the sdist vendors. The sdist has no .git, so without this
# the binary would report "commit unknown".
LLAMA_CPP_COMMIT = "0c1e570"
SDIST_FILENAME = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"
VENDOR_PREFIX = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp/"

# The CPU code is chosen by name, never by -march=native: a VM may advertise instructions it
# cannot run (AMX on some Intel hosts dies with SIGILL on the first batch), and a build must run
# on whatever machine later reads the cache. x86-64-v3 (AVX2, FMA, F16C, BMI2) is what every x86
# machine of the last decade runs; AVX-512 and AMX stay off. A CPU without all of x86-64-v3
# gets SSE4.2 only; another architecture gets its compiler's baseline (GGML_NATIVE=OFF).
X86_64_V3_FLAGS = ("avx", "avx2", "fma", "f16c", "bmi2")
X86_64_V3_OPTIONS = (
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
)
X86_64_BASELINE_OPTIONS = (
    "-DGGML_NATIVE=OFF",
    "-DGGML_SSE42=ON",
    "-DGGML_AVX=OFF",
    "-DGGML_AVX2=OFF",
    "-DGGML_FMA=OFF",
    "-DGGML_F16C=OFF",
    "-DGGML_BMI2=OFF",
    "-DGGML_AVX_VNNI=OFF",
    "-DGGML_AVX512=OFF",
    "-DGGML_AMX_TILE=OFF",
    "-DGGML_AMX_INT8=OFF",
    "-DGGML_AMX_BF16=OFF",
)
OTHER_ARCH_OPTIONS = ("-DGGML_NATIVE=OFF",)

COMMON_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    f"-DLLAMA_BUILD_COMMIT={LLAMA_CPP_COMMIT}",
)


@dataclass(frozen=True)
class InstructionSet:
    """The CPU code a build compiles in: a name for messages and the ggml options."""

    name: Literal["x86-64-v3", "x86-64-sse4.2", "compiler-default"]
    options: tuple[str, ...]


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The first ``flags`` line of /proc/cpuinfo, as a set (x86 only; empty elsewhere)."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def instruction_set(machine: str, cpuinfo: str) -> InstructionSet:
    """The instruction set to build for on a machine of ``uname -m`` and this cpuinfo."""
    if machine not in ("x86_64", "amd64", "AMD64"):
        return InstructionSet("compiler-default", OTHER_ARCH_OPTIONS)
    if set(X86_64_V3_FLAGS) <= cpu_flags(cpuinfo):
        return InstructionSet("x86-64-v3", X86_64_V3_OPTIONS)
    return InstructionSet("x86-64-sse4.2", X86_64_BASELINE_OPTIONS)


def this_machine_instruction_set() -> InstructionSet:
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        cpuinfo = ""
    return instruction_set(platform.machine(), cpuinfo)


def cmake_options(isa: InstructionSet) -> tuple[str, ...]:
    return COMMON_OPTIONS[:1] + isa.options + COMMON_OPTIONS[1:]


BUILD_TARGETS = ("llama-server", "llama-quantize", "llama-bench")

SERVER_ENV = "LLAMANIX_LLAMA_SERVER"
QUANTIZE_ENV = "LLAMANIX_LLAMA_QUANTIZE"
BENCH_ENV = "LLAMANIX_LLAMA_BENCH"
CACHE_ENV = "LLAMANIX_CACHE"
JOBS_ENV = "LLAMANIX_BUILD_JOBS"


@dataclass(frozen=True)
class BuildLayout:
    """Where one pinned version lives in the cache."""

    root: Path

    @property
    def src(self) -> Path:
        return self.root / "src"

    @property
    def build(self) -> Path:
        return self.root / "build"

    @property
    def bin_dir(self) -> Path:
        return self.build / "bin"

    @property
    def server(self) -> Path:
        return self.bin_dir / "llama-server"

    @property
    def quantize(self) -> Path:
        return self.bin_dir / "llama-quantize"

    @property
    def bench(self) -> Path:
        return self.bin_dir / "llama-bench"

    @property
    def models(self) -> Path:
        return self.src / "models"

    @property
    def options_record(self) -> Path:
        """The cmake options the build directory was configured with, one per line."""
        return self.build / "llamanix-cmake-options"

    @property
    def marker(self) -> Path:
        return self.root / "ok.json"

    @property
    def lock(self) -> Path:
        return self.root / ".lock"

    @property
    def log(self) -> Path:
        return self.root / "build.log"


def cache_root() -> Path:
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "llamanix"


def default_layout(cache: Path | None = None) -> BuildLayout:
    return BuildLayout((cache or cache_root()) / "llama-server" / LLAMA_CPP_PYTHON_VERSION)


# --- external commands: their argv is built in external/ (pip, cmake) --------------------


def pip_download_argv(dest: Path) -> list[str]:
    return pip.sdist_download_argv(f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}", dest)


def cmake_configure_argv(layout: BuildLayout, isa: InstructionSet) -> list[str]:
    return cmake.configure_argv(layout.src, layout.build, cmake_options(isa))


def cmake_build_argv(layout: BuildLayout, jobs: int) -> list[str]:
    return cmake.build_argv(layout.build, BUILD_TARGETS, jobs)


def build_jobs() -> int:
    explicit = os.environ.get(JOBS_ENV)
    if explicit and explicit.isdigit() and int(explicit) > 0:
        return int(explicit)
    return max(1, len(os.sched_getaffinity(0)))


# --- progress: compiler output to build.log, a bar (or a few lines) to the user --------------

# cmake's Makefile generator prefixes each step with its share of the whole: "[ 14%] Building
# CXX object ...". With -j the shares arrive out of order, so the bar shows the largest so far.
PERCENT_LINE = re.compile(r"^\[\s*(\d{1,3})%\]\s*(.*)$")
PLAIN_EVERY_PCT = 25  # a non-terminal sees a line at 25, 50, 75 and 100%
FAILURE_TAIL_LINES = 20


@dataclass(frozen=True)
class ProgressLine:
    percent: int
    what: str  # "Building CXX object src/CMakeFiles/llama.dir/llama.cpp.o"


def parse_progress(line: str) -> ProgressLine | None:
    """The percentage and step of a cmake build line, or None for any other line."""
    match = PERCENT_LINE.match(line.strip())
    if match is None:
        return None
    return ProgressLine(min(int(match.group(1)), 100), match.group(2))


class Reporter(Protocol):
    """What the user sees of one build command while its whole output goes to build.log."""

    def begin(self, step: str, log_path: Path) -> None: ...

    def line(self, line: str) -> None: ...

    def end(self, ok: bool) -> None: ...


class QuietReporter:
    """progress=False: nothing at all (``testbed build-server --print-path``, library callers)."""

    def begin(self, step: str, log_path: Path) -> None:
        pass

    def line(self, line: str) -> None:
        pass

    def end(self, ok: bool) -> None:
        pass


class PlainReporter:
    """Not a terminal (CI logs, pipes): a line per step and one per quarter of a build."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.step = ""
        self.shown = 0

    def _say(self, text: str) -> None:
        self.stream.write(f"llamanix: {text}\n")
        self.stream.flush()

    def begin(self, step: str, log_path: Path) -> None:
        self.step, self.shown = step, 0
        self._say(f"{step} (output: {log_path})")

    def line(self, line: str) -> None:
        parsed = parse_progress(line)
        if parsed is None:
            return
        mark = parsed.percent // PLAIN_EVERY_PCT * PLAIN_EVERY_PCT
        if mark > self.shown:
            self.shown = mark
            self._say(f"{self.step}: {mark}%")

    def end(self, ok: bool) -> None:
        self._say(f"{self.step}: {'done' if ok else 'FAILED'}")


class RichReporter:
    """A terminal: one progress bar per step, the percentage and the file being compiled."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.progress: Progress | None = None
        self.task: TaskID | None = None
        self.percent = 0

    def begin(self, step: str, log_path: Path) -> None:
        self.console.print(f"llamanix: {step}, first run only (output: {log_path})")
        self.percent = 0
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TaskProgressColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[what]}", style="dim"),
            console=self.console,
            transient=False,
        )
        # No total until cmake prints a percentage: pip and the configure step just pulse.
        self.task = self.progress.add_task(step, total=None, what="")
        self.progress.start()

    def line(self, line: str) -> None:
        if self.progress is None or self.task is None:
            return
        parsed = parse_progress(line)
        if parsed is None:
            return
        self.percent = max(self.percent, parsed.percent)
        what = parsed.what.rsplit("/", 1)[-1] if "/" in parsed.what else parsed.what
        self.progress.update(self.task, total=100, completed=self.percent, what=what[:60])

    def end(self, ok: bool) -> None:
        if self.progress is None or self.task is None:
            return
        if ok:
            self.progress.update(self.task, total=100, completed=100, what="done")
        self.progress.stop()
        self.progress, self.task = None, None


def make_reporter(progress: bool, stream: TextIO | None = None) -> Reporter:
    """Quiet without ``progress``; a rich bar on a terminal; a few plain lines otherwise."""
    if not progress:
        return QuietReporter()
    out = stream if stream is not None else sys.stderr
    if out.isatty():
        return RichReporter(Console(file=out))
    return PlainReporter(out)


def run_logged(argv: list[str], log_path: Path, reporter: Reporter, step: str) -> None:
    """Run a command with its output appended to ``log_path``; the reporter sees each line.

    On failure the error carries the last lines of the log and its path: the compiler's
    message is the one thing the user needs, and it never went to the terminal."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    tail: list[str] = []
    with log_path.open("a", encoding="utf-8") as log:
        log.write(f"$ {' '.join(argv)}\n")
        log.flush()

        def on_line(line: str) -> None:
            log.write(line)
            tail.append(line.rstrip("\n"))
            del tail[:-FAILURE_TAIL_LINES]
            reporter.line(line)

        started = False

        def on_start() -> None:
            nonlocal started
            started = True
            reporter.begin(step, log_path)

        ok = False
        try:
            code = run_streamed(argv, on_line, on_start)
            ok = code == 0
        except FileNotFoundError as err:
            if started:
                raise
            raise ExternalCommandError(
                f"{argv[0]} not found: install it to build llama-server "
                f"(or set {SERVER_ENV} to a llama-server binary)"
            ) from err
        finally:
            if started:
                reporter.end(ok)
        if not ok:
            shown = "\n".join(tail)
            raise ExternalCommandError(
                f"{step} failed with exit code {code}; the last "
                f"{len(tail)} lines of {log_path}:\n{shown}"
            )


# --- source -------------------------------------------------------------------------------


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify_sdist(path: Path) -> None:
    actual = sha256_of(path)
    if actual != LLAMA_CPP_PYTHON_SDIST_SHA256:
        raise ExternalCommandError(
            f"{path.name} has sha256 {actual}, expected {LLAMA_CPP_PYTHON_SDIST_SHA256}: "
            "the download is not the pinned source"
        )


def download_sdist(dest: Path, layout: BuildLayout, reporter: Reporter) -> Path:
    run_logged(pip_download_argv(dest), layout.log, reporter, "download the source (pip)")
    sdist = dest / SDIST_FILENAME
    if not sdist.is_file():
        raise ExternalCommandError(f"pip download did not produce {SDIST_FILENAME} in {dest}")
    verify_sdist(sdist)
    return sdist


def extract_vendor_tree(sdist: Path, dest: Path) -> None:
    """Unpack the sdist's vendor/llama.cpp into ``dest`` (which must not exist yet)."""
    dest.mkdir(parents=True)
    with tarfile.open(sdist, "r:gz") as tar:
        safe: list[tarfile.TarInfo] = []
        for member in tar.getmembers():
            if not member.name.startswith(VENDOR_PREFIX):
                continue
            renamed = copy.copy(member)
            renamed.name = member.name[len(VENDOR_PREFIX) :]
            if member.islnk() and member.linkname.startswith(VENDOR_PREFIX):
                renamed.linkname = member.linkname[len(VENDOR_PREFIX) :]
            checked = _data_member(renamed, dest)
            if checked is not None:
                safe.append(checked)
        # Every member was checked above, so they are extracted as they now are.
        extract_trusted(tar, dest, safe)
    if not (dest / "CMakeLists.txt").is_file():
        raise ExternalCommandError(f"{sdist.name} holds no {VENDOR_PREFIX}CMakeLists.txt")


# Python 3.11.4 added tarfile's extraction filters; Debian 12 ships 3.11.2. Where they exist,
# their "data" filter decides; otherwise the same rules are applied here.
_DATA_FILTER = getattr(tarfile, "data_filter", None)


def _data_member(member: tarfile.TarInfo, dest: Path) -> tarfile.TarInfo | None:
    """The member as the "data" filter would extract it, or an error for one that escapes."""
    if _DATA_FILTER is not None:
        filtered: tarfile.TarInfo | None = _DATA_FILTER(member, str(dest))
        return filtered
    return legacy_data_filter(member, dest)


def legacy_data_filter(member: tarfile.TarInfo, dest: Path) -> tarfile.TarInfo:
    """tarfile's "data" filter for Pythons without it: regular files, directories and links
    that stay inside ``dest``; no devices, no absolute or parent paths, no special mode bits."""
    root = dest.resolve()
    name = member.name.lstrip("/")
    if member.name.startswith("/") or os.path.isabs(member.name):
        raise ExternalCommandError(f"refusing {member.name!r}: an absolute path in the archive")
    target = (root / name).resolve()
    if target != root and root not in target.parents:
        raise ExternalCommandError(f"refusing {member.name!r}: it points outside {dest}")
    if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
        raise ExternalCommandError(f"refusing {member.name!r}: not a file, directory or link")
    if member.issym() or member.islnk():
        base = root / name if member.islnk() else (root / name).parent
        link_target = (
            (root / member.linkname) if member.islnk() else (base / member.linkname)
        ).resolve()
        if os.path.isabs(member.linkname) or (
            link_target != root and root not in link_target.parents
        ):
            raise ExternalCommandError(
                f"refusing {member.name!r}: its link {member.linkname!r} leaves {dest}"
            )
    safe = copy.copy(member)
    safe.name = name
    safe.uid = safe.gid = 0
    safe.uname = safe.gname = ""
    if member.isreg() or member.islnk():
        # Owner may read and write; group and others as archived but never write or set-id.
        safe.mode = (member.mode & 0o755) | 0o600
    elif member.isdir():
        safe.mode = (member.mode & 0o755) | 0o700
    return safe


def source_present(layout: BuildLayout) -> bool:
    return (layout.src / "CMakeLists.txt").is_file()


def unpack_source(layout: BuildLayout, reporter: Reporter) -> None:
    """Download, verify and unpack the pinned source. Call with the build lock held."""
    with tempfile.TemporaryDirectory(prefix="sdist.", dir=layout.root) as tmp:
        sdist = download_sdist(Path(tmp), layout, reporter)
        staging = Path(tmp) / "src"
        extract_vendor_tree(sdist, staging)
        # A half-unpacked tree never sits at src/: it appears whole or not at all.
        if layout.src.exists():
            shutil.rmtree(layout.src)
        staging.rename(layout.src)


# --- locking and the marker -----------------------------------------------------------------


@contextlib.contextmanager
def build_lock(layout: BuildLayout) -> Iterator[None]:
    """Hold the cache's lock: a second caller waits here instead of building twice."""
    with locked(layout.lock):
        yield


def read_marker(
    layout: BuildLayout, isa: InstructionSet | None = None
) -> Mapping[str, object] | None:
    """The marker of a finished build of the pinned source with this machine's options, or
    None. A build made under other options (``-DGGML_NATIVE=ON`` before, another CPU's
    instruction set) is not reused: it may not run here."""
    isa = isa or this_machine_instruction_set()
    try:
        data = file_reader.read_json(layout.marker)
    except UserError:
        return None
    if not isinstance(data, dict):
        return None
    if data.get("version") != LLAMA_CPP_PYTHON_VERSION:
        return None
    if data.get("sha256") != LLAMA_CPP_PYTHON_SDIST_SHA256:
        return None
    if data.get("cmake_options") != list(cmake_options(isa)):
        return None
    if not all(os.access(b, os.X_OK) for b in (layout.server, layout.quantize, layout.bench)):
        return None
    return data


def write_marker(
    layout: BuildLayout, version_line: str, isa: InstructionSet | None = None
) -> JsonObject:
    isa = isa or this_machine_instruction_set()
    data: JsonObject = {
        "version": LLAMA_CPP_PYTHON_VERSION,
        "sha256": LLAMA_CPP_PYTHON_SDIST_SHA256,
        "instruction_set": isa.name,
        "cmake_options": list(cmake_options(isa)),
        "commit": commit_of(version_line) or LLAMA_CPP_COMMIT,
        "version_line": version_line,
        "server": str(layout.server),
        "quantize": str(layout.quantize),
        "bench": str(layout.bench),
    }
    atomic_write(layout.marker, json.dumps(data, indent=2) + "\n")
    return data


def run_cmake(
    layout: BuildLayout, reporter: Reporter, isa: InstructionSet, jobs: int | None = None
) -> None:
    """Configure and build ``layout.src`` into ``layout.build``, output to ``layout.log``."""
    # Short step names: they label the bar, which needs the rest of an 80-column line.
    step = f"configure (cmake, {isa.name})"
    run_logged(cmake_configure_argv(layout, isa), layout.log, reporter, step)
    jobs = jobs or build_jobs()
    run_logged(cmake_build_argv(layout, jobs), layout.log, reporter, f"build (cmake -j{jobs})")


# --- the public entry points ----------------------------------------------------------------


def ensure_build(progress: bool = False, layout: BuildLayout | None = None) -> BuildLayout:
    """Build the pinned llama-server/llama-quantize unless a finished build is cached."""
    layout = layout or default_layout()
    isa = this_machine_instruction_set()
    if read_marker(layout, isa) is not None:
        return layout
    with build_lock(layout):
        # Whoever held the lock before us may have finished the build meanwhile.
        if read_marker(layout, isa) is not None:
            return layout
        reporter = make_reporter(progress)
        if not source_present(layout):
            unpack_source(layout, reporter)
        _forget_other_options(layout, isa)
        # An existing build dir of the same options is reused: configuring again changes
        # nothing, and cmake --build only redoes what is out of date, so an interrupted
        # build resumes where it stopped.
        run_cmake(layout, reporter, isa)
        write_marker(layout, binary_version_line(layout.server), isa)
    return layout


def _forget_other_options(layout: BuildLayout, isa: InstructionSet) -> None:
    """Remove a build directory configured with other options than ``isa``'s, then record
    ``isa``'s options in it.

    cmake keeps what an earlier configure cached (``GGML_NATIVE=ON`` adds -march=native), so
    a build made under other options is deleted, not configured over. A build of the same
    options that was interrupted resumes. Call with the lock held."""
    wanted = "\n".join(cmake_options(isa)) + "\n"
    try:
        recorded: str | None = file_reader.read_text(layout.options_record)
    except UserError:
        recorded = None
    if layout.build.exists() and recorded != wanted:
        shutil.rmtree(layout.build)
        layout.marker.unlink(missing_ok=True)
    layout.build.mkdir(parents=True, exist_ok=True)
    atomic_write(layout.options_record, wanted)


def ensure_source(progress: bool = False, layout: BuildLayout | None = None) -> BuildLayout:
    """Unpack the pinned source (no build) unless it is already there."""
    layout = layout or default_layout()
    if source_present(layout):
        return layout
    with build_lock(layout):
        if not source_present(layout):
            unpack_source(layout, make_reporter(progress))
    return layout


def _override(env: str) -> Path | None:
    value = os.environ.get(env)
    if not value:
        return None
    path = Path(value).expanduser()
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise UserError(
            Problem(
                env,
                "",
                f"{value} is not an executable file",
                f"point {env} at a built binary or unset it",
            )
        )
    return path


def find_llama_server(layout: BuildLayout | None = None) -> Path | None:
    """The binary to use if one is available without building, else None."""
    override = _override(SERVER_ENV)
    if override is not None:
        return override
    layout = layout or default_layout()
    return layout.server if read_marker(layout) is not None else None


def ensure_llama_server(progress: bool = False) -> Path:
    """Path of a llama-server binary: the override, the cached build, or a fresh build."""
    found = find_llama_server()
    if found is not None:
        return found
    return ensure_build(progress).server


def _beside_server(env: str, name: str) -> Path | None:
    """$ENV, else ``name`` beside $LLAMANIX_LLAMA_SERVER when it is there."""
    override = _override(env)
    if override is not None:
        return override
    server = _override(SERVER_ENV)
    if server is not None and os.access(server.parent / name, os.X_OK):
        return server.parent / name
    return None


def ensure_llama_quantize(progress: bool = False) -> Path:
    return _beside_server(QUANTIZE_ENV, "llama-quantize") or ensure_build(progress).quantize


def ensure_llama_bench(progress: bool = False) -> Path:
    """llama.cpp's own benchmark from the same build: the reference bench is checked against."""
    return _beside_server(BENCH_ENV, "llama-bench") or ensure_build(progress).bench


def vocab_dir(progress: bool = False) -> Path:
    """Directory of the vocab-only GGUFs (``ggml-vocab-*.gguf``) shipped with the source."""
    return ensure_source(progress).models


def vocab_names(progress: bool = False) -> list[str]:
    """Names accepted by vocab_file(): llama-spm, gpt-2, qwen2, ..."""
    prefix, suffix = "ggml-vocab-", ".gguf"
    found = vocab_dir(progress).glob(f"{prefix}*{suffix}")
    return sorted(p.name[len(prefix) : -len(suffix)] for p in found)


def vocab_file(name: str, progress: bool = False) -> Path:
    """``vocab_file("llama-spm")`` -> .../models/ggml-vocab-llama-spm.gguf."""
    path = vocab_dir(progress) / f"ggml-vocab-{name}.gguf"
    if not path.is_file():
        raise UserError(
            Problem(
                "llamanix testbed synth-model",
                "--vocab",
                f"no vocab file named {name!r}",
                f"use a path or one of: {', '.join(vocab_names())}",
            )
        )
    return path
