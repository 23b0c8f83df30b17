"""What a flip from one llama-server build to another gains or loses, from their two probes:
the config keys each build can render, its speculative types, and its KV cache types."""

from __future__ import annotations

from dataclasses import dataclass

from llamanix.config.model import SPEC_PARAMS
from llamanix.core.json_codec import JsonRecord
from llamanix.core.probe import Capabilities
from llamanix.core.schema import INSTANCE
from llamanix.core.variants import (
    DRAFTER_SETTINGS,
    Dialect,
    adapt_to_probe,
    detect_dialect,
    mtp_spelling,
)

# Keys every build takes as they are (paths, the host, what llamanix itself handles).
_ALWAYS = {"host", "variant", "binary", "model", "extra_args", "environment"}


@dataclass(frozen=True)
class Supported:
    keys: frozenset[str]
    spec_types: frozenset[str]
    cache_types: frozenset[str]


@dataclass(frozen=True)
class ProbeDiff(JsonRecord):
    gained_keys: tuple[str, ...]
    lost_keys: tuple[str, ...]
    gained_spec_types: tuple[str, ...]
    lost_spec_types: tuple[str, ...]
    gained_cache_types: tuple[str, ...]
    lost_cache_types: tuple[str, ...]

    @property
    def loses_anything(self) -> bool:
        return bool(self.lost_keys or self.lost_spec_types or self.lost_cache_types)


def supported(caps: Capabilities) -> Supported:
    """What this build can do, in the config's terms (canonical keys and type names)."""
    detected: Dialect | None = detect_dialect(caps)
    flags = set(caps.flags) | set(detected.unlisted_flags if detected else ())
    keys: set[str] = set()
    types: set[str] = set()
    if detected is not None:
        # As the renderer sees this build: its own lists of types and cache types.
        dialect = adapt_to_probe(detected, caps)
        keys = {k for k in INSTANCE if k not in _ALWAYS and dialect.flags.get(k) in flags}
        keys |= {f"speculative.{k}" for k in DRAFTER_SETTINGS if dialect.flags.get(k) in flags}
        for canonical, spelling in dialect.spec_types.items():
            # "" = a draft model alone drafts: supported when the draft-model flag exists.
            if (spelling and spelling in caps.spec_types) or (
                not spelling and dialect.flags.get("draft_model") in flags
            ):
                types.add(canonical)
                for param, flag in dialect.spec_params.get(canonical, {}).items():
                    if flag in flags and param in SPEC_PARAMS:
                        keys.add(f"speculative.{param}")
        if mtp_spelling(caps):
            types.add("mtp")
    return Supported(frozenset(keys), frozenset(types), frozenset(caps.all_cache_types()))


def _lost(before: frozenset[str], after: frozenset[str]) -> tuple[str, ...]:
    # A build whose --help lists nothing of a kind (ik names no cache types) is unknown there,
    # not empty: nothing is reported lost or gained for it.
    return tuple(sorted(before - after)) if before and after else ()


def probe_diff(before: Capabilities, after: Capabilities) -> ProbeDiff:
    a, b = supported(before), supported(after)
    return ProbeDiff(
        gained_keys=_lost(b.keys, a.keys),
        lost_keys=_lost(a.keys, b.keys),
        gained_spec_types=_lost(b.spec_types, a.spec_types),
        lost_spec_types=_lost(a.spec_types, b.spec_types),
        gained_cache_types=_lost(b.cache_types, a.cache_types),
        lost_cache_types=_lost(a.cache_types, b.cache_types),
    )


def flip_warning(diff: ProbeDiff) -> str | None:
    """One line before a flip that drops something (what the config uses is refused anyway)."""
    if not diff.loses_anything:
        return None
    parts = [
        f"{what} {', '.join(lost)}"
        for what, lost in (
            ("speculative types", diff.lost_spec_types),
            ("cache types", diff.lost_cache_types),
            ("keys", diff.lost_keys),
        )
        if lost
    ]
    return "the flip to this build loses " + "; ".join(parts)
