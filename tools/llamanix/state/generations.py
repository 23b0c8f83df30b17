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

import errno
import json
import os
import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal, get_args

from llamanix.core import file_reader
from llamanix.core.errors import Problem, UserError
from llamanix.core.json_codec import (
    OMIT_NONE,
    JsonRecord,
    from_json_lenient,
    from_json_or_none,
    json_via,
)
from llamanix.core.json_value import JsonObject
from llamanix.core.state_dir import STATE_DIR, host_state_root
from llamanix.external.clock import now
from llamanix.external.files import WriteFailed, atomic_write
from llamanix.render.changes import RenderFiles
from llamanix.render.manifest import ManifestInstance
from llamanix.state.crash_point import crash_point
from llamanix.state.gap_records import GapRecord
from llamanix.state.gate_records import BaselineRecord, GateKind, GateResult
from llamanix.state.warm_records import WarmRecord

FILES = "files"
RESULT = "result.json"

# A generation's gate verdict: "pending" while its switch runs the gate; "unverified" for units
# found installed before the first switch (no gate ever ran on them); "interrupted" when the
# switch died before the verdict.
GateOutcome = Literal["pending", "passed", "failed", "unverified", "interrupted"]
GATE_OUTCOMES: tuple[GateOutcome, ...] = get_args(GateOutcome)
INTERRUPTED: GateOutcome = "interrupted"
# What a rollback may go back to: a generation that served when it was recorded.
ROLLBACK_TARGETS: tuple[GateOutcome, ...] = ("passed", "unverified")

# How units reach a host: its kind's own tool, or `llamanix up` watching a directory.
ManagerKind = Literal["nixos", "systemd", "systemd-user", "up"]
MANAGERS: tuple[ManagerKind, ...] = get_args(ManagerKind)


# What to do about a state file that does not read: it was not written by llamanix (whose
# writes are atomic), so it is named, never taken for no record.
_GENERATION_FIX = "restore it from a backup, or remove this generation's directory"
_MANAGER_FIX = "remove it, and pass --manager to the next switch, which records it again"
_BASELINE_FIX = "remove it: the next bench before a switch records it again"
_CURRENT_FIX = "write into it the number of the generation that serves, as generations lists"


def _unreadable(err: UserError, fix: str) -> UserError:
    problem = err.problems[0]
    return UserError(Problem(problem.source, "", f"not a llamanix record: {problem.message}", fix))


def _read_json(path: Path, fix: str) -> object:
    """A record's JSON, or None when there is none."""
    try:
        return file_reader.json_if_present(path, source=str(path))
    except file_reader.FileRefused as err:
        raise _unreadable(err, fix) from None


