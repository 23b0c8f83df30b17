"""Verdicts a drifting machine cannot fake: a regression is confirmed before it counts.

On the CPU test bed (``llamanix up``, the real llama-server, a tiny synthetic model), two
switches gated with ``--max-regression 50``:

- a change that does nothing (an environment variable), with a slowdown injected between the
  phases: once the baseline is measured, the instance's server (whichever process runs it) is
  stopped 85% of the time (a real-time thread keeps that duty cycle on a loaded machine). The
  candidate measures far slower than the baseline, the switch rolls back, measures the
  baseline again, finds it as slow as the candidate, and calls it "inconclusive: the baseline
  moved by X%": the switch stands (--on-drift keep, the default).
- a real regression (a model with four times the layers), with no slowdown: rolled back, and
  the baseline measured again confirms it.

Each records all three measurements (baseline, candidate, baseline again) in its generation.
The slowdown is a duty cycle of SIGSTOP and SIGCONT rather than competing load, so its size
does not depend on what else this shared machine runs: both sides of the second comparison
see the same slowdown.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import HOST_FIGURES

from llamanix.server.server_process import free_port
from llamanix.testbed.synth import SynthSpec, synth_model
from llamanix.testbed.up_process import instance_status, running_up

pytestmark = pytest.mark.server

FAST = SynthSpec(layers=8, embd=512, ff=1536, heads=4, kv_heads=4, seed=1)
SLOW = SynthSpec(layers=32, embd=512, ff=1536, heads=4, kv_heads=4, seed=1)
GATE = ("--max-regression", "50", "--max-runs", "8")


class Slowdown:
    """Stops the instance's server ``stopped_s`` of every ``period_s`` until ``stop``: its pid
    comes from up's status, looked up again every half second, so it follows the server
    across restarts."""

    def __init__(self, units: Path, stopped_s: float = 0.085, period_s: float = 0.1) -> None:
        self.units = units
        self.stopped_s, self.running_s = stopped_s, period_s - stopped_s
        self.done = threading.Event()
        self.cycles = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.done.set()
        self.thread.join(timeout=10)

    def _run(self) -> None:
        # Real-time priority where allowed (root): the duty cycle holds on a loaded machine,
        # where an ordinary thread's short sleeps would stretch with the load.
        with contextlib.suppress(OSError, AttributeError):
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        pid, looked = None, 0.0
        while not self.done.is_set():
            if pid is None or time.monotonic() - looked > 0.5:
                entry = instance_status(self.units, "chat")
                pid, looked = (entry.pid if entry is not None else None), time.monotonic()
            if pid is None:
                time.sleep(0.05)
                continue
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                pid = None
                continue
            try:
                time.sleep(self.stopped_s)
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            self.cycles += 1
            time.sleep(self.running_s)


@pytest.fixture(scope="module")
def bed(
    tmp_path_factory: pytest.TempPathFactory, llama_server_bin: Path
) -> Iterator[tuple[Path, Path]]:
    work = tmp_path_factory.mktemp("gate-drift")
    fast = synth_model(FAST, work / "fast.gguf")
    slow = synth_model(SLOW, work / "slow.gguf")
    (work / "llamanix.toml").write_text(
        f'[hosts.dev]\nkind = "systemd"\nbinaries = {{ upstream = "{llama_server_bin}" }}\n\n'
        f'[instances.chat]\nmodel = "{fast}"\nport = {free_port()}\ncontext = 512\nthreads = 1\n'
    )
    with running_up(work / "llamanix.toml", "dev", "chat", deadline_s=180):
        yield work, slow


def switch(work: Path, *args: str, slowdown: Slowdown | None = None) -> tuple[int, Any, str]:
    """``llamanix switch`` with its progress read as it comes: the slowdown starts once the
    baseline is measured, and ends with the switch."""
    argv = [sys.executable, "-m", "llamanix", "switch", "llamanix.toml", "--host", "dev"]
    argv += ["--manager", "up", "--json", *GATE, *args]
    proc = subprocess.Popen(
        argv, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stderr is not None and proc.stdout is not None
    lines: list[str] = []
    try:
        for line in proc.stderr:
            lines.append(line)
            if slowdown is not None and line.startswith("  baseline chat: "):
                slowdown.start()
        out = proc.stdout.read()
        code = proc.wait(timeout=600)
    finally:
        if slowdown is not None:
            slowdown.stop()
        if proc.poll() is None:
            proc.kill()
    return code, json.loads(out), "".join(lines)


def generation(work: Path, number: int) -> dict[str, Any]:
    path = work / ".llamanix-state" / "dev" / "generations" / str(number) / "result.json"
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def current(work: Path) -> int:
    return int((work / ".llamanix-state" / "dev" / "current").read_text().strip())


def three_measurements(bench: dict[str, Any]) -> tuple[float, float, float]:
    """The medians of the baseline, the candidate and the baseline measured again."""
    assert len(bench["baseline"]["samples"]) >= 5 and len(bench["samples"]) >= 5
    assert "baseline_after" in bench, bench
    assert len(bench["baseline_after"]["samples"]) >= 5
    return bench["baseline"]["median"], bench["median"], bench["baseline_after"]["median"]


def test_a_no_change_switch_on_a_machine_that_slowed_down_is_not_a_regression(
    bed: tuple[Path, Path],
) -> None:
    work, _ = bed
    units = work / ".llamanix-state" / "dev" / "up"
    slowdown = Slowdown(units)
    code, out, err = switch(
        work, "--set", 'instances.chat.environment.LLAMANIX_NOTHING="1"', slowdown=slowdown
    )
    assert slowdown.cycles > 10, err[-3000:]
    assert code == 0, err[-3000:]
    (row,) = out
    bench = row["gate"]["chat"]["bench"]
    first, candidate, again = three_measurements(bench)
    # The slowdown came between the phases: the candidate measured far below the first
    # baseline, and the baseline measured again matched it.
    assert candidate < 0.5 * first and again < 0.5 * first, (first, candidate, again)
    HOST_FIGURES.append(
        f"gate drift, no-change switch slowed between the phases: baseline {first:.0f}, "
        f"candidate {candidate:.0f}, baseline again {again:.0f} tok/s: {bench.get('verdict')}"
    )
    assert bench["decision"] == "inconclusive" and bench["action"] == "keep", bench
    assert bench["verdict"].startswith("inconclusive: the baseline moved by -"), bench
    assert bench["baseline_moved_pct"] < -50
    assert "inconclusive: the baseline moved by" in err
    assert "activating generation" in err
    # The switch stands: its generation is current, with all three measurements recorded.
    assert current(work) == row["generation"]
    recorded = generation(work, row["generation"])["gate"]["instances"]["chat"]["bench"]
    assert three_measurements(recorded) == (first, candidate, again)


def test_a_real_regression_is_confirmed_and_rolled_back(bed: tuple[Path, Path]) -> None:
    work, slow = bed
    before = current(work)
    code, out, err = switch(work, "--set", f'instances.chat.model="{slow}"')
    assert code == 1, err[-3000:]
    (row,) = out
    bench = row["gate"]["chat"]["bench"]
    first, candidate, again = three_measurements(bench)
    HOST_FIGURES.append(
        f"gate drift, real regression (4x the layers): baseline {first:.0f}, candidate "
        f"{candidate:.0f}, baseline again {again:.0f} tok/s: {bench.get('verdict')}"
    )
    assert candidate < 0.5 * again, (first, candidate, again)
    assert bench["decision"] == "regression" and bench["action"] == "rollback", bench
    assert bench["verdict"] == "regression (confirmed)"
    assert "regression (confirmed)" in err
    assert current(work) == before
    recorded = generation(work, row["generation"])["gate"]["instances"]["chat"]["bench"]
    assert three_measurements(recorded) == (first, candidate, again)
