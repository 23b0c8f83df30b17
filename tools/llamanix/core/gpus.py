"""The GPU table (data/gpus.toml): bandwidth, memory and compute capability per card."""

from __future__ import annotations

import tomllib
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


# Every CUDA compute capability a build may name in cuda_archs: the keys of nixpkgs' CUDA
# database (cudaCapabilityToInfo), which nix/lib.nix copies as cudaCapabilities;
# tests/test_config_checks.py keeps this list equal to the recorded nixpkgs file.
CUDA_CAPABILITIES: tuple[str, ...] = (
    "3.5", "3.7", "5.0", "5.2", "6.0", "6.1", "7.0", "7.2", "7.5", "8.0", "8.6", "8.7", "8.9",
    "9.0", "9.0a", "10.0", "10.0a", "10.0f", "10.1", "10.1a", "10.1f", "10.3", "10.3a", "10.3f",
    "11.0", "11.0a", "11.0f", "12.0", "12.0a", "12.0f", "12.1", "12.1a", "12.1f",
)  # fmt: skip
