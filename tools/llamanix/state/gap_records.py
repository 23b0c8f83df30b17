"""What a restart cost the clients of one server, as switches report and generations keep it
(``llamanix.server.drain`` measures it; docs/switching.md explains it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from llamanix.core.json_codec import OMIT_NONE, JsonRecord


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
    # How long the port refused new requests from other machines (external.nft's fence: from
    # before the drain until the new server served, its caches restored); None: no fence, and
    # ``no_fence`` says why (where one was wanted).
    fenced_s: float | None = field(default=None, metadata=OMIT_NONE)
    no_fence: str | None = field(default=None, metadata=OMIT_NONE)
    # A blue-green switch: the port its bridge served on while the unit restarted; ``gap_s`` is
    # then the longest time in which neither the port nor the bridge answered.
    bridge_port: int | None = field(default=None, metadata=OMIT_NONE)
    # Why a switch asked for blue-green restarted this instance as usual.
    no_bridge: str | None = field(default=None, metadata=OMIT_NONE)
    # A blue-green switch's steps, when each ended (time.monotonic() of the host): the bridge
    # served, the port was handed to it, the unit served again, the port came back, the
    # bridge stopped.
    steps: Mapping[str, float] | None = field(default=None, metadata=OMIT_NONE)

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
        if self.bridge_port is not None:
            parts.append(f"blue-green through port {self.bridge_port}")
        elif self.no_bridge is not None:
            parts.append(f"not blue-green: {self.no_bridge}")
        if self.fenced_s is not None:
            parts.append(f"out of rotation {_s(self.fenced_s)}")
        elif self.no_fence is not None:
            parts.append(f"not taken out of rotation: {self.no_fence}")
        return ", ".join(parts)


def _s(value: float | None) -> str:
    return "?" if value is None else f"{value:.2f} s"
