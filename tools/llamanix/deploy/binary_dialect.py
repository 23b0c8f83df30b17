"""Before a switch installs anything: each llama-server the host's units will run, asked what it
is. A binary whose --help speaks another project's dialect than its variant names (an "ik"
entry that points at an upstream build) would serve under the wrong name, with flags spelled
for a build it is not; the switch refuses it with the fix.

Only the project counts here (ggml-org llama.cpp, ik_llama.cpp, BeeLlama): builds of one project
at other commits are what the probe-driven respelling is for (core.variants.effective_variant).
A binary that cannot be run or asked is left to the gate, which reports why it did not start.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import MappingProxyType

from llamanix.core.config import Config, binary_of
from llamanix.core.errors import ExternalCommandError, Problem, UserError
from llamanix.core.probe import Capabilities
from llamanix.core.variants import VARIANTS, detect_dialect
from llamanix.external.llama_server import probe_binary

# Dialect -> the project whose builds speak it (core.variants.DIALECTS; a test keeps them equal).
PROJECTS: Mapping[str, str] = MappingProxyType(
    {
        "upstream": "ggml-org llama.cpp",
        "upstream-2026-05": "ggml-org llama.cpp",
        "b8770": "ggml-org llama.cpp",
        "ik": "ik_llama.cpp",
        "beellama": "BeeLlama",
    }
)


def _probe(binary: str) -> Capabilities | None:
    """What the binary says about itself; None when it cannot be run or asked here."""
    if not os.path.isabs(binary) or not os.access(binary, os.X_OK):
        return None
    try:
        return probe_binary(binary)
    except (UserError, ExternalCommandError, OSError):
        return None


def dialect_problems(config: Config, host: str) -> list[Problem]:
    """One problem per instance of ``host`` whose binary answers as another project's build
    than its variant's."""
    problems: list[Problem] = []
    found: dict[str, Capabilities | None] = {}
    h = config.hosts[host]
    for inst in config.instances_on(host):
        variant = VARIANTS[inst.variant]
        binary = binary_of(inst, h, variant)
        if binary is None:
            continue
        if binary not in found:
            found[binary] = _probe(binary)
        caps = found[binary]
        detected = detect_dialect(caps) if caps is not None else None
        if caps is None or detected is None:
            continue
        wanted = PROJECTS[variant.dialect.name]
        speaks = PROJECTS[detected.name]
        if speaks == wanted:
            continue
        field = (
            f"instances.{inst.name}.binary"
            if inst.binary
            else f"hosts.{host}.binaries.{variant.name}"
        )
        matching = [v.name for v in VARIANTS.values() if PROJECTS[v.dialect.name] == speaks]
        problems.append(
            Problem(
                config.source,
                field,
                f"{caps.describe()} answers as a build of {speaks} (its --help speaks the "
                f"{detected.name} dialect), but variant {variant.name} is {wanted}",
                f"point it at a build of {wanted}, or set instances.{inst.name}.variant to "
                + " or ".join(f'"{m}"' for m in matching),
            )
        )
    return problems


def refuse_other_dialect(config: Config, host: str) -> None:
    """UserError, before anything is written or installed, when a binary of ``host`` is another
    project's build than its variant names."""
    problems = dialect_problems(config, host)
    if problems:
        raise UserError(problems)
