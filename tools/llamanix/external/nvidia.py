"""NVIDIA's tools: nvidia-smi (the local GPUs) and cuobjdump (the cubins a library carries).

Only the runs live here; what their output means is ``llamanix.diagnose.doctor`` (nvidia-smi's
CSV) and ``llamanix.diagnose.cuda_check`` (cuobjdump's listing).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from llamanix.core.errors import ExternalCommandError

NVIDIA_SMI_ARGV = (
    "nvidia-smi",
    "--query-gpu=name,compute_cap,memory.total",
    "--format=csv,noheader",
)
CUOBJDUMP = "cuobjdump"
CUOBJDUMP_TIMEOUT_S = 300.0
# A cuobjdump of a file without device code prints this (and exits non-zero on some releases).
NO_DEVICE_CODE = "does not contain device code"


def nvidia_smi_gpus() -> str | None:
    """nvidia-smi's CSV of the local GPUs (name, compute capability, memory); None where there
    is no nvidia-smi or it fails (no driver loaded): then there is nothing to ask."""
    if shutil.which(NVIDIA_SMI_ARGV[0]) is None:
        return None
    try:
        proc = subprocess.run(
            list(NVIDIA_SMI_ARGV),
            capture_output=True,
            text=True,
            errors="replace",
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    return proc.stdout


def list_elf_argv(path: Path) -> list[str]:
    return [CUOBJDUMP, "--list-elf", str(path)]


def cuobjdump_list_elf(path: Path) -> str | None:
    """``cuobjdump --list-elf PATH``'s output; None where cuobjdump is not on PATH."""
    if shutil.which(CUOBJDUMP) is None:
        return None
    argv = list_elf_argv(path)
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=CUOBJDUMP_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ExternalCommandError(f"{' '.join(argv)}: {err}") from None
    output = proc.stdout + proc.stderr
    if proc.returncode != 0 and NO_DEVICE_CODE not in output:
        raise ExternalCommandError(
            f"{' '.join(argv)} failed with exit code {proc.returncode}: {output.strip()[-300:]}"
        )
    return output
