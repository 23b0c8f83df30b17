"""What the deploy commands print for several hosts: the rolling switch's table."""

from __future__ import annotations

import json

import click

from llamanix.core.errors import Problem, UserError
from llamanix.core.text_table import box_table, print_lines
from llamanix.fleet.rollout import Rollout

# A rollout ended at once by a second stop signal (as a shell reports a command killed by
# SIGINT).
EXIT_INTERRUPTED = 130


def one_of_host_flags(host: str | None, hosts: str | None, all_hosts: bool) -> None:
    """--host, --hosts and --all-hosts name the hosts three ways: one at a time."""
    given = [f for f, v in (("--host", host), ("--hosts", hosts), ("--all-hosts", all_hosts)) if v]
    if len(given) > 1:
        raise UserError(
            Problem(
                "llamanix",
                given[1],
                f"and {given[0]} both name hosts",
                "use --host for one host, --hosts A,B or --all-hosts for a rolling switch",
            )
        )


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


__all__ = ["EXIT_INTERRUPTED", "one_of_host_flags", "print_rollout"]
