"""Before a switch installs anything: each llama-server the host's units will run, asked what it
is. A binary whose --help speaks another project's dialect than its variant names (an "ik"
entry that points at an upstream build) would serve under the wrong name, with flags spelled
for a build it is not; the switch refuses it with the fix (core.projects says which project a
dialect belongs to). A binary that cannot be run or asked is left to the gate, which reports
why it did not start.
"""

from __future__ import annotations

import os

from llamanix.core.config import Config, binary_of
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


def probed_binaries(config: Config, host: str) -> dict[str, bool]:
    """Each binary of ``host``'s units, once, and whether this check can ask it (an absolute
    path it may run here): what a dry run says it probed."""
    h = config.hosts[host]
    found: dict[str, bool] = {}
    for inst in config.instances_on(host):
        binary = binary_of(inst, h, VARIANTS[inst.variant])
        if binary is not None and binary not in found:
            found[binary] = os.path.isabs(binary) and os.access(binary, os.X_OK)
    return found


def refuse_other_dialect(config: Config, host: str) -> None:
    """UserError, before anything is written or installed, when a binary of ``host`` is another
    project's build than its variant names."""
    problems = dialect_problems(config, host)
    if problems:
        raise UserError(problems)
