"""The variant registry: which llama.cpp builds exist and how each spells llama-server's flags.

A *dialect* is a family of command-line spellings (upstream after the April 2026 speculative
refactor, nixpkgs' b8770 from before it, ik_llama.cpp's stage syntax). A *variant* is a build:
a flake input plus a dialect plus what depends on the commit it is pinned to (the MTP spelling).
Adding a fork means adding one ``Variant`` entry, and a dialect only if it spells things anew.

Each fact was read in the variant's source at its pinned commit; docs/variants.md names the file
and line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Literal

from llamanix.core.probe import Capabilities
from llamanix.core.schema import (
    CACHE_TYPES,
    IK_CACHE_TYPES,
    KVARN_CACHE_TYPES,
    SPEC_TYPES,
    TURBO_CACHE_TYPES,
    VariantName,
)

# Flags every dialect shares (short forms: the long ones were renamed more often).
_COMMON_FLAGS: dict[str, str] = {
    "model": "-m",
    "alias": "--alias",
    "listen": "--host",
    "port": "--port",
    "context": "-c",
    "gpu_layers": "-ngl",
    "flash_attn": "-fa",
    "cache_type_k": "-ctk",
    "cache_type_v": "-ctv",
    "parallel": "-np",
    "batch": "-b",
    "ubatch": "-ub",
    "threads": "-t",
    "jinja": "--jinja",
    "reasoning_budget": "--reasoning-budget",
    "metrics": "--metrics",
    "api_key_file": "--api-key-file",
    "spec_type": "--spec-type",
    # The drafter's KV cache types: every recorded build has these short forms.
    "draft_cache_type_k": "-ctkd",
    "draft_cache_type_v": "-ctvd",
}
# Where the drafter goes: upstream since b8770 and BeeLlama have these; ik has neither.
_DRAFT_PLACEMENT_FLAGS = {"draft_device": "-devd", "draft_cpu_moe": "-cmoed"}
# The drafter's own settings (speculative.KEY): the keys of the two tables above it owns.
DRAFTER_SETTINGS = ("draft_cache_type_k", "draft_cache_type_v", *_DRAFT_PLACEMENT_FLAGS)


@dataclass(frozen=True)
class Dialect:
    name: str
    description: str
    flags: Mapping[str, str]
    # "flags": --spec-type T plus one flag per parameter; "stages": --spec-type T:k=v,k=v (ik).
    spec_style: Literal["flags", "stages"]
    # How a chain of types is spelled: one comma-separated --spec-type value (upstream), one
    # --spec-type per stage (ik), or not at all.
    spec_chain: Literal["comma", "repeat", "single"]
    # Canonical speculative type -> this dialect's spelling; absent = not supported. "mtp" is not
    # here: its spelling depends on the pinned commit, so it is a property of the Variant.
    spec_types: Mapping[str, str]
    # Per canonical type, canonical parameter -> flag ("flags") or stage key ("stages").
    spec_params: Mapping[str, Mapping[str, str]]
    # b8770: a draft model given with -md drafts by itself and --spec-type has no draft value.
    draft_type_flag: bool = True
    layers_words: bool = True  # -ngl / -ngld accept "all" and "auto"
    jinja_default: bool = True
    no_jinja_flag: str | None = "--no-jinja"
    spec_single_slot: bool = False  # speculation only with -np 1
    cache_types: tuple[str, ...] = CACHE_TYPES
    # Speculation on hybrid (recurrent) models needs checkpointing (llama.cpp PR #19493).
    hybrid_spec_checkpoints: bool = True
    # BeeLlama keeps DFlash state for --spec-dflash-max-slots slots only; the rest decode plainly.
    dflash_slot_limit: bool = False
    spec_chain_max: int | None = None  # longest chain, where the binary says
    # Where a two-type chain must be a self-speculating type (n-gram, suffix) followed by one of
    # these; None: any order.
    spec_chain_then: tuple[str, ...] | None = None
    # Flags the parser takes that --help leaves out, so a probe must not refuse them.
    unlisted_flags: tuple[str, ...] = ()
    # llama-server's router mode (--models-preset, --models-max): every recorded build but ik's.
    router_mode: bool = True


@dataclass(frozen=True)
class Variant:
    name: VariantName
    description: str
    flake_input: str | None  # None: nixpkgs' own llama-cpp package
    dialect: Dialect
    # Spelling of MTP at the pinned commit (PR #22673 said "mtp" until 2026-05-13, then
    # "draft-mtp"); None when the build has no MTP.
    mtp_spec_type: str | None = None
    upstream: str = ""
    # The probed build this variant was adapted to (its describe()), so refusals name it.
    probed: str = ""

    @property
    def who(self) -> str:
        """Who takes or refuses a setting: the variant, or the probed build it was adapted to."""
        return (
            f"the {self.name} variant's build {self.probed}"
            if self.probed
            else (f"the {self.name} variant")
        )

    def spec_spelling(self, spec_type: str) -> str | None:
        if spec_type == "mtp":
            return self.mtp_spec_type
        return self.dialect.spec_types.get(spec_type)

    def supported_spec_types(self) -> list[str]:
        names = ["none", *self.dialect.spec_types]
        if self.mtp_spec_type:
            names.append("mtp")
        return names


def _frozen(d: dict[str, dict[str, str]]) -> Mapping[str, Mapping[str, str]]:
    return MappingProxyType({k: MappingProxyType(v) for k, v in d.items()})


_DRAFT_PARAMS_UPSTREAM = {
    "n_max": "--spec-draft-n-max",
    "n_min": "--spec-draft-n-min",
    "p_min": "--spec-draft-p-min",
}

# The n-gram drafters have their own flags; --spec-draft-* does not reach them. ngram-cache has
# none (its draft length is fixed at 8).
_NGRAM_PARAMS_UPSTREAM: dict[str, dict[str, str]] = {
    "ngram-mod": {"n_max": "--spec-ngram-mod-n-max", "n_min": "--spec-ngram-mod-n-min"},
    "ngram-simple": {"n_max": "--spec-ngram-simple-size-m"},
    "ngram-map-k": {"n_max": "--spec-ngram-map-k-size-m"},
    "ngram-map-k4v": {"n_max": "--spec-ngram-map-k4v-size-m"},
}

# ggml-org/llama.cpp after #22397 (spec params refactor) and #22964 (draft-* type names).
UPSTREAM = Dialect(
    name="upstream",
    description="ggml-org/llama.cpp master (Oct 2026): --spec-type draft-simple|draft-mtp|...",
    flags=MappingProxyType(
        {
            **_COMMON_FLAGS,
            **_DRAFT_PLACEMENT_FLAGS,
            "draft_model": "--spec-draft-model",
            "draft_gpu_layers": "--spec-draft-ngl",
        }
    ),
    spec_style="flags",
    # common/arg.cpp: "comma-separated list of types"; repeated flags append.
    spec_chain="comma",
    spec_types=MappingProxyType(
        {
            "draft": "draft-simple",
            "dflash": "draft-dflash",
            "dspark": "draft-dspark",
            "eagle3": "draft-eagle3",
            "ngram-simple": "ngram-simple",
            "ngram-mod": "ngram-mod",
            "ngram-cache": "ngram-cache",
            "ngram-map-k": "ngram-map-k",
            "ngram-map-k4v": "ngram-map-k4v",
        }
    ),
    spec_params=_frozen(
        {
            "draft": _DRAFT_PARAMS_UPSTREAM,
            "mtp": _DRAFT_PARAMS_UPSTREAM,
            "dflash": _DRAFT_PARAMS_UPSTREAM,
            "dspark": _DRAFT_PARAMS_UPSTREAM,
            "eagle3": _DRAFT_PARAMS_UPSTREAM,
            **_NGRAM_PARAMS_UPSTREAM,
        }
    ),
)

# The May 2026 tree PR #22673 was merged from: the same refactored flags, -md/-ngld spellings
# for the draft, no DFlash yet, EAGLE3 only a stub. Whether it already chained types was not
# read in its source: chains are refused unless the binary's own --help says "comma-separated".
_NOT_YET_IN_MAY_2026 = ("dflash", "dspark", "eagle3")
UPSTREAM_MAY_2026 = replace(
    UPSTREAM,
    name="upstream-2026-05",
    description="llama.cpp as of the MTP merge (May 2026): refactored --spec-* flags, no DFlash",
    flags=MappingProxyType(
        {
            **_COMMON_FLAGS,
            **_DRAFT_PLACEMENT_FLAGS,
            "draft_model": "-md",
            "draft_gpu_layers": "-ngld",
        }
    ),
    spec_chain="single",
    spec_types=MappingProxyType(
        {k: v for k, v in UPSTREAM.spec_types.items() if k not in _NOT_YET_IN_MAY_2026}
    ),
    spec_params=MappingProxyType(
        {k: v for k, v in UPSTREAM.spec_params.items() if k not in _NOT_YET_IN_MAY_2026}
    ),
)

# llama.cpp b8770 (April 2026), what nixpkgs packaged: before the speculative refactor.
LEGACY_B8770 = Dialect(
    name="b8770",
    description="llama.cpp b8770 (Apr 2026): -md drafts by itself, --draft-max/-min/-p-min",
    flags=MappingProxyType(
        {
            **_COMMON_FLAGS,
            **_DRAFT_PLACEMENT_FLAGS,
            "draft_model": "-md",
            "draft_gpu_layers": "-ngld",
        }
    ),
    spec_style="flags",
    spec_chain="single",
    spec_types=MappingProxyType(
        {
            "draft": "",  # no --spec-type value: -md alone enables draft-model speculation
            "ngram-simple": "ngram-simple",
            "ngram-mod": "ngram-mod",
            "ngram-cache": "ngram-cache",
            "ngram-map-k": "ngram-map-k",
            "ngram-map-k4v": "ngram-map-k4v",
        }
    ),
    spec_params=_frozen(
        {
            "draft": {"n_max": "--draft-max", "n_min": "--draft-min", "p_min": "--draft-p-min"},
            "ngram-mod": {"n_max": "--draft-max", "n_min": "--draft-min"},
        }
    ),
    draft_type_flag=False,
    hybrid_spec_checkpoints=False,
)

_IK_KEYS = {"n_max": "n_max", "n_min": "n_min", "p_min": "p_min"}
# DFlash's and DSpark's cross-attention context is a stage key in ik ("cross_ctx").
_IK_DFLASH_KEYS = {**_IK_KEYS, "dflash_cross_ctx": "cross_ctx"}

# ikawrakow/ik_llama.cpp: --spec-type STAGE[:k=v,...], integer-only layer counts, --jinja off by
# default (and no --no-jinja), speculation only with one slot.
IK = Dialect(
    name="ik",
    description="ik_llama.cpp: --spec-type draft:n_max=..,p_min=.., -np 1 for speculation",
    flags=MappingProxyType({**_COMMON_FLAGS, "draft_model": "-md", "draft_gpu_layers": "-ngld"}),
    spec_style="stages",
    # "repeat for a supported two-stage chain" (its --spec-type help).
    spec_chain="repeat",
    spec_chain_max=2,
    # common_speculative_validate_chain: "requires a self-spec stage first", then "only MTP or
    # draft-model fallback after self-spec" (both pins).
    spec_chain_then=("mtp", "draft"),
    spec_types=MappingProxyType(
        {
            "draft": "draft",
            "dflash": "dflash",
            "dspark": "dspark",
            "ngram-simple": "ngram-simple",
            "ngram-mod": "ngram-mod",
            "ngram-cache": "ngram-cache",
            "ngram-map-k": "ngram-map-k",
            "ngram-map-k4v": "ngram-map-k4v",
            "suffix": "suffix",
        }
    ),
    # ik's stage parser accepts the canonical keys on every stage.
    spec_params=_frozen(
        {
            t: _IK_DFLASH_KEYS if t in ("dflash", "dspark") else _IK_KEYS
            for t in SPEC_TYPES
            if t != "none"
        }
    ),
    layers_words=False,
    # common.cpp parses -a/--alias but its usage table has no row for it, and prints -ngl and
    # -ngld only when built with GPU offload (a CPU build still takes them, with a warning).
    unlisted_flags=("-a", "--alias", "-ngl", "--gpu-layers", "-ngld", "--gpu-layers-draft"),
    router_mode=False,
    jinja_default=False,
    no_jinja_flag=None,
    spec_single_slot=True,
    cache_types=(*CACHE_TYPES, *IK_CACHE_TYPES),
)

# Anbeeld/beellama.cpp (ba1fdce, May 2026), an upstream fork with DFlash drafting and TurboQuant KV
# caches. Facts, with source lines, in docs/variants.md: the refactored --spec-draft-* flags, -md
# alone drafts (--spec-type names only the drafters that need no plain draft model), DFlash
# takes the drafter through --spec-draft-model, and only --spec-dflash-max-slots slots draft.
_BEELLAMA_DRAFT = {
    "n_max": "--spec-draft-n-max",
    "n_min": "--spec-draft-n-min",
    "p_min": "--spec-draft-p-min",
    "draft_ctx_size": "--spec-draft-ctx-size",
}
BEELLAMA = Dialect(
    name="beellama",
    description="BeeLlama: --spec-type dflash with a drafter, TurboQuant turbo* KV caches",
    flags=MappingProxyType(
        {
            **_COMMON_FLAGS,
            **_DRAFT_PLACEMENT_FLAGS,
            "draft_model": "--spec-draft-model",
            "draft_gpu_layers": "--spec-draft-ngl",
        }
    ),
    spec_style="flags",
    # common/arg.cpp at ba1fdce compares the whole value with each type name: one type only.
    spec_chain="single",
    spec_types=MappingProxyType(
        {
            "draft": "",  # no --spec-type value: a draft model alone drafts
            "dflash": "dflash",
            "ngram-simple": "ngram-simple",
            "ngram-mod": "ngram-mod",
            "ngram-cache": "ngram-cache",
            "ngram-map-k": "ngram-map-k",
            "ngram-map-k4v": "ngram-map-k4v",
            "copyspec": "copyspec",
            "suffix": "suffix",
            "recycle": "recycle",
        }
    ),
    spec_params=_frozen(
        {
            "draft": _BEELLAMA_DRAFT,
            "dflash": {
                **_BEELLAMA_DRAFT,
                "dflash_max_slots": "--spec-dflash-max-slots",
                "dflash_cross_ctx": "--spec-dflash-cross-ctx",
            },
            **_NGRAM_PARAMS_UPSTREAM,
        }
    ),
    draft_type_flag=False,
    # TurboQuant until v0.3, KVarN after: the variant follows whichever BeeLlama is pinned or
    # built, and the probe of the binary narrows this to what it lists.
    cache_types=(*CACHE_TYPES, *TURBO_CACHE_TYPES, *KVARN_CACHE_TYPES),
    dflash_slot_limit=True,
)

DIALECTS: Mapping[str, Dialect] = MappingProxyType(
    {d.name: d for d in (UPSTREAM, UPSTREAM_MAY_2026, LEGACY_B8770, IK, BEELLAMA)}
)


def detect_dialect(caps: Capabilities) -> Dialect | None:
    """The dialect a probed binary speaks, from its own --help; None when the probe cannot tell
    (an old probe file without the answer, or a build none of the known dialects matches)."""
    return DIALECTS.get(caps.dialect) if caps.dialect else None


def _known_spellings(canonical: str) -> list[str]:
    """Every way a known dialect spells a type, then the plain and the ``draft-`` forms."""
    out = [d.spec_types[canonical] for d in DIALECTS.values() if d.spec_types.get(canonical)]
    return [*dict.fromkeys([*out, canonical, f"draft-{canonical}"])]


def _spelling_in(listed: list[str], canonical: str, table: str | None) -> str | None:
    if table and table in listed:
        return table
    for spelling in _known_spellings(canonical):
        if spelling in listed:
            return spelling
    # "": a draft model alone drafts, with no --spec-type value; a build that lists a draft
    # type (draft-simple) would load such a draft and never use it, so the listed name wins.
    return "" if table == "" else None


def adapt_to_probe(dialect: Dialect, caps: Capabilities) -> Dialect:
    """The dialect as this binary spells it: its --help's speculative types (under any known
    spelling), its cache types and its chain syntax win over the table, which only fills in
    what the probe cannot say. A build that matches the table renders exactly as before."""
    changes: dict[str, object] = {}
    params: Mapping[str, Mapping[str, str]] = dialect.spec_params
    if caps.spec_types:
        spellings: dict[str, str] = {}
        found_params = dict(dialect.spec_params)
        for canonical in SPEC_TYPES:
            if canonical in ("none", "mtp"):
                continue
            table = dialect.spec_types.get(canonical)
            found = _spelling_in(caps.spec_types, canonical, table)
            if found is not None:
                spellings[canonical] = found
                if canonical not in found_params:
                    found_params[canonical] = _params_elsewhere(
                        canonical, found, dialect.spec_style
                    )
            elif table is not None:
                spellings[canonical] = table  # check_against names the missing type
        changes["spec_types"] = MappingProxyType(spellings)
        params = found_params
        changes["spec_params"] = MappingProxyType(params)
    if caps.flags and dialect.spec_style == "flags":
        # A speculative parameter or drafter setting whose flag this build lacks is refused as
        # "has no flag for KEY (remove it)", together with everything else wrong, instead of
        # one flag at a time after the render.
        have = set(caps.flags) | set(dialect.unlisted_flags)
        changes["spec_params"] = MappingProxyType(
            {
                t: MappingProxyType({k: f for k, f in p.items() if f in have})
                for t, p in params.items()
            }
        )
        changes["flags"] = MappingProxyType(
            {k: f for k, f in dialect.flags.items() if k not in DRAFTER_SETTINGS or f in have}
        )
    if caps.cache_types:
        changes["cache_types"] = tuple(caps.all_cache_types())
    if caps.spec_chain is not None and caps.spec_chain != dialect.spec_chain:
        changes["spec_chain"] = caps.spec_chain
    adapted = replace(dialect, **changes)  # type: ignore[arg-type]
    if adapted == dialect:
        return dialect
    return adapted


def _params_elsewhere(canonical: str, spelling: str, style: str) -> Mapping[str, str]:
    """The parameters of a type this dialect's table lacks, from the dialect that spells it so."""
    for d in DIALECTS.values():
        if d.spec_types.get(canonical) == spelling and d.spec_style == style:
            return d.spec_params.get(canonical, MappingProxyType({}))
    return MappingProxyType({})


