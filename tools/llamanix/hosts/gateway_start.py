"""How the gateway's unit starts LiteLLM and knows it serves (``llamanix gateway-exec`` and
``gateway-ready``): no shell command line, so no config value is ever read by a shell.

``gateway-exec`` reads each key from the unit's credentials (``$CREDENTIALS_DIRECTORY``) into
the variable LiteLLM's config names it by (``os.environ/NAME``), puts llamanix's plugin (its
directory, which holds nothing else) on LiteLLM's ``PYTHONPATH``, and execs LiteLLM with the
argv it was given: LiteLLM is then the unit's main process, and no key is in an argv or in the
unit's text. ``gateway-ready`` waits for LiteLLM's liveliness endpoint, and fails as soon as
LiteLLM has exited.
"""

from __future__ import annotations

import re
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from llamanix.core.api_key import read_api_key
from llamanix.core.errors import ExternalCommandError, Problem, UserError
from llamanix.external.process import alive

_VARIABLE = re.compile(r"[A-Z_][A-Z0-9_]*")
# A credential's name as the unit loads it: one file name in the credentials directory.
_CREDENTIAL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
SOURCE = "llamanix gateway exec"
POLL_S = 0.5


def plugin_dir() -> Path:
    """The directory of the plugin LiteLLM loads (llamanix_gateway), as installed."""
    from llamanix.render import litellm_plugin

    return Path(litellm_plugin.__file__).resolve().parent


def litellm_environment(
    pairs: Sequence[str], credentials: str | None, base: Mapping[str, str]
) -> dict[str, str]:
    """``base`` with each ``VARIABLE=CREDENTIAL`` read from its credential, and the plugin on
    the path; one line naming what is wrong otherwise."""
    if not credentials:
        raise UserError(
            Problem(SOURCE, "$CREDENTIALS_DIRECTORY", "is not set", "run it as the gateway's unit")
        )
    env = dict(base)
    seen: set[str] = set()
    for pair in pairs:
        variable, _, credential = pair.partition("=")
        if not _VARIABLE.fullmatch(variable) or not _CREDENTIAL.fullmatch(credential):
            raise UserError(
                Problem(
                    SOURCE,
                    "--credential-env",
                    f"{pair!r} is not VARIABLE=CREDENTIAL",
                    "e.g. LITELLM_MASTER_KEY=master-key",
                )
            )
        if variable in seen:
            raise UserError(
                Problem(SOURCE, "--credential-env", f"{variable} is named twice", "name it once")
            )
        path = Path(credentials) / credential
        key = read_api_key(path, "--credential-env")
        if key is None:
            raise UserError(Problem(SOURCE, credential, f"{path} is empty", "write the key there"))
        env[variable] = key
        seen.add(variable)
    env["PYTHONPATH"] = str(plugin_dir())
    return env


def wait_live(url: str, pid: int | None, timeout_s: float) -> float:
    """Seconds until ``url`` answers 200; ExternalCommandError when ``pid`` exits first or the
    time is up."""
    started = time.monotonic()
    last = "no answer yet"
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return time.monotonic() - started
                last = f"HTTP {resp.status}"
        except urllib.error.HTTPError as err:
            last = f"HTTP {err.code}"
        except (OSError, ValueError) as err:
            last = str(getattr(err, "reason", err))
        if pid is not None and not alive(pid):
            raise ExternalCommandError(f"{url}: LiteLLM (pid {pid}) exited ({last})")
        if time.monotonic() - started > timeout_s:
            raise ExternalCommandError(f"{url}: no answer within {timeout_s:g} s ({last})")
        time.sleep(POLL_S)
