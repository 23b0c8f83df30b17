"""A host's generations as ``llamanix generations`` lists them: one row per generation, with
what systemd says now of the current one's units that do not serve.

The same rows come back from a remote host's agent as JSON (``generations --json``), so
``to_json`` and the codec's reading (``from_json_or_none(GenerationRow, data)``) are each
other's inverse and the table is drawn from either.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from llamanix.config.model import Config
from llamanix.core.json_codec import JSON_INLINE, json_default
from llamanix.core.json_value import JsonObject
from llamanix.hosts.managers import not_serving_now
from llamanix.state.generations import GenerationRecord, HostState


@dataclass(frozen=True)
class GenerationRow:
    """One generation's row; read back without a generation number, it is none."""

    number: int
    current: bool = field(metadata=json_default(False))
    # The record's parts sit beside the row's own keys.
    record: GenerationRecord = field(metadata=JSON_INLINE)
    # For the current generation: {instance: why} of its units that do not serve now.
    not_serving_now: dict[str, str] = field(metadata=json_default({}))

    # Hand-written: the record's parts sit beside the row's own keys, sorted as on disk.
    def to_json(self) -> JsonObject:
        record = self.record
        found: JsonObject = json.loads(
            # The keys in the order of the record on disk (sorted), so the listing reads like
            # the state files.
            json.dumps(
                {
                    "instances": {n: e.to_json() for n, e in record.instances.items()},
                    "gate": record.gate.to_json() if record.gate else {},
                    "rollback": record.rollback.to_json() if record.rollback else None,
                    "gaps": {n: g.to_json() for n, g in (record.gaps or {}).items()},
                    "warm": {n: w.to_json() for n, w in (record.warm or {}).items()},
                },
                sort_keys=True,
            )
        )
        return {
            "number": self.number,
            "current": self.current,
            "date": record.date,
            "instances": found["instances"],
            "gate": found["gate"],
            "rollback": found["rollback"],
            "gaps": found["gaps"],
            "warm": found["warm"],
            "not_serving_now": dict(self.not_serving_now),
        }


def generation_rows(config: Config | None, state: HostState) -> list[GenerationRow]:
    """Every generation of the host, oldest first. ``config``: the host's config, to ask its
    manager about the current generation's units (None: nothing is asked)."""
    current = state.current()
    now = not_serving_now(config, state.host, state) if config is not None else {}
    return [
        GenerationRow(
            gen.number,
            current is not None and current.number == gen.number,
            gen.record,
            now if current is not None and current.number == gen.number else {},
        )
        for gen in state.generations()
    ]
