"""Numbered generations of a host's installed units, with the gate's verdict on each.

The state lives beside the config, in ``.llamanix-state/HOST/``:

- ``generations/N/files/``: everything the render produced (units, ``NAME.argv.json``,
  ``manifest.json``); ``generations/N/config.toml`` (or ``.json``): the config it came from;
  ``generations/N/result.json``: date, instances (variant, source revision), the gate's result.
- ``current``: the number of the generation that is serving.
- ``manager.json``: how this host was switched last (so ``rollback`` does the same).
- ``bench/NAME.json``: the last successful bench of an instance (its runs' decode tok/s,
  ``samples``, and their median ``tok_s``): the ``--max-regression`` baseline when the instance
  does not answer to be measured fresh before a switch.

A generation directory is assembled under a temporary name and renamed into place, and every
single file is written atomically, so a crash never leaves a half-written generation. What a
killed switch can leave is tidied by :meth:`HostState.recover`, which the next switch or rollback
of the host runs under the host's lock (docs/switching.md, "Crash consistency"):

- a staging directory ``generations/.N.tmp`` (never visible: its number is free again);
- the temporary file of an atomic write that was killed before its rename;
- a generation whose gate is still "pending": its switch died before the verdict, so it is
  marked "interrupted" (never a rollback target; its number stays used).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from llamanix.core.errors import Problem, UserError
from llamanix.deploy.crash_point import crash_point
from llamanix.external.files import atomic_write

STATE_DIR = ".llamanix-state"
FILES = "files"
RESULT = "result.json"
# The gate verdict of a generation whose switch died before the gate finished.
INTERRUPTED = "interrupted"


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _write_json(path: Path, data: Any) -> None:
    atomic_write(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Generation:
    number: int
    path: Path

    @property
    def result(self) -> dict[str, Any]:
        data = _read_json(self.path / RESULT)
        return data if isinstance(data, dict) else {}

    @property
    def gate(self) -> str:
        gate = self.result.get("gate") or {}
        return str(gate.get("result", "unknown"))

    def files(self) -> dict[str, str]:
        folder = self.path / FILES
        if not folder.is_dir():
            return {}
        return {p.name: p.read_text() for p in sorted(folder.iterdir()) if p.is_file()}

    def config_snapshot(self) -> Path | None:
        found = sorted(self.path.glob("config.*"))
        return found[0] if found else None

    def update(self, **changes: Any) -> None:
        _write_json(self.path / RESULT, {**self.result, **changes})


@dataclass(frozen=True)
class HostState:
    """The state directory of one host of one config."""

    root: Path
    host: str

    @staticmethod
    def beside(config: Path, host: str) -> HostState:
        return HostState(config.resolve().parent / STATE_DIR / host, host)

    @property
    def generations_dir(self) -> Path:
        return self.root / "generations"

    def generations(self) -> list[Generation]:
        if not self.generations_dir.is_dir():
            return []
        found = [
            Generation(int(p.name), p)
            for p in self.generations_dir.iterdir()
            if p.name.isdigit() and p.is_dir()
        ]
        return sorted(found, key=lambda g: g.number)

    def get(self, number: int) -> Generation:
        for gen in self.generations():
            if gen.number == number:
                return gen
        known = ", ".join(str(g.number) for g in self.generations()) or "none yet"
        raise UserError(
            Problem(
                str(self.generations_dir),
                "--to",
                f"host '{self.host}' has no generation {number}",
                f"known: {known}",
            )
        )

    def current(self) -> Generation | None:
        try:
            number = int((self.root / "current").read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        path = self.generations_dir / str(number)
        return Generation(number, path) if path.is_dir() else None

    def set_current(self, gen: Generation) -> None:
        atomic_write(self.root / "current", f"{gen.number}\n")

    def create(
        self,
        files: dict[str, str],
        config_text: str,
        config_suffix: str,
        result: dict[str, Any],
    ) -> Generation:
        """A new numbered generation, complete on disk before it becomes visible."""
        self.generations_dir.mkdir(parents=True, exist_ok=True)
        existing = self.generations()
        number = existing[-1].number + 1 if existing else 1
        staging = self.generations_dir / f".{number}.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        (staging / FILES).mkdir(parents=True)
        for name, text in files.items():
            atomic_write(staging / FILES / name, text)
        atomic_write(staging / f"config{config_suffix}", config_text)
        _write_json(staging / RESULT, {"number": number, "date": now(), **result})
        crash_point("generation:before-rename")
        os.replace(staging, self.generations_dir / str(number))
        _fsync_dir(self.generations_dir)  # the rename itself survives a power cut too
        return Generation(number, self.generations_dir / str(number))

    def recover(self) -> list[str]:
        """Tidy what a killed switch or rollback left; one line per thing done.

        Only for a caller that holds the host's lock: then no other switch is half-way, so a
        staging directory, a temporary file or a "pending" verdict can only be a dead one's.
        """
        notes: list[str] = []
        if self.generations_dir.is_dir():
            for staging in sorted(self.generations_dir.glob(".*.tmp")):
                shutil.rmtree(staging, ignore_errors=True)
                notes.append(f"removed {staging.name}, a generation a killed switch never finished")
        generations = self.generations()
        folders = [self.root, self.root / "bench", *(g.path for g in generations)]
        for folder in folders:
            # atomic_write's temporary files: ``.NAME.RANDOM.tmp`` beside NAME.
            for tmp in folder.glob(".*.tmp") if folder.is_dir() else ():
                if tmp.is_file():
                    tmp.unlink(missing_ok=True)
        for gen in generations:
            if gen.gate == "pending":
                gate = gen.result.get("gate") or {}
                gen.update(gate={**gate, "result": INTERRUPTED}, interrupted=now())
                notes.append(
                    f"generation {gen.number}: its switch was killed before the gate finished; "
                    f"marked {INTERRUPTED}"
                )
        return notes

    def previous_good(self, before: int) -> Generation | None:
        """The newest generation older than ``before`` whose gate passed (or was not run)."""
        for gen in reversed(self.generations()):
            if gen.number < before and gen.gate in ("passed", "unverified", "rollback target"):
                return gen
        return None

    # -- how the host was switched --------------------------------------------------------

    def manager(self) -> dict[str, str]:
        data = _read_json(self.root / "manager.json")
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}

    def set_manager(self, data: dict[str, str]) -> None:
        _write_json(self.root / "manager.json", data)

    # -- bench baselines --------------------------------------------------------------------

    def baseline(self, instance: str) -> dict[str, Any] | None:
        data = _read_json(self.root / "bench" / f"{instance}.json")
        return data if isinstance(data, dict) else None

    def save_baseline(self, instance: str, data: dict[str, Any]) -> None:
        _write_json(self.root / "bench" / f"{instance}.json", {"date": now(), **data})
