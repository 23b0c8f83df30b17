"""A rolling switch's cache move, as each host does its part (the fleet agent runs these; the
controller's side is fleet/cache_move.py).

Before a replica's host is switched behind a gateway, its conversations' caches move to another
replica of the same model group, which takes them over:

- ``save``, on the drained replica's host: the server saves each slot that holds a cache to a
  file in the unit's state directory (``llamanix-move-N.bin``, as a warm switch does), each
  stamped with the server's build and the context layout (hosts/warm.py);
- ``send``, there: one part of a file's bytes (``PART_BYTES`` at most, so that each request
  and answer stays far inside the agent's bound on its stdin, whatever the slot's size), for
  the controller to carry; after the last part, or when the controller gives up, the file is
  deleted;
- ``take``, on the other replica's host, once per part: on the first, the stamp is checked
  against that server's build and layout (another build or layout: refused, and the reason
  says which, before any more bytes travel); each part is appended to one file in its state
  directory, checked against its size, digest and place; after the last, the whole is
  restored into a slot that is idle (one never used first; the conversation a used one holds
  is first kept in the server's prompt cache in RAM), and the file is deleted;
- ``route``, on the gateway's host: the routes file the gateway's plugin follows (which replicas
  are draining, whose conversations now live where), and its answer that it applied them.

Every path is derived from a name the host's own config knows and a fixed file name: nothing the
controller sends names a path.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import stat
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import httpx

from llamanix.config.model import Config, Instance
from llamanix.core.errors import Problem, UserError
from llamanix.core.json_value import JsonObject, JsonValue
from llamanix.external.files import atomic_write
from llamanix.hosts.warm import (
    FREE_RESERVE_BYTES,
    GIB,
    model_reason,
    read_stamp,
    slot_layout,
    stamp_file,
    stamp_refusal,
    state_directory,
    write_stamp,
)
from llamanix.render.gateway import ROUTES_FILE
from llamanix.server.drain import Endpoint
from llamanix.server.slots import SlotError, cached_slots, restore_slot, save_slot, server_build
from llamanix.state.warm_records import DEFAULT_LIMIT_GIB
from llamanix.switch.serving import endpoints

MOVE_PREFIX = "llamanix-move-"
INCOMING = f"{MOVE_PREFIX}in.bin"
_MOVE_FILE = re.compile(r"llamanix-move-[0-9]{1,6}\.bin")
# Bytes per data line (base64: a third more on the wire).
CHUNK = 48 * 1024
# Bytes per part: a part's base64 lines (8 MiB) and its JSON fit the agent's 16 MiB bound on
# the request it reads (core/file_reader.py), with room to spare.
PART_BYTES = 6 * 1024 * 1024
LIMIT_BYTES = int(DEFAULT_LIMIT_GIB * GIB)
# How long the gateway's plugin has to say it applied new routes (it looks every 0.2 s).
ROUTE_ACK_S = 10.0
ROUTES_APPLIED = "routes-applied.json"
# How long a restore waits for a slot of the taker's to be idle (each busy one frees up when
# the answer it writes ends).
SLOT_WAIT_S = 120.0


def _instance(config: Config, host: str, name: str, source: str) -> Instance:
    inst = config.instances.get(name)
    if inst is None or inst.host != host:
        raise UserError(Problem(source, "instance", f"no instance '{name}' on host '{host}'"))
    return inst


def _endpoint(config: Config, host: str, name: str) -> Endpoint:
    return endpoints(config, host)[name]


def _remove(directory: Path, prefix: str = MOVE_PREFIX) -> None:
    with contextlib.suppress(OSError):
        for path in [*directory.glob(f"{prefix}*.bin"), *directory.glob(f"{prefix}*.json")]:
            path.unlink(missing_ok=True)


def _cold_of(inst: Instance) -> str | None:
    if not inst.warm_switch:
        return f"{inst.name} runs without warm_switch (no --slot-save-path to move caches through)"
    why, _ = model_reason(inst)
    return why


def save(config: Config, host: str, name: str, source: str) -> JsonObject:
    """Have ``name``'s server save every slot that holds a cache, stamped; what was saved, or
    why nothing was (``cold``)."""
    inst = _instance(config, host, name, source)
    cold = _cold_of(inst)
    if cold is not None:
        return {"cold": cold}
    _, per_token = model_reason(inst)
    directory = state_directory(name, "systemd")
    endpoint = _endpoint(config, host, name)
    build = server_build(endpoint)
    if build is None:
        return {"cold": f"{name} does not say its build (/props)"}
    _remove(directory)  # what a move that broke off left
    slots = cached_slots(endpoint)
    if slots is None:
        return {"cold": f"{name} does not list its slots"}
    layout = slot_layout(inst)
    saved: list[JsonValue] = []
    used = 0
    for slot in sorted(slots, key=lambda s: s.slot):
        filename = f"{MOVE_PREFIX}{slot.slot}.bin"
        estimate = int(slot.tokens * per_token) + (1 << 20)
        free = shutil.disk_usage(directory).free
        if used + estimate > LIMIT_BYTES or estimate > free - FREE_RESERVE_BYTES:
            why = f"{estimate / 1e6:.0f} MB would pass the limit or leave too little free"
            saved.append({"slot": slot.slot, "tokens": slot.tokens, "why": why})
            continue
        try:
            done = save_slot(endpoint, slot.slot, filename)
        except SlotError as err:
            saved.append({"slot": slot.slot, "tokens": slot.tokens, "why": str(err)})
            continue
        used += done.bytes
        write_stamp(directory, filename, build, layout)
        saved.append(
            {
                "slot": slot.slot,
                "tokens": done.tokens,
                "bytes": done.bytes,
                "file": filename,
                "save_ms": done.ms,
            }
        )
    return {"cold": None, "build": build, "layout": layout, "slots": saved}


def _open_nofollow(path: Path) -> int:
    """``path`` for reading, never through a link and never waiting on a FIFO: these files
    live in directories other users own (the server's, the gateway's). OSError unless it is a
    regular file."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file")
    return fd


