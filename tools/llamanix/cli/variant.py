"""llamanix CLI: ``variant``, a variant's build: ``variant pin`` (deploy.py) moves its flake
input, ``variant build`` (build.py) builds it with Nix for a Debian/Ubuntu host, ``variant
probe`` (core.py) reads what a build accepts.

``pin`` and ``build`` took other arguments before they moved here (``pin VARIANT [REV]
--config CONFIG``, ``build VARIANT CONFIG``): for a release those old names keep their old
grammar (``OLD_GRAMMAR``, which cli.MOVED's resolution reads).
"""

from __future__ import annotations

import click

from llamanix.cli.build import build_before_variant, build_cmd
from llamanix.cli.core import probe
from llamanix.cli.deploy import pin, pin_before_variant


@click.group("variant")
def variant_group() -> None:
    """A variant's build: pin its source, build it with Nix, probe what it accepts."""


for _command in (pin, build_cmd, probe):
    variant_group.add_command(_command)

OLD_GRAMMAR: dict[str, click.Command] = {"pin": pin_before_variant, "build": build_before_variant}


def register(group: click.Group) -> None:
    """Add this module's command to the main group."""
    group.add_command(variant_group)