def effective_variant(variant: Variant, caps: Capabilities | None) -> tuple[Variant, str | None]:
    """The variant as this binary spells it, and a one-line warning when its --help shows another
    dialect than the variant declares, or a build the tables don't know (a BeeLlama after v0.3).
    Without a probe the declared dialect applies and there is nothing to say."""
    if caps is None:
        return variant, None
    detected = detect_dialect(caps)
    base = detected or variant.dialect
    warning = None
    if detected is not None and detected is not variant.dialect:
        warning = (
            f"variant {variant.name} declares the {variant.dialect.name} dialect, but "
            f"{caps.describe()} speaks {detected.name}: spelling its flags for {detected.name}"
        )
    if caps.dialect_guess:
        warning = (
            f"{caps.describe()} is a {base.name} build llamanix has no recording of "
            f"({caps.dialect_guess}): speculative and cache types are taken from its --help; "
            "see docs/variants.md"
        )
    mtp = mtp_spelling(caps)
    if mtp is None and base is variant.dialect:
        mtp = variant.mtp_spec_type  # check_against names it if the binary lacks it
    adapted = replace(
        variant, dialect=adapt_to_probe(base, caps), mtp_spec_type=mtp, probed=caps.describe()
    )
    return adapted, warning


def mtp_spelling(caps: Capabilities) -> str | None:
    """How this binary spells MTP, if it lists it among its speculative types."""
    for spelling in ("draft-mtp", "mtp"):
        if spelling in caps.spec_types:
            return spelling
    return None


