"""Warm switch: a server's prompt caches survive its restart.

A switch restarts a server, and a restarted server has empty slots: an agent at 30k tokens of
context pays its whole prefill again on its next turn. Where the old and the new server would
hold the same cache, the switch keeps it instead (``warm_switch = true``):

1. after the drain, it asks the old server which slots hold a cache (``GET /slots``) and has it
   save each to a file in the unit's state directory (``--slot-save-path``);
2. it restarts the server;
3. once the new server serves, and before its port takes traffic again, it has the new server
   restore each file into the same slot, checks that the slot holds as many tokens as were
   saved (a restore that did nothing is reported, not assumed), and deletes the files.

"The same cache" means the same model file, the same context layout (context size, slots,
flash attention), the same KV-cache types and the same variant (each build writes its own file
format); a model whose cache a restore cannot bring back whole is not warm either:

- a model with recurrent layers (Mamba, Gated DeltaNet hybrids): upstream keeps the state of
  such a context in context checkpoints, which the slot file does not hold, so the next request
  after a restore processes its whole prompt again;
- sliding-window attention (Gemma 2 and 3): the same, unless the server runs with
  ``--swa-full`` (measured on Gemma 3 270M at upstream 0c1e570: without it, a restored 3.7k-token
  slot answered its next turn with ``cache_n = 0``; with it, 16 tokens were processed);
- a drafter with its own context (a draft model, MTP): only the target's cache is in the file.

Anything else makes the switch cold, and it says why (``cold_reason``).

**Stamps.** Each file is written with a stamp beside it (``llamanix-warm-N.json``): the build
that wrote it (``/props``' ``build_info``: build number and commit) and the context layout
(``slot_layout``). Before any file is restored the new server's build and layout are compared
with the stamps, and a file from another build or layout is not restored: the switch is cold
and says so. Upstream changed the file's format in v0.6.0 (b11429), so a pin move within one
variant is cold by design. The same stamps travel with a rolling switch's cache move
(switch/cache_moves.py).

The files are bounded: each slot's file is estimated from the model's KV bytes per token before
it is written (an upper bound), and the switch saves no more than ``limit_bytes`` in all nor
anything that would leave the file system with less than ``FREE_RESERVE_BYTES`` free. A file
that turns out larger than the limit is deleted at once. Every file is deleted after its
restore; files a killed switch left are named by ``llamanix doctor`` and deleted by the next
switch, rollback or ``llamanix tidy`` (``hosts.leftovers``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from llamanix.config.argv import SLOT_SAVE_FLAG
from llamanix.config.model import Instance
from llamanix.core.errors import UserError
from llamanix.core.json_value import JsonObject
from llamanix.core.schema import SPEC_DRAFTERS
from llamanix.external.files import atomic_write
from llamanix.server.drain import Endpoint
from llamanix.server.slots import (
    CachedSlot,
    SlotError,
    SlotFile,
    cached_slots,
    restore_slot,
    save_slot,
    server_build,
)
from llamanix.state.crash_point import crash_point
from llamanix.state.warm_records import DEFAULT_LIMIT_GIB, SlotOutcome, WarmRecord, WarmSlot

FILE_PREFIX = "llamanix-warm-"
FREE_RESERVE_BYTES = 1 << 30
GIB = 1 << 30
# A stamp is a few hundred bytes of JSON.
STAMP_LIMIT = 64 * 1024


def slot_file(slot: int) -> str:
    return f"{FILE_PREFIX}{slot}.bin"


def stamp_file(filename: str) -> str:
    """The stamp beside a slot file: ``llamanix-warm-0.bin`` -> ``llamanix-warm-0.json``."""
    return filename.removesuffix(".bin") + ".json"


def slot_layout(inst: Instance) -> JsonObject:
    """What a slot file's cache depends on besides the build: the model file, the variant,
    the context layout and the KV-cache types (the warm switch's rules, ``cold_reason``)."""
    return {
        "model": inst.model,
        "variant": inst.variant,
        "context": inst.context,
        "parallel": inst.parallel,
        "flash_attn": inst.flash_attn,
        "cache_type_k": inst.cache_type_k,
        "cache_type_v": inst.cache_type_v,
        "swa_full": "--swa-full" in inst.extra_args,
    }


def write_stamp(directory: Path, filename: str, build: str, layout: JsonObject) -> None:
    text = json.dumps({"build": build, "layout": layout}, sort_keys=True)
    atomic_write(directory / stamp_file(filename), text + "\n", mode=0o600)


def read_stamp(directory: Path, filename: str) -> JsonObject | None:
    """The stamp beside ``filename``; None when there is none. The directory is the server
    user's: a link or anything but a small regular file there is not read (root reads it)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(directory / stamp_file(filename), flags)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            return None
        try:
            data = json.loads(fh.read(STAMP_LIMIT))
        except (OSError, ValueError):
            return None
    return data if isinstance(data, dict) else None


def stamp_refusal(stamp: JsonObject | None, build: str | None, layout: JsonObject) -> str | None:
    """Why a file stamped ``stamp`` is not restored into a server of ``build`` and ``layout``
    (None: it is restored)."""
    if stamp is None:
        return "the slot file has no stamp (its build is unknown)"
    if build is None:
        return "the server does not say its build (GET /props)"
    if stamp.get("build") != build:
        return (
            f"the slot file is from build {stamp.get('build')}, the server runs {build}: each "
            "build reads only its own files"
        )
    theirs = stamp.get("layout")
    theirs = theirs if isinstance(theirs, dict) else {}
    for key, value in layout.items():
        if theirs.get(key) != value:
            return _changed(f"context layout's {key}", theirs.get(key), value)
    return None


def state_directory(name: str, manager: str, units_dir: Path | None = None) -> Path:
    """Where an instance's state directory is on this machine, as the switch (root for system
    units, the user for user units) reaches it: systemd's %S/llamanix-NAME, or ``up``'s."""
    if manager == "up" and units_dir is not None:
        return units_dir / "state" / f"llamanix-{name}"
    if manager == "systemd-user":
        base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
        return Path(base) / f"llamanix-{name}"
    # With DynamicUser= the directory is /var/lib/private/llamanix-NAME, and
    # /var/lib/llamanix-NAME is systemd's link to it.
    return Path("/var/lib") / f"llamanix-{name}"


@dataclass(frozen=True)
class WarmPlan:
    """One instance's warm switch: why it is cold (None: warm), where its files are, and what
    bounds them."""

    name: str
    cold: str | None
    directory: Path
    bytes_per_token: float = 0.0
    limit_bytes: int = int(DEFAULT_LIMIT_GIB * GIB)
    # The new server's layout, which each file's stamp must match (``slot_layout``).
    layout: JsonObject = field(default_factory=dict)


def _layout(inst: Instance) -> dict[str, object]:
    return {
        "context": inst.context,
        "parallel": inst.parallel,
        "flash_attn": inst.flash_attn,
    }


def _changed(label: str, old: object, new: object) -> str:
    def shown(value: object) -> str:
        return "default" if value is None else str(value)

    return f"the {label} changes ({shown(old)} -> {shown(new)})"


def cold_reason(
    old: Instance, new: Instance, old_argv: Sequence[str], new_argv: Sequence[str]
) -> str | None:
    """Why the old server's caches cannot serve the new one (checked without the model file),
    or None."""
    if not old.warm_switch:
        return "the running server was started without warm_switch (the next switch is warm)"
    if not new.warm_switch:
        return "warm_switch is off in the new config"
    if SLOT_SAVE_FLAG not in old_argv:
        return f"the running build has no {SLOT_SAVE_FLAG}"
    if SLOT_SAVE_FLAG not in new_argv:
        return f"the new build has no {SLOT_SAVE_FLAG}"
    if old.model != new.model:
        return _changed("model", old.model, new.model)
    if old.variant != new.variant:
        return f"the variant changes ({old.variant} -> {new.variant}): each writes its own files"
    old_layout, new_layout = _layout(old), _layout(new)
    for key in old_layout:
        if old_layout[key] != new_layout[key]:
            return _changed(f"context layout's {key}", old_layout[key], new_layout[key])
    for key in ("cache_type_k", "cache_type_v"):
        if getattr(old, key) != getattr(new, key):
            return _changed(f"KV-cache type ({key})", getattr(old, key), getattr(new, key))
    swa_full = "--swa-full" in old.extra_args, "--swa-full" in new.extra_args
    if swa_full[0] != swa_full[1]:
        return _changed("sliding-window cache (--swa-full)", *swa_full)
    for inst in (old, new):
        drafters = [t for t in inst.speculative.types if t in SPEC_DRAFTERS]
        if drafters or inst.speculative.draft_model:
            what = drafters[0] if drafters else "draft"
            return f"speculation with a drafter ({what}) has a cache of its own, which is not saved"
    return None


def model_reason(inst: Instance) -> tuple[str | None, float]:
    """Why the model's cache cannot be restored whole (None: it can), and its KV-cache bytes
    per token with the instance's cache types (the bound of a slot's file)."""
    from llamanix.model.gguf_info import read_gguf  # the gguf library: only when warm

    try:
        info = read_gguf(Path(inst.model))
    except (UserError, OSError, ValueError) as err:
        return f"cannot read the model's header ({err})", 0.0
    per_token = info.kv_bytes_per_token(inst.cache_type_k or "f16", inst.cache_type_v or "f16")
    if info.is_recurrent:
        return (
            "the model has recurrent layers, whose state a restore does not bring back "
            "(the next request would process its whole prompt)",
            per_token,
        )
    window = info.sliding_window
    sliding = bool(window) and (inst.context is None or (window or 0) < inst.context)
    if sliding and "--swa-full" not in inst.extra_args:
        return (
            f"the model uses sliding-window attention ({window} tokens): a restored cache "
            'is reused only with extra_args = ["--swa-full"]',
            per_token,
        )
    return None, per_token


def plan_for(
    name: str,
    old: Instance | None,
    new: Instance | None,
    old_argv: Sequence[str],
    new_argv: Sequence[str],
    directory: Path,
    limit_bytes: int,
) -> WarmPlan | None:
    """The instance's warm switch; None when neither side asks for one (or it is new)."""
    if old is None or new is None or not (old.warm_switch or new.warm_switch):
        return None
    why = cold_reason(old, new, old_argv, new_argv)
    per_token = 0.0
    if why is None:
        why, per_token = model_reason(new)
    if why is None and not directory.is_dir():
        why = f"its state directory {directory} is not there"
    return WarmPlan(name, why, directory, per_token, limit_bytes, slot_layout(new))


