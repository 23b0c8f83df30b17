"""What the deploy commands print for several hosts: the rolling switch's table."""

from __future__ import annotations

import json

import click

from llamanix.core.text_table import box_table, print_lines
from llamanix.fleet.rollout import Rollout

# A rollout ended at once by a second stop signal (as a shell reports a command killed by
# SIGINT).
EXIT_INTERRUPTED = 130


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def print_rollout(rollout: Rollout, as_json: bool) -> None:
    rows = rollout.ordered()
    if as_json:
        click.echo(json.dumps([r.to_json() for r in rows], indent=2))
        return
    headers = ["host", "generation", "verdict", "out of service", "detail"]
    cells = [
        [r.host, r.generations, r.verdict, _seconds(r.out_of_service_s), r.detail] for r in rows
    ]
    print_lines(box_table("rolling switch", headers, cells))


__all__ = ["EXIT_INTERRUPTED", "print_rollout"]