VARIANTS: Mapping[str, Variant] = MappingProxyType(
    {
        v.name: v
        for v in (
            Variant(
                name="nixpkgs",
                description="nixpkgs' own llama-cpp package (b8770), rebuilt with CUDA",
                flake_input=None,
                dialect=LEGACY_B8770,
                mtp_spec_type=None,
                upstream="nixpkgs#llama-cpp",
            ),
            Variant(
                name="upstream",
                description="ggml-org/llama.cpp master",
                flake_input="llama-cpp-upstream",
                dialect=UPSTREAM,
                mtp_spec_type="draft-mtp",
                upstream="github:ggml-org/llama.cpp",
            ),
            Variant(
                name="ik",
                description="ikawrakow/ik_llama.cpp fork",
                flake_input="ik-llama-cpp",
                dialect=IK,
                mtp_spec_type="mtp",
                upstream="github:ikawrakow/ik_llama.cpp",
            ),
            Variant(
                name="mtp",
                description="PR #22673 (MTP) as squash-merged into ggml-org/llama.cpp, b9180",
                flake_input="llama-cpp-mtp",
                dialect=UPSTREAM_MAY_2026,
                # Pinned after the 2026-05-13 rename; an earlier pin would say "mtp".
                mtp_spec_type="draft-mtp",
                # Pinned by URL: the merge commit; upstream master has carried MTP since.
                upstream="github:ggml-org/llama.cpp/255582687b8dd211fdbc582e43ab842491554e94",
            ),
            Variant(
                name="beellama",
                description="Anbeeld/beellama.cpp fork: DFlash drafting, TurboQuant KV caches",
                flake_input="beellama-cpp",
                dialect=BEELLAMA,
                mtp_spec_type=None,
                upstream="github:Anbeeld/beellama.cpp",
            ),
        )
    }
)


