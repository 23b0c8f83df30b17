"""``llamanix up``'s status file: its record, its reader and its writer. The supervisor writes
it; the managers and ``plan`` read it without importing the supervisor (and the server process
and HTTP client behind it)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from llamanix.core import file_reader
from llamanix.core.errors import Problem, UserError
from llamanix.core.json_codec import JsonRecord
from llamanix.core.json_fields import integer, table
from llamanix.external.files import atomic_write
from llamanix.external.process import alive

STATUS = "up-status.json"

UpState = Literal["starting", "running", "restarting", "failed", "exited", "stopped"]
UP_STATES: tuple[UpState, ...] = get_args(UpState)
# States in which an instance has finished its start attempt (switch waits for one of these).
SETTLED: tuple[UpState, ...] = ("running", "restarting", "failed", "exited")


@dataclass(frozen=True)
class UpInstance(JsonRecord):
    """One instance as ``up`` runs it: what it runs (``key``), its state and the last error."""

    key: str  # the spec's key: changes when its command line, environment or policy does
    state: UpState
    pid: int | None
    url: str | None
    starts: int
    last_error: str | None

    @property
    def settled(self) -> bool:
        return self.state in SETTLED


@dataclass(frozen=True)
class UpStatus(JsonRecord):
    """The whole file: the ``up`` process, the manifest it runs (its sha256; None before it
    has read one) and each instance it runs."""

    pid: int
    manifest: str | None
    instances: Mapping[str, UpInstance]


def read_status(units_dir: Path) -> UpStatus | None:
    """``up``'s status file, or None when no live ``up`` owns this directory.

    A file whose ``up`` is gone is stale, whatever it holds. One that a live ``up`` wrote but
    that does not read as a status (an ``up`` of another llamanix version) is an error: waiting
    on it or starting a second ``up`` beside it would both be wrong.
    """
    path = units_dir / STATUS
    try:
        data = file_reader.json_if_present(path, source=str(path))
    except file_reader.FileRefused:
        return None  # not a status any up wrote (its writes are atomic): none is live here
    if data is None:
        return None
    pid = integer(table(data).get("pid"))
    if pid is None or not alive(pid):
        return None
    try:
        return UpStatus.from_json(data, "up")
    except ValueError as err:
        field, _, expected = str(err).partition(": ")
        raise UserError(
            Problem(
                str(path),
                field.removeprefix("up."),
                f"{expected}: not a status this llamanix reads",
                f"stop that llamanix up (pid {pid}) and start it with this version",
            )
        ) from None


def write_status(units_dir: Path, status: UpStatus) -> None:
    """Replace the file at once (readers poll it while ``up`` writes)."""
    atomic_write(units_dir / STATUS, json.dumps(status.to_json(), indent=2) + "\n")