def _write_json(path: Path, data: object) -> None:
    atomic_write(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --- the records -------------------------------------------------------------------------


@dataclass(frozen=True)
class ManagerRecord(JsonRecord):
    """How a host was switched (``manager.json``, and each generation's ``manager``), so that
    rollback and the next switch go the same way."""

    manager: ManagerKind
    units_dir: str | None = field(default=None, metadata=OMIT_NONE)  # systemd, user, up
    flake: str | None = field(default=None, metadata=OMIT_NONE)  # nixos


@dataclass(frozen=True)
class InstanceSummary(JsonRecord):
    """One instance as a generation lists it."""

    variant: str | None
    source_revision: str | None
    port: int | None

    @staticmethod
    def of(entry: ManifestInstance) -> InstanceSummary:
        return InstanceSummary(entry.variant, entry.source_revision, entry.port)


def _results_json(results: Mapping[str, GateResult]) -> JsonObject:
    return {name: r.to_json() for name, r in results.items()}


def _results_from_json(data: object) -> dict[str, GateResult]:
    """Each instance's result, keyed by its name (which a GateResult's JSON leaves out);
    those this version cannot read are left out."""
    if not isinstance(data, dict):
        raise ValueError("expected an object")
    read = {str(n): from_json_or_none(GateResult, r, name=str(n)) for n, r in data.items()}
    return {n: r for n, r in read.items() if r is not None}


@dataclass(frozen=True)
class GateRecord(JsonRecord):
    """A generation's gate: its verdict, which gate ran, and each gated instance's result
    (absent until the gate finished)."""

    result: GateOutcome
    kind: GateKind | None = field(default=None, metadata=OMIT_NONE)
    instances: Mapping[str, GateResult] | None = field(
        default=None, metadata=json_via(_results_json, _results_from_json, omit_none=True)
    )


@dataclass(frozen=True)
class RollbackRecord(JsonRecord):
    """What restoring the previous generation after a failed gate achieved."""

    serving_again: bool


@dataclass(frozen=True)
class GenerationRecord(JsonRecord):
    """``generations/N/result.json``. Every field but ``instances`` may be absent: a record is
    written when the generation is created and updated as its switch goes on, and is read
    back leniently, whatever a killed switch left of it (a missing file reads as an empty
    record; a part this version cannot read, as absent)."""

    instances: Mapping[str, InstanceSummary] = field(default_factory=dict)
    gate: GateRecord | None = field(default=None, metadata=OMIT_NONE)
    changed: tuple[str, ...] | None = field(default=None, metadata=OMIT_NONE)
    removed: tuple[str, ...] | None = field(default=None, metadata=OMIT_NONE)
    manager: ManagerRecord | None = field(default=None, metadata=OMIT_NONE)
    note: str | None = field(default=None, metadata=OMIT_NONE)
    rollback: RollbackRecord | None = field(default=None, metadata=OMIT_NONE)
    # Set by HostState.create, and by rollback and recovery as they happen.
    number: int | None = field(default=None, metadata=OMIT_NONE)
    date: str | None = field(default=None, metadata=OMIT_NONE)
    activated_again: str | None = field(default=None, metadata=OMIT_NONE)
    interrupted: str | None = field(default=None, metadata=OMIT_NONE)
    # Each restarted instance's gap (docs/switching.md), where the switch measured it.
    gaps: Mapping[str, GapRecord] | None = field(default=None, metadata=OMIT_NONE)
    # What each warm_switch instance kept of its caches.
    warm: Mapping[str, WarmRecord] | None = field(default=None, metadata=OMIT_NONE)

    @property
    def outcome(self) -> GateOutcome | None:
        return self.gate.result if self.gate else None


@dataclass(frozen=True)
class Generation:
    number: int
    path: Path

    @property
    def record(self) -> GenerationRecord:
        data = _read_json(self.path / RESULT, _GENERATION_FIX)
        # Every field has a default: only what is not an object at all reads as None.
        return from_json_or_none(GenerationRecord, data) or GenerationRecord()

    @property
    def outcome(self) -> GateOutcome | None:
        return self.record.outcome

    def files(self) -> dict[str, str]:
        """The render's files as recorded (``render_files``)."""
        return self.render_files().files

    def render_files(self) -> RenderFiles:
        """The render's files as recorded, with their manifest parsed once; a manifest among
        them that does not read is one line naming it (what each switch and rollback compares
        with must be what it says)."""
        folder = self.path / FILES
        if not folder.is_dir():
            return RenderFiles({})
        found: dict[str, str] = {}
        for p in sorted(folder.iterdir()):
            try:
                found[p.name] = file_reader.read_text(p, source=str(p))
            except file_reader.FileRefused as err:
                raise _unreadable(err, _GENERATION_FIX) from None
        return RenderFiles.read_back(found, folder)

    def config_snapshot(self) -> Path | None:
        found = sorted(self.path.glob("config.*"))
        return found[0] if found else None

    def save(self, record: GenerationRecord) -> None:
        """Replace the record (read it, ``dataclasses.replace`` what changed, save it)."""
        _write_json(self.path / RESULT, record.to_json())


@dataclass(frozen=True)
class HostState:
    """The state directory of one host of one config."""

    root: Path
    host: str

    @staticmethod
    def beside(config: Path, host: str) -> HostState:
        return HostState(host_state_root(config, host), host)

    @staticmethod
    def as_named(config: Path, host: str) -> HostState:
        """The host's state as the user named the config (the directory beside it, neither
        resolved nor checked): what a dry run names."""
        return HostState(config.parent / STATE_DIR / host, host)

    @property
    def generations_dir(self) -> Path:
        return self.root / "generations"

    @property
    def up_dir(self) -> Path:
        """``llamanix up``'s render directory for this host (its manifest, units, status)."""
        return self.root / "up"

    @property
    def bench_dir(self) -> Path:
        return self.root / "bench"

    def baseline_path(self, instance: str) -> Path:
        """An instance's last good bench (``bench/NAME.json``)."""
        return self.bench_dir / f"{instance}.json"

    def records_stamp(self) -> tuple[int, ...]:
        """When the records last changed (``current``, the generations, the newest three
        results: a record is rewritten in place as its switch goes on, its verdict, its gaps),
        so that a reader keeping figures of them reads them again only when it changes."""
        root = self.root
        stamp = tuple(
            p.stat().st_mtime_ns for p in (root / "current", self.generations_dir) if p.exists()
        )
        if self.generations_dir.is_dir():
            newest = sorted(self.generations_dir.glob(f"*/{RESULT}"))[-3:]
            stamp += tuple(p.stat().st_mtime_ns for p in newest)
        return stamp

    def generations(self) -> list[Generation]:
        if not self.generations_dir.is_dir():
            return []
        # ASCII digits only: int() reads "²" or "٣" too, which are no generation llamanix made.
        found = [
            Generation(int(p.name), p)
            for p in self.generations_dir.iterdir()
            if p.name.isascii() and p.name.isdigit() and p.is_dir()
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
        pointer = self.root / "current"
        try:
            text = file_reader.text_if_present(pointer, source=str(pointer))
        except file_reader.FileRefused as err:
            raise _unreadable(err, _CURRENT_FIX) from None
        if text is None:
            return None
        if not (text.strip().isascii() and text.strip().isdigit()):
            raise UserError(Problem(str(pointer), "", "not a generation number", _CURRENT_FIX))
        number = int(text.strip())
        path = self.generations_dir / str(number)
        return Generation(number, path) if path.is_dir() else None

    def set_current(self, gen: Generation) -> None:
        atomic_write(self.root / "current", f"{gen.number}\n")

    def create(
        self,
        files: dict[str, str],
        config_text: str,
        config_suffix: str,
        record: GenerationRecord,
        config_mode: int = 0o600,
    ) -> Generation:
        """A new numbered generation, complete on disk before it becomes visible. Its copy of
        the config gets ``config_mode`` (the file's own: readable by no more users)."""
        self.generations_dir.mkdir(parents=True, exist_ok=True)
        existing = self.generations()
        number = existing[-1].number + 1 if existing else 1
        staging = self.generations_dir / f".{number}.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        try:
            try:
                (staging / FILES).mkdir(parents=True)
            except OSError as err:
                raise WriteFailed(staging / FILES, err) from None
            for name, text in files.items():
                atomic_write(staging / FILES / name, text)
            atomic_write(staging / f"config{config_suffix}", config_text, mode=config_mode)
            _write_json(staging / RESULT, replace(record, number=number, date=now()).to_json())
        except WriteFailed:
            shutil.rmtree(staging, ignore_errors=True)  # a full disk leaves no half generation
            raise
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
        folders = [self.root, self.bench_dir, *(g.path for g in generations)]
        for folder in folders:
            # atomic_write's temporary files: ``.NAME.RANDOM.tmp`` beside NAME.
            for tmp in folder.glob(".*.tmp") if folder.is_dir() else ():
                if tmp.is_file():
                    tmp.unlink(missing_ok=True)
        for gen in generations:
            record = gen.record
            if record.gate is not None and record.gate.result == "pending":
                gate = replace(record.gate, result=INTERRUPTED)
                gen.save(replace(record, gate=gate, interrupted=now()))
                notes.append(
                    f"generation {gen.number}: its switch was killed before the gate finished; "
                    f"marked {INTERRUPTED}"
                )
        return notes

    @contextmanager
    def all_or_nothing(self) -> Iterator[None]:
        """Writes to this state (new generations, ``current``, ``manager.json``) that all
        happen or, where one fails (a full disk), none: the generations made inside are
        removed and the two files put back as they were, then the failure goes on."""
        kept = {name: self._raw(name) for name in ("current", "manager.json")}
        numbers = {g.number for g in self.generations()}
        try:
            yield
        except BaseException:
            # Nothing is activated yet: whatever failed (a full disk, a config that cannot be
            # rewritten as its owner set it up, Ctrl-C), the state goes back as it was.
            for gen in self.generations():
                if gen.number not in numbers:
                    shutil.rmtree(gen.path, ignore_errors=True)
            for name, data in kept.items():
                if data is None:
                    (self.root / name).unlink(missing_ok=True)
                elif self._raw(name) != data:
                    atomic_write(self.root / name, data)  # the removals above made room
            raise

    def _raw(self, name: str) -> bytes | None:
        try:
            return file_reader.read_bytes(self.root / name, source=str(self.root / name))
        except file_reader.FileRefused as err:
            if err.errno == errno.ENOENT:
                return None
            raise

    def previous_good(self, before: int) -> Generation | None:
        """The newest generation older than ``before`` whose gate passed (or was not run)."""
        for gen in reversed(self.generations()):
            if gen.number < before and gen.outcome in ROLLBACK_TARGETS:
                return gen
        return None

    # -- how the host was switched --------------------------------------------------------

    def manager(self) -> ManagerRecord | None:
        # None when the record names no manager this version knows.
        return from_json_or_none(
            ManagerRecord, _read_json(self.root / "manager.json", _MANAGER_FIX)
        )

    def set_manager(self, record: ManagerRecord) -> None:
        _write_json(self.root / "manager.json", record.to_json())

    # -- bench baselines --------------------------------------------------------------------

    def baseline(self, instance: str) -> BaselineRecord | None:
        data = _read_json(self.baseline_path(instance), _BASELINE_FIX)
        return from_json_lenient(BaselineRecord, data) if isinstance(data, dict) else None

    def save_baseline(self, instance: str, record: BaselineRecord) -> None:
        _write_json(self.baseline_path(instance), record.to_json())
