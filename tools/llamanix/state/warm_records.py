"""What a warm switch kept of one server's caches, as switches report and generations keep it
(``hosts.warm`` does it; docs/switching.md explains it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from llamanix.core.json_codec import OMIT_NONE, JsonRecord

# How much of one instance's caches a warm switch saves at most, by default (GiB).
DEFAULT_LIMIT_GIB = 16.0

# What became of one slot's cache.
SlotOutcome = Literal[
    "restored",  # the new server holds as many tokens as the old one saved
    "restore did nothing",  # the restore answered, and no token is in the slot
    "restore incomplete",  # the restore answered with another token count than was saved
    "not restored",  # the restore failed (the server's error is the reason)
    "not saved",  # the save failed, or would have passed the size limit
]
SLOT_OUTCOMES: tuple[SlotOutcome, ...] = get_args(SlotOutcome)


@dataclass(frozen=True)
class WarmSlot(JsonRecord):
    """One slot's cache across the restart."""

    slot: int
    tokens: int  # what the old server's slot held
    outcome: SlotOutcome
    bytes: int | None = None  # the file the old server wrote
    restored: int | None = None  # tokens the new server says it restored
    save_ms: float | None = None
    restore_ms: float | None = None
    why: str | None = field(default=None, metadata=OMIT_NONE)


@dataclass(frozen=True)
class WarmRecord(JsonRecord):
    """One instance's caches across its restart. ``cold``: why none were kept (the switch was
    cold), None when they were saved and restored slot by slot (``slots``)."""

    cold: str | None = None
    slots: tuple[WarmSlot, ...] = ()

    @property
    def restored(self) -> int:
        return sum(1 for s in self.slots if s.outcome == "restored")

    def describe(self) -> str:
        if self.cold is not None:
            return f"cold: {self.cold}"
        if not self.slots:
            return "warm: no slot held a cache"
        parts = []
        for s in self.slots:
            if s.outcome == "restored":
                size = f", {s.bytes / 1e6:.1f} MB" if s.bytes else ""
                parts.append(f"slot {s.slot} restored ({s.restored} tokens{size})")
            else:
                parts.append(f"slot {s.slot} {s.outcome}: {s.why}")
        return "warm: " + "; ".join(parts)


@dataclass(frozen=True)
class CacheMove(JsonRecord):
    """A drained replica's caches in a rolling switch behind a gateway (switch/cache_moves.py):
    the replica that took them over (``to``) and each slot's restore there, or why they went
    cold (``cold``). ``routed``: the gateway said it sends the conversations there now."""

    to: str | None = None
    cold: str | None = None
    slots: tuple[WarmSlot, ...] = ()
    routed: bool = False

    def describe(self) -> str:
        if self.cold is not None:
            return f"cold: {self.cold}"
        moved = WarmRecord(None, self.slots).describe().removeprefix("warm: ")
        routed = "" if self.routed else " (the gateway did not confirm the move)"
        return f"caches moved to {self.to}: {moved}{routed}"
