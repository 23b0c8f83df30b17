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