def _offset(value: object, source: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise UserError(Problem(source, "offset", f"{value!r} is not a byte offset"))
    return value


def send(
    config: Config,
    host: str,
    name: str,
    filename: str,
    source: str,
    offset: object = 0,
    discard: bool = False,
) -> Iterator[str]:
    """The part of ``filename`` that starts at ``offset`` (``PART_BYTES`` at most), as base64
    lines (a file ``save`` wrote: its name is checked, and it is opened without following a
    link). The last line is not data: JSON with the part's place, size and sha256, the file's
    size and stamp, and whether it was the last part. The file and its stamp are deleted once
    its last part is read, or at once when the controller ``discard``s it."""
    _instance(config, host, name, source)
    if not _MOVE_FILE.fullmatch(filename):
        raise UserError(Problem(source, "file", f"{filename!r} is not a file a move saves"))
    directory = state_directory(name, "systemd")
    paths = (directory / filename, directory / stamp_file(filename))
    if discard:
        for path in paths:
            path.unlink(missing_ok=True)
        yield json.dumps({"discarded": True})
        return
    start = _offset(offset, source)
    stamp = read_stamp(directory, filename)
    digest = hashlib.sha256()
    size = 0
    try:
        fd = _open_nofollow(directory / filename)
    except OSError as err:
        raise UserError(Problem(source, "file", f"{filename}: {err.strerror}")) from None
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if info.st_nlink != 1:  # a hard link to a file of another's, made by the directory's owner
            raise UserError(Problem(source, "file", f"{filename}: has {info.st_nlink} links"))
        if start > info.st_size:
            raise UserError(Problem(source, "offset", f"{start} is past the file's end"))
        fh.seek(start)
        while size < PART_BYTES and (chunk := fh.read(min(CHUNK, PART_BYTES - size))):
            digest.update(chunk)
            size += len(chunk)
            yield base64.b64encode(chunk).decode()
    last = start + size >= info.st_size
    if last:
        for path in paths:
            path.unlink(missing_ok=True)
    yield json.dumps(
        {
            "offset": start,
            "bytes": size,
            "sha256": digest.hexdigest(),
            "size": info.st_size,
            "last": last,
            "stamp": stamp,
        }
    )


def _free_slot(endpoint: Endpoint, restored: set[int]) -> tuple[int, bool] | None:
    """An idle slot to restore into, and whether it holds a conversation: one that never
    served first, else the one that served longest ago, and a slot an earlier move of this
    rollout ``restored`` into last (a restore leaves no task behind, so the server lists it as
    never used); None when every slot is busy."""
    try:
        with endpoint.client(10.0) as http:
            data = http.get("/slots").json()
    except (httpx.HTTPError, ValueError):
        return None
    idle = [
        s
        for s in (data if isinstance(data, list) else [])
        if isinstance(s, dict) and isinstance(s.get("id"), int) and not s.get("is_processing")
    ]
    if not idle:
        return None

    def held(s: dict[str, object]) -> bool:
        return s["id"] in restored or s.get("id_task") is not None

    best = min(idle, key=lambda s: (s["id"] in restored, held(s), s.get("id_task") or 0))
    return int(best["id"]), held(best)


def _park(endpoint: Endpoint, slot: int) -> None:
    """Keep the conversation ``slot`` holds in the server's prompt cache in RAM before a
    restore overwrites the slot: a completion of no new token pinned to the slot makes
    llama-server save the slot's cache there first (it does so whenever a slot takes a prompt
    that keeps less than half of what it held), and that conversation's next turn loads it
    back. With the prompt cache off (``--cache-ram 0``) it is lost; it is one conversation's
    prefill, not a failure."""
    body = {"prompt": " ", "n_predict": 0, "id_slot": slot, "cache_prompt": True}
    with contextlib.suppress(httpx.HTTPError), endpoint.client(120.0) as http:
        http.post("/completion", json=body)


def _write_part(directory: Path, chunks: Iterable[str], offset: int, limit: int) -> tuple[int, str]:
    """Append one part to ``directory/INCOMING``: the first (``offset`` 0) creates it anew
    (never through a link), owned by the directory's owner (the server's user reads it); a
    later one must find it a regular file exactly ``offset`` bytes long. (The file's size
    after the part, the part's sha256);
    ValueError (the file deleted) when the part does not fit or comes out of place."""
    path = directory / INCOMING
    flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    if offset == 0:
        path.unlink(missing_ok=True)
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
    else:
        try:
            fd = os.open(path, flags | os.O_APPEND | os.O_NONBLOCK)
        except OSError as err:
            raise ValueError(f"the earlier parts are not here: {err.strerror}") from None
    owner = os.stat(directory)
    digest = hashlib.sha256()
    size = offset
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size != offset:
            raise ValueError(f"the part at byte {offset} came out of place")
        if offset == 0 and os.geteuid() == 0:
            os.fchown(fd, owner.st_uid, owner.st_gid)
        with os.fdopen(fd, "ab") as fh:
            fd = -1
            for line in chunks:
                data = base64.b64decode(line, validate=True)
                size += len(data)
                if size > limit:
                    raise ValueError(f"more than the {limit / GIB:g} GiB the move allows")
                digest.update(data)
                fh.write(data)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
        raise
    return size, digest.hexdigest()


def take(
    config: Config, host: str, header: JsonObject, chunks: Iterable[str], source: str
) -> JsonObject:
    """Take one part of a moved file for the instance ``header`` names: the first part only
    once the file's stamp matches this server's build and layout; after the last, restore the
    whole into an idle slot. What became of it: ``receiving`` (with the bytes taken so far)
    until the last part, then a ``WarmSlot``'s fields."""
    name = header.get("instance")
    if not isinstance(name, str):
        raise UserError(Problem(source, "instance", "missing"))
    inst = _instance(config, host, name, source)
    tokens = header.get("tokens")
    tokens = tokens if isinstance(tokens, int) else 0
    offset = _offset(header.get("offset", 0), source)
    directory = state_directory(name, "systemd")

    def refused(why: str, **more: JsonValue) -> JsonObject:
        for _ in chunks:  # read to the end: the controller writes it all
            pass
        with contextlib.suppress(OSError):  # a directory there is refused, not followed
            (directory / INCOMING).unlink(missing_ok=True)
        return {**more, "tokens": tokens, "outcome": "not restored", "why": why}

    cold = _cold_of(inst)
    if cold is not None:
        return refused(cold)
    endpoint = _endpoint(config, host, name)
    stamp = header.get("stamp")
    last = header.get("last") is True
    if offset == 0 or last:
        # Checked before the first byte travels, and again before the restore (the server
        # may have been switched in between).
        why = stamp_refusal(
            stamp if isinstance(stamp, dict) else None, server_build(endpoint), slot_layout(inst)
        )
        if why is not None:
            return refused(why)
    free = shutil.disk_usage(directory).free - FREE_RESERVE_BYTES
    try:
        size, digest = _write_part(
            directory, chunks, offset, max(0, min(LIMIT_BYTES, free + offset))
        )
    except (ValueError, OSError) as err:
        return refused(f"not written: {err}")
    part = header.get("bytes")
    if digest != header.get("sha256") or isinstance(part, bool) or size - offset != part:
        return refused("the bytes arrived damaged")
    if not last:
        return {"tokens": tokens, "outcome": "receiving", "bytes": size}
    if size != header.get("size"):
        return refused(f"{size} bytes arrived of {header.get('size')}")
    try:
        return _restore(endpoint, name, header, tokens, size)
    finally:
        (directory / INCOMING).unlink(missing_ok=True)


def _restore(
    endpoint: Endpoint, name: str, header: JsonObject, tokens: int, size: int
) -> JsonObject:
    """Restore the file all parts arrived in into an idle slot."""
    avoid = header.get("avoid")
    taken = {s for s in (avoid if isinstance(avoid, list) else []) if isinstance(s, int)}
    # Every slot may be busy with a turn: each frees up when its answer ends.
    deadline = time.monotonic() + SLOT_WAIT_S
    while (chosen := _free_slot(endpoint, taken)) is None and time.monotonic() < deadline:
        time.sleep(0.2)
    if chosen is None:
        why = f"{name} had no idle slot to restore into for {SLOT_WAIT_S:g} s"
        return {"tokens": tokens, "outcome": "not restored", "why": why}
    slot, held = chosen
    if held:
        _park(endpoint, slot)
    try:
        back = restore_slot(endpoint, slot, INCOMING)
    except SlotError as err:
        return {"slot": slot, "tokens": tokens, "outcome": "not restored", "why": str(err)}
    ok = back.tokens > 0 and back.tokens == tokens
    outcome = "restored" if ok else "restore incomplete" if back.tokens else "restore did nothing"
    return {
        "slot": slot,
        "tokens": tokens,
        "outcome": outcome,
        "bytes": size,
        "restored": back.tokens,
        "restore_ms": back.ms,
        "why": None if ok else f"moved {tokens} tokens, restored {back.tokens}",
    }


def route(
    routes: JsonObject, path: Path = Path(ROUTES_FILE), wait_s: float = ROUTE_ACK_S
) -> JsonObject:
    """Write the gateway's routes (atomically: a new file renamed over the old, never through
    a link) and wait for its plugin to say it applied them; whether it did."""
    directory = path.parent
    if not directory.is_dir():
        return {"applied": False, "why": f"{directory} is not there (the gateway never ran here)"}
    atomic_write(path, json.dumps(routes) + "\n", mode=0o644)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fd = _open_nofollow(directory / ROUTES_APPLIED)
            with os.fdopen(fd) as fh:
                applied = json.loads(fh.read(4096))
            if isinstance(applied, dict) and applied.get("seq") == routes.get("seq"):
                return {"applied": True}
        except (OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            return {"applied": False, "why": f"the gateway did not apply them within {wait_s:g} s"}
        time.sleep(0.1)
