"""The config's "which host?" error, with the flag that answers it when none was named."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

from llamanix.config.host_choice import HostChoiceError
from llamanix.core.errors import UserError


@contextmanager
def host_flag(host: str | None) -> Iterator[None]:
    """Around a command's choice of host: a config of several hosts, and none named on the
    command line, is answered with the option that names one (``--host``)."""
    try:
        yield
    except HostChoiceError as err:
        if host is not None:
            raise
        raise UserError([replace(p, fix=f"{p.fix} with --host") for p in err.problems]) from None
