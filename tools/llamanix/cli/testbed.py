"""llamanix CLI commands: testbed."""

from __future__ import annotations

import click


def register(group: click.Group) -> None:
    """Add this module's commands to the main group."""
