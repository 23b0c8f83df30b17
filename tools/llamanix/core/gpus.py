"""The GPU table (data/gpus.toml): bandwidth, memory and compute capability per card."""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources


@dataclass(frozen=True)
class Gpu:
    name: str
    label: str
    bandwidth_gb_s: float
    memory_gib: float
    compute_capability: str


@cache
def load_gpus() -> dict[str, Gpu]:
    text = resources.files("llamanix").joinpath("data/gpus.toml").read_text()
    return {
        name: Gpu(
            name=name,
            label=str(row["label"]),
            bandwidth_gb_s=float(row["bandwidth_gb_s"]),
            memory_gib=float(row["memory_gib"]),
            compute_capability=str(row["compute_capability"]),
        )
        for name, row in tomllib.loads(text).items()
    }


@dataclass(frozen=True)
class ArchMismatch:
    """A card whose compute capability a host's CUDA architectures leave out."""

    message: str
    fix: str


def arch_mismatch(
    card: str, compute_capability: str, host: str, cuda_archs: Sequence[str]
) -> ArchMismatch | None:
    """The build has no kernels of the card's own compute capability (``12.0a`` and ``12.0f``
    count as ``12.0``): the card JIT-compiles PTX at first use, or finds no kernel image at
    all. None when the archs carry it, or name none (the build's own default then applies).
    ``plan`` and ``doctor`` say it in these words."""
    if not cuda_archs or compute_capability in {a.rstrip("af") for a in cuda_archs}:
        return None
    return ArchMismatch(
        f"{card} has compute capability {compute_capability} but host {host} builds for "
        f"{', '.join(cuda_archs)}: kernels are JIT-compiled from PTX on first use (a first "
        "prefill of 33 s in one report) or fail outright",
        f'add "{compute_capability}" to hosts.{host}.cuda_archs and rebuild',
    )


# Every CUDA compute capability a build may name in cuda_archs: the keys of nixpkgs' CUDA
# database (cudaCapabilityToInfo), which nix/lib.nix copies as cudaCapabilities;
# tests/test_config_checks.py keeps this list equal to the recorded nixpkgs file.
CUDA_CAPABILITIES: tuple[str, ...] = (
    "3.5", "3.7", "5.0", "5.2", "6.0", "6.1", "7.0", "7.2", "7.5", "8.0", "8.6", "8.7", "8.9",
    "9.0", "9.0a", "10.0", "10.0a", "10.0f", "10.1", "10.1a", "10.1f", "10.3", "10.3a", "10.3f",
    "11.0", "11.0a", "11.0f", "12.0", "12.0a", "12.0f", "12.1", "12.1a", "12.1f",
)  # fmt: skip
