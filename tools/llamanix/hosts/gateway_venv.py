"""The gateway's LiteLLM on a Debian host: one venv per release, made before its unit starts.

``/var/lib/llamanix/litellm/VERSION`` holds ``litellm[proxy]==VERSION``, installed by pip as the
host configures it (/etc/pip.conf), so a host behind a mirror installs from the mirror. A venv
cannot move (its scripts name their python by absolute path), so it is made in place and
counts as made only once a marker file, written last, is there: an install that broke off is
made again from scratch.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from llamanix.core.errors import ExternalCommandError
from llamanix.core.schema import LITELLM_REFUSED
from llamanix.external import pip
from llamanix.external.files import atomic_write
from llamanix.external.process import Runner
from llamanix.render.gateway import VENV_ROOT
from llamanix.render.manifest import Render

MARKER = ".llamanix-complete"


def requirement(version: str) -> str:
    return f"litellm[proxy]=={version}"


def venv_path(root: Path, version: str) -> Path:
    """``root/version``, refused unless it is a directory right inside ``root``: the venv is
    deleted before it is made again, and no version may point that delete anywhere else (the
    config's validate checks the version's form; this holds whatever reaches here)."""
    venv = root / version
    inside = (
        version not in ("", ".", "..")
        and "/" not in version
        and "\0" not in version
        and not venv.is_symlink()
        and venv.resolve().parent == root.resolve()
    )
    if not inside:
        raise ExternalCommandError(
            f"LiteLLM version {version!r} does not name a directory inside {root}: nothing "
            "deleted, nothing installed"
        )
    return venv


def ensure(
    runner: Runner, version: str, root: Path = Path(VENV_ROOT), python: str = "python3"
) -> bool:
    """Make LiteLLM ``version``'s venv unless it is there; whether it had to be made."""
    if version in LITELLM_REFUSED:  # the config refuses it too; never install it by any path
        raise ExternalCommandError(f"LiteLLM {version} {LITELLM_REFUSED[version]}: not installed")
    venv = venv_path(root, version)
    if (venv / MARKER).is_file() and (venv / "bin" / "litellm").is_file():
        return False
    if runner.dry_run:
        runner.note(f"make the venv {venv}")
    else:
        venv.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(venv_path(root, version), ignore_errors=True)
    runner.run(pip.venv_argv(python, venv))
    runner.run(pip.venv_install_argv(venv, [requirement(version)]))
    if runner.dry_run:
        runner.note(f"write {venv / MARKER}")
    else:
        atomic_write(venv / MARKER, requirement(version) + "\n")
    return True


def ensure_for(runner: Runner, manager: str, render: Render) -> None:
    """Before a systemd manager activates a render: the venv its gateway unit runs, if any
    (a NixOS host's LiteLLM comes from nixpkgs, and no other manager runs the gateway)."""
    gateway = render.gateway
    if manager != "systemd" or gateway is None:
        return
    if not gateway.version:
        raise ExternalCommandError(f"the gateway of {render.host} names no LiteLLM release")
    ensure(runner, gateway.version)
