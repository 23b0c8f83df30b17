"""A server's slots as its HTTP API shows them, and saving and restoring a slot's cache.

llama-server started with ``--slot-save-path DIR`` writes a slot's cache (its tokens and their
KV state, ``llama_state_seq_save_file``) to ``DIR/FILENAME`` on ``POST
/slots/ID?action=save {"filename": FILENAME}`` and reads it back into a slot on ``action=restore``
(upstream ``tools/server/server-context.cpp`` at 0c1e570; ik and BeeLlama list the same flag).
The answers name what was done: ``n_saved``/``n_written`` (tokens, bytes) and
``n_restored``/``n_read``. A server without the flag answers the POST with an error, and so does
a restore that cannot fit the file into the slot.

What build wrote a file: ``GET /props`` names the server's build (``build_info``), which the
switch stamps beside each file it has saved (hosts/warm.py): a file is restored only into a
server of the same build, since upstream changes the file's format between builds.

Which slots hold a cache: ``GET /slots`` lists each slot, and a slot that has served a request
carries ``n_prompt_tokens``, the tokens its cache holds (prompt and answer). A fresh server's
slots carry none, and a restored slot shows none either until it serves again: so what a restore
did is read from its own answer, never from ``/slots``.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from llamanix.server.drain import Endpoint

# Saving or restoring a large context is a file of gigabytes: minutes on a slow disk.
SLOT_IO_TIMEOUT_S = 600.0


class SlotError(Exception):
    """A save or restore the server refused or did not answer; the message says why."""


@dataclass(frozen=True)
class CachedSlot:
    """A slot that holds a cache: its id and how many tokens."""

    slot: int
    tokens: int


@dataclass(frozen=True)
class SlotFile:
    """What one save or restore did: tokens and bytes, and how long the server took."""

    slot: int
    tokens: int
    bytes: int
    ms: float


def cached_slots(endpoint: Endpoint, timeout_s: float = 10.0) -> list[CachedSlot] | None:
    """The slots that hold a cache; None when the server does not list its slots (``--no-slots``
    or not answering)."""
    try:
        with endpoint.client(timeout_s) as http:
            resp = http.get("/slots")
        if resp.status_code != 200:
            return None
        data = resp.json()
    except (httpx.HTTPError, ValueError):
        return None
    if not isinstance(data, list):
        return None
    found = []
    for entry in data:
        if not isinstance(entry, dict):
            continue
        slot, tokens = entry.get("id"), entry.get("n_prompt_tokens")
        if isinstance(slot, int) and isinstance(tokens, int) and tokens > 0:
            found.append(CachedSlot(slot, tokens))
    return found


def server_build(endpoint: Endpoint, timeout_s: float = 10.0) -> str | None:
    """The build the server says it is (``GET /props``'s ``build_info``: build number and
    commit, ``b8770-0c1e570``); None when it does not say (no /props, or not answering)."""
    try:
        with endpoint.client(timeout_s) as http:
            resp = http.get("/props")
        data = resp.json() if resp.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    build = data.get("build_info") if isinstance(data, dict) else None
    return build if isinstance(build, str) and build else None


def _action(endpoint: Endpoint, slot: int, action: str, filename: str) -> dict[str, object]:
    try:
        with endpoint.client(SLOT_IO_TIMEOUT_S) as http:
            resp = http.post(
                f"/slots/{slot}", params={"action": action}, json={"filename": filename}
            )
    except httpx.HTTPError as err:
        raise SlotError(f"{action} slot {slot}: {err.__class__.__name__}: {err}") from None
    try:
        data = resp.json()
    except ValueError:
        data = None
    if resp.status_code != 200 or not isinstance(data, dict):
        message = resp.text[:200]
        if isinstance(data, dict) and isinstance(data.get("error"), dict):
            message = str(data["error"].get("message", message))
        raise SlotError(f"{action} slot {slot}: HTTP {resp.status_code}: {message}")
    return data


def _int(data: dict[str, object], key: str) -> int:
    value = data.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _ms(data: dict[str, object], key: str) -> float:
    timings = data.get("timings")
    value = timings.get(key) if isinstance(timings, dict) else None
    return float(value) if isinstance(value, int | float) else 0.0


def save_slot(endpoint: Endpoint, slot: int, filename: str) -> SlotFile:
    """Have the server write slot ``slot``'s cache to ``filename`` in its slot-save path."""
    data = _action(endpoint, slot, "save", filename)
    return SlotFile(slot, _int(data, "n_saved"), _int(data, "n_written"), _ms(data, "save_ms"))


def restore_slot(endpoint: Endpoint, slot: int, filename: str) -> SlotFile:
    """Have the server read ``filename`` from its slot-save path into slot ``slot``."""
    data = _action(endpoint, slot, "restore", filename)
    return SlotFile(slot, _int(data, "n_restored"), _int(data, "n_read"), _ms(data, "restore_ms"))
