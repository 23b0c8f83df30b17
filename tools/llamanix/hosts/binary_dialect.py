"""Before a switch installs anything: each llama-server the host's units will run, asked what it
is. A binary whose --help speaks another project's dialect than its variant names (an "ik"
entry that points at an upstream build) would serve under the wrong name, with flags spelled
for a build it is not; the switch refuses it with the fix (core.projects says which project a
dialect belongs to). A binary that cannot be run or asked is left to the gate, which reports
why it did not start.
"""

from __future__ import annotations

import os

from llamanix.config.model import Config, binary_of
from llamanix.core.errors import ExternalCommandError, Problem, UserError
from llamanix.core.probe import Capabilities
from llamanix.core.projects import other_project
from llamanix.core.variants import VARIANTS
from llamanix.external.llama_server import probe_binary


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
        other = other_project(variant, caps) if caps is not None else None
        if caps is None or other is None:
            continue
        field = (
            f"instances.{inst.name}.binary"
            if inst.binary
            else f"hosts.{host}.binaries.{variant.name}"
        )
        problems.append(
            Problem(
                config.source,
                field,
                other.message(caps, variant.name),
                f"point it at a build of {other.wanted}, or set instances.{inst.name}.variant "
                f"to {other.choices()}",
            )
        )
    return problems


def probe_notes(config: Config, host: str) -> list[str]:
    """What the probe before a switch finds, binary by binary, as a dry run says it."""
    h = config.hosts[host]
    seen: set[str] = set()
    notes: list[str] = []
    for inst in config.instances_on(host):
        variant = VARIANTS[inst.variant]
        binary = binary_of(inst, h, variant)
        if binary is None or binary in seen:
            continue
        seen.add(binary)
        caps = _probe(binary)
        if caps is None:
            notes.append(
                f"probe {binary}: it cannot be asked here (missing, not executable, or no "
                "--help), so its gate says whether it serves"
            )
        else:
            notes.append(
                f"probe {binary}: {caps.describe()} speaks the {caps.dialect or 'unknown'} "
                f"dialect, a build of variant {variant.name}'s project"
            )
    return notes


def refuse_other_dialect(config: Config, host: str) -> None:
    """UserError, before anything is written or installed, when a binary of ``host`` is another
    project's build than its variant names."""
    problems = dialect_problems(config, host)
    if problems:
        raise UserError(problems)