def variant_names() -> list[str]:
    return list(VARIANTS)


# What people call the projects, against the variant that builds each: a project's own name
# ("ik_llama.cpp", "llama.cpp") is no typo of a variant's, so a fuzzy match would suggest the
# wrong one ("ik_llama": 'beellama'). Keys are lower case with "_" written "-".
OTHER_NAMES: Mapping[str, str] = MappingProxyType(
    {
        "ik-llama": "ik",
        "ik-llama.cpp": "ik",
        "ik-llama-cpp": "ik",
        "ikllama": "ik",
        "ikawrakow": "ik",
        "llama.cpp": "upstream",
        "llama-cpp-upstream": "upstream",
        "master": "upstream",
        "ggml-org": "upstream",
        "ggml": "upstream",
        "llama": "upstream",
        "llama-cpp": "nixpkgs",
        "b8770": "nixpkgs",
        "llama-cpp-mtp": "mtp",
        "beellama.cpp": "beellama",
        "beellama-cpp": "beellama",
        "bee": "beellama",
        "dflash": "beellama",
    }
)


def variant_for_other_name(word: str) -> Variant | None:
    """The variant a project's other name means (``ik_llama.cpp``: ik), or None."""
    name = OTHER_NAMES.get(word.strip().lower().replace("_", "-"))
    return VARIANTS[name] if name is not None else None


__all__ = [
    "DIALECTS",
    "VARIANTS",
    "Dialect",
    "Variant",
    "detect_dialect",
    "mtp_spelling",
    "variant_names",
]
