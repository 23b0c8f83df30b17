"""LiteLLM for a test host's gateway: its wheels, downloaded once and cached, and a host whose
own pip configuration finds them, which `llamanix switch` then installs from (a user behind a
mirror has the same: an /etc/pip.conf). And the same LiteLLM in a venv of this machine's Python,
for tests that run the gateway here (the NixOS VM test's checks)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from llamanix.core.errors import ExternalCommandError
from llamanix.core.schema import LITELLM_VERSION
from llamanix.external import pip
from llamanix.external.files import atomic_write, locked
from llamanix.external.process import run_captured
from llamanix.hosts.gateway_venv import requirement
from llamanix.testbed import hosts
from llamanix.testbed.hosts import Host
from llamanix.testbed.server_build import cache_root

WHEELS = "/var/cache/litellm-wheels"
# pip evaluates environment markers with the Python it runs on (3.11.7 here), not the one it
# downloads for (Debian 12's 3.11.2): redis wants async-timeout below 3.11.3, so it is named.
MARKER_EXTRAS = ("async-timeout>=4.0.3",)


def litellm_wheels(python: str) -> Path:
    """The pinned LiteLLM's proxy and everything it needs, for CPython ``python``."""
    return hosts.dependency_wheels(python, [requirement(LITELLM_VERSION), *MARKER_EXTRAS])


def offer_wheels(host: Host, wheels: Path) -> None:
    """Copy ``wheels`` into ``host`` and point its pip there (no index)."""
    target = host.path(WHEELS)
    target.mkdir(parents=True, exist_ok=True)
    for whl in wheels.glob("*.whl"):
        shutil.copy2(whl, target / whl.name)
    host.write(
        "/etc/pip.conf",
        f"[global]\nno-index = true\nfind-links = {WHEELS}\ndisable-pip-version-check = true\n",
    )


def local_litellm() -> Path:
    """The pinned LiteLLM's ``litellm`` in a venv of the Python running this, made once from
    the cached wheels (offline) and kept in the cache; a marker written last says it is whole."""
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    venv = cache_root() / "litellm" / f"{LITELLM_VERSION}-cp{python.replace('.', '')}"
    marker = venv / ".complete"
    with locked(cache_root() / ".litellm.lock"):
        if marker.is_file():
            return venv / "bin" / "litellm"
        wheels = litellm_wheels(python)
        shutil.rmtree(venv, ignore_errors=True)
        venv.parent.mkdir(parents=True, exist_ok=True)
        for argv in (
            pip.venv_argv(sys.executable, venv),
            [
                *pip.venv_install_argv(venv, [requirement(LITELLM_VERSION), *MARKER_EXTRAS]),
                "--no-index", "--find-links", str(wheels),
            ],
        ):  # fmt: skip
            done = run_captured(argv)
            if done.returncode != 0:
                tail = " ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
                raise ExternalCommandError(f"{argv[0]} {argv[1]} {argv[2]}: {tail}")
        atomic_write(marker, requirement(LITELLM_VERSION) + "\n")
    return venv / "bin" / "litellm"
