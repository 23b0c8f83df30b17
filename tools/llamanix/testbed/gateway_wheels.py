"""LiteLLM for a test host's gateway: its wheels, downloaded once and cached, and a host whose
own pip configuration finds them, which `llamanix switch` then installs from (a user behind a
mirror has the same: an /etc/pip.conf)."""

from __future__ import annotations

import shutil
from pathlib import Path

from llamanix.core.schema import LITELLM_VERSION
from llamanix.deploy.gateway_venv import requirement
from llamanix.testbed import hosts
from llamanix.testbed.hosts import Host

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
