"""Which project a probed llama-server is a build of, from the dialect its --help speaks.

A variant names a project (ggml-org llama.cpp, ik_llama.cpp, BeeLlama) at a pinned commit. A
binary of another commit of the same project is what the probe-driven respelling is for
(core.variants.effective_variant); a binary of another project under a variant's name would
serve under the wrong name, so the switch and smoke refuse it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from llamanix.core.probe import Capabilities
from llamanix.core.variants import VARIANTS, Variant, detect_dialect

# Dialect -> the project whose builds speak it (every core.variants.DIALECTS entry; a test
# keeps them equal).
PROJECTS: Mapping[str, str] = MappingProxyType(
    {
        "upstream": "ggml-org llama.cpp",
        "upstream-2026-05": "ggml-org llama.cpp",
        "b8770": "ggml-org llama.cpp",
        "ik": "ik_llama.cpp",
        "beellama": "BeeLlama",
    }
)


@dataclass(frozen=True)
class OtherProject:
    """A binary whose --help speaks another project's dialect than its variant's."""

    wanted: str  # the variant's project
    speaks: str  # the binary's project
    dialect: str  # the dialect its --help speaks
    variants: tuple[str, ...]  # the variants of the binary's project

    def message(self, caps: Capabilities, variant: str) -> str:
        return (
            f"{caps.describe()} answers as a build of {self.speaks} (its --help speaks the "
            f"{self.dialect} dialect), but variant {variant} is {self.wanted}"
        )

    def choices(self) -> str:
        return " or ".join(f'"{v}"' for v in self.variants)


def other_project(variant: Variant, caps: Capabilities) -> OtherProject | None:
    """What the binary is instead, when its --help shows another project than the variant's;
    None when it is the same project, or the probe cannot tell."""
    detected = detect_dialect(caps)
    if detected is None:
        return None
    wanted, speaks = PROJECTS[variant.dialect.name], PROJECTS[detected.name]
    if wanted == speaks:
        return None
    variants = tuple(v.name for v in VARIANTS.values() if PROJECTS[v.dialect.name] == speaks)
    return OtherProject(wanted, speaks, detected.name, variants)


def variant_of(caps: Capabilities) -> Variant | None:
    """The variant a probed binary is: the first whose dialect its --help speaks; None when the
    probe cannot tell."""
    detected = detect_dialect(caps)
    if detected is None:
        return None
    return next((v for v in VARIANTS.values() if v.dialect is detected), None)