@dataclass
class _Saved:
    slot: CachedSlot
    file: SlotFile | None
    why: str | None = None


@dataclass
class WarmCaches:
    """The warm switch of a host's restarts: ``save`` before a server stops, ``restore`` once
    its successor serves. A save waits for its restore (the first restart's files are what a
    rollback's restart restores, when the new server never took them)."""

    plans: Mapping[str, WarmPlan]
    pending: dict[str, list[_Saved]] = field(default_factory=dict)
    records: dict[str, WarmRecord] = field(default_factory=dict)

    def save(self, name: str, endpoint: Endpoint) -> None:
        """Save the caches of ``name``'s running server (drained); a no-op when cold, or when
        files of an earlier restart still wait for their restore."""
        plan = self.plans.get(name)
        if plan is None or name in self.pending:
            return
        if plan.cold is not None:
            self.records[name] = WarmRecord(plan.cold)
            return
        _remove_files(plan.directory)  # what a killed switch left
        slots = cached_slots(endpoint)
        if slots is None:
            self.records[name] = WarmRecord("the running server does not list its slots")
            return
        build = server_build(endpoint)
        if build is None:
            self.records[name] = WarmRecord("the running server does not say its build (/props)")
            return
        saved: list[_Saved] = []
        used = 0
        for slot in sorted(slots, key=lambda s: s.slot):
            estimate = int(slot.tokens * plan.bytes_per_token) + (1 << 20)
            free = shutil.disk_usage(plan.directory).free
            if used + estimate > plan.limit_bytes or estimate > free - FREE_RESERVE_BYTES:
                why = (
                    f"{estimate / 1e6:.0f} MB would pass the limit of {plan.limit_bytes / GIB:g} "
                    f"GiB or leave less than {FREE_RESERVE_BYTES / GIB:g} GiB free"
                )
                saved.append(_Saved(slot, None, why))
                continue
            try:
                done = save_slot(endpoint, slot.slot, slot_file(slot.slot))
            except SlotError as err:
                saved.append(_Saved(slot, None, str(err)))
                continue
            used += done.bytes
            if used > plan.limit_bytes:
                _remove(plan.directory / slot_file(slot.slot))
                used -= done.bytes
                why = f"its {done.bytes / 1e6:.0f} MB passed the limit"
                saved.append(_Saved(slot, None, why))
                continue
            write_stamp(plan.directory, slot_file(slot.slot), build, plan.layout)
            saved.append(_Saved(slot, done))
        self.pending[name] = saved
        crash_point("warm:saved")

    def restore(self, name: str, endpoint: Endpoint) -> WarmRecord | None:
        """Restore what ``save`` kept into ``name``'s new server (it serves), check each slot,
        and delete the files; the record (None: nothing was planned)."""
        plan = self.plans.get(name)
        saved = self.pending.pop(name, None)
        if plan is None or saved is None:
            return self.records.get(name)
        refused = self._refusal(plan, saved, endpoint)
        if refused is not None:
            _remove_files(plan.directory)
            self.records[name] = WarmRecord(refused)
            return self.records[name]
        slots: list[WarmSlot] = []
        for s in saved:
            if s.file is None:
                slots.append(WarmSlot(s.slot.slot, s.slot.tokens, "not saved", why=s.why))
                continue
            try:
                back = restore_slot(endpoint, s.slot.slot, slot_file(s.slot.slot))
            except SlotError as err:
                slots.append(
                    WarmSlot(
                        s.slot.slot, s.file.tokens, "not restored", s.file.bytes,
                        save_ms=s.file.ms, why=str(err),
                    )
                )  # fmt: skip
                continue
            ok = back.tokens > 0 and back.tokens == s.file.tokens
            outcome: SlotOutcome = (
                "restored"
                if ok
                else "restore did nothing"
                if back.tokens == 0
                else "restore incomplete"
            )
            slots.append(
                WarmSlot(
                    s.slot.slot,
                    s.file.tokens,
                    outcome,
                    s.file.bytes,
                    back.tokens,
                    s.file.ms,
                    back.ms,
                    None if ok else f"saved {s.file.tokens} tokens, restored {back.tokens}",
                )
            )
        crash_point("warm:restored")
        _remove_files(plan.directory)
        record = WarmRecord(None, tuple(slots))
        self.records[name] = record
        return record

    @staticmethod
    def _refusal(plan: WarmPlan, saved: list[_Saved], endpoint: Endpoint) -> str | None:
        """Why the files are not restored into the new server: a stamp of another build or
        layout (the new server's /props says its build)."""
        files = [slot_file(s.slot.slot) for s in saved if s.file is not None]
        if not files:
            return None
        build = server_build(endpoint)
        for filename in files:
            why = stamp_refusal(read_stamp(plan.directory, filename), build, plan.layout)
            if why is not None:
                return why
        return None

    def settle(self) -> None:
        """A record for each cold plan no restart reached (a manager that restarts on its
        own, as nixos-rebuild does)."""
        for name, plan in self.plans.items():
            if plan.cold is not None:
                self.records.setdefault(name, WarmRecord(plan.cold))

    def discard(self) -> None:
        """Delete every file still waiting for its restore (the switch ends without one)."""
        for name in list(self.pending):
            self.pending.pop(name)
            plan = self.plans.get(name)
            if plan is not None:
                _remove_files(plan.directory)
                self.records.setdefault(name, WarmRecord("its successor never served"))


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def _remove_files(directory: Path, prefix: str = FILE_PREFIX) -> None:
    """Every slot file of ``prefix`` in ``directory``, with its stamp."""
    with contextlib.suppress(OSError):
        for path in [*directory.glob(f"{prefix}*.bin"), *directory.glob(f"{prefix}*.json")]:
            _remove(path)
