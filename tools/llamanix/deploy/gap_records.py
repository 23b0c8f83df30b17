"""What a restart cost the clients of one server, as switches report and generations keep it
(``llamanix.measure.drain`` measures it; docs/switching.md explains it)."""

from __future__ import annotations

from dataclasses import dataclass

from llamanix.core.json_codec import JsonRecord


@dataclass(frozen=True)
class GapRecord(JsonRecord):
    """One instance's restart: seconds, None where not measured. Read back leniently
    (``from_json_lenient``): a field a killed switch left out is not measured."""

    # From the old server's last answer to the new server's first.
    gap_s: float | None
    # From the new server's process start to its first answer.
    load_s: float | None
    # How long the drain waited, and whether it found the server idle; None: nothing was
    # drained (the instance is new, or was not running).
    drain_s: float | None = None
    drained: bool | None = None
    # Requests still in flight when --drain-timeout ended the wait.
    in_flight: int | None = None

    def describe(self) -> str:
        parts = [
            f"gap {_s(self.gap_s)}",
            f"load {_s(self.load_s)}",
        ]
        if self.drained is True:
            parts.append(f"drained in {_s(self.drain_s)}")
        elif self.drained is False:
            left = "unknown" if self.in_flight is None else str(self.in_flight)
            parts.append(f"drain gave up after {_s(self.drain_s)} ({left} in flight)")
        return ", ".join(parts)


def _s(value: float | None) -> str:
    return "?" if value is None else f"{value:.2f} s"
