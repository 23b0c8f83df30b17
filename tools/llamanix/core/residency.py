"""Which members of a router may stay loaded together, and which must take turns.

A router is how a host serves more models than its GPU holds at once. llamanix knows each
member's VRAM need (``llamanix plan``'s fit: weights, KV cache and compute buffers for its
context and slots), so it decides what a router alone cannot: members are kept resident in
config order while they fit together with room left for the largest member that swaps; the rest
swap, one at a time. A member whose need is unknown (its model is not readable where llamanix
runs, as in a Nix build) makes the whole router swap, the choice that never runs out of memory.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

GIB = 2**30


@dataclass(frozen=True)
class Residency:
    resident: tuple[str, ...]  # loaded together, never evicted for one another
    swapping: tuple[str, ...]  # one of them at a time, beside the resident ones
    reason: str  # one line: why this split
    too_big: tuple[str, ...] = ()  # members that do not fit even alone

    @property
    def max_loaded(self) -> int:
        """How many members are loaded at once at most: llama-server's --models-max."""
        return len(self.resident) + (1 if self.swapping else 0)


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def plan_residency(
    members: Sequence[str],
    vram: Mapping[str, int | None],
    gpu_memory: int | None,
    max_loaded: int | None = None,
) -> Residency:
    """Split ``members`` (config order = priority) into resident and swapping ones.

    ``vram``: each member's need in bytes (None: unknown). ``gpu_memory``: the host GPU's memory
    (None: a CPU host or a GPU not in the table). ``max_loaded``: the config's cap, if any.
    """
    names = tuple(members)
    cap = len(names) if max_loaded is None else min(max_loaded, len(names))
    if gpu_memory is None:
        if cap >= len(names):
            return Residency(names, (), "no GPU memory to share: every member stays loaded")
        kept = names[: cap - 1]
        return Residency(
            kept,
            names[cap - 1 :],
            f"max_loaded = {cap}: {', '.join(kept)} kept loaded, the rest take turns"
            if kept
            else "max_loaded = 1: one member at a time",
        )
    unknown = [n for n in names if vram.get(n) is None]
    if unknown:
        return Residency(
            (),
            names,
            f"VRAM need of {', '.join(unknown)} unknown here (model not readable): one member at "
            "a time, which never runs out of memory",
        )
    need = {n: int(vram[n] or 0) for n in names}
    too_big = tuple(n for n in names if need[n] > gpu_memory)
    resident: list[str] = []
    for name in names:
        trial = [*resident, name]
        rest = [n for n in names if n not in trial]
        # Resident ones plus one swapping member are loaded at once: both limits count it.
        loaded = len(trial) + (1 if rest else 0)
        # A member too big to load at all never takes a turn, so it reserves no room.
        turns = [need[n] for n in rest if n not in too_big]
        room = sum(need[n] for n in trial) + max(turns, default=0)
        if name not in too_big and loaded <= cap and room <= gpu_memory:
            resident = trial
    swapping = tuple(n for n in names if n not in resident)
    total = sum(need[n] for n in resident)
    if not swapping:
        reason = f"all fit together: {_gib(total)} of {_gib(gpu_memory)}"
    elif not [n for n in swapping if n not in too_big]:
        reason = f"the others fit together: {_gib(total)} of {_gib(gpu_memory)}"
    elif not resident:
        reason = f"no two fit together in {_gib(gpu_memory)}: one member at a time"
    else:
        largest = max(need[n] for n in swapping if n not in too_big)
        reason = (
            f"{', '.join(resident)} kept loaded ({_gib(total)}), with room for the largest "
            f"member that takes turns ({_gib(largest)}) in {_gib(gpu_memory)}"
        )
    if max_loaded is not None and len(resident) + (1 if swapping else 0) >= cap and swapping:
        reason += f"; max_loaded = {max_loaded}"
    for name in too_big:
        reason += f"; {name} does not fit even alone ({_gib(need[name])})"
    return Residency(tuple(resident), swapping, reason, too_big)
