"""Which host of a config a command means: the one named, or the config's only host.

The errors speak of the config (its file and its ``[hosts.*]`` tables), since the name may come
from anywhere: a command line, a test bed, another config. The CLI adds its own flag when it
prints one (``HostChoiceError`` tells it which errors these are).
"""

from __future__ import annotations

from llamanix.config.model import Config, suggest
from llamanix.core.errors import Problem, UserError


class HostChoiceError(UserError):
    """The config does not settle the host: an unknown name, or several hosts and none named."""


def pick_host(config: Config, host: str | None) -> str:
    """``host`` when the config has a ``[hosts.HOST]`` table; with None, the only host."""
    if host is not None:
        if host not in config.hosts:
            raise HostChoiceError(
                Problem(
                    config.source,
                    "hosts",
                    f"no [hosts.{host}] table",
                    suggest(host, tuple(config.hosts)),
                )
            )
        return host
    if len(config.hosts) == 1:
        return next(iter(config.hosts))
    raise HostChoiceError(
        Problem(
            config.source,
            "hosts",
            f"{len(config.hosts)} [hosts.*] tables and no host named",
            "name one of " + ", ".join(config.hosts),
        )
    )
